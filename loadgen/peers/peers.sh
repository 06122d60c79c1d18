# The peer routers, for the scripts that run them (sourced, not run): the pip environment
# they come from and their command lines. loadgen/peers/run.sh runs them under a workload;
# gateway/benches/overhead/side_by_side.sh measures what each adds to a request. Both use
# `cache_aware` (each router's prefix-aware policy) and otherwise the routers' defaults.
#
# Defaults, overridable before sourcing: PEERS_VENV (/tmp/prefixgate-peers-venv),
# SGLANG_VERSION (0.3.2), VLLM_VERSION (0.1.17).

PEERS_VENV=${PEERS_VENV:-/tmp/prefixgate-peers-venv}
SGLANG_VERSION=${SGLANG_VERSION:-0.3.2}
VLLM_VERSION=${VLLM_VERSION:-0.1.17}

peers_venv() { # a throwaway virtual environment holding both routers (pip; kept between runs)
    if [[ ! -x $PEERS_VENV/bin/pip ]]; then
        echo "== creating $PEERS_VENV" >&2
        python3 -m venv "$PEERS_VENV"
    fi
    echo "== pip install sglang-router==$SGLANG_VERSION vllm-router==$VLLM_VERSION" >&2
    "$PEERS_VENV/bin/pip" install --quiet "sglang-router==$SGLANG_VERSION" "vllm-router==$VLLM_VERSION" >&2
}

peer_router() { # NAME HOST PORT METRICS_PORT WORKER_URL...: runs (exec) one peer router
    local name=$1 host=$2 port=$3 metrics_port=$4; shift 4
    case $name in
        sglang)
            exec "$PEERS_VENV/bin/python" -m sglang_router.launch_router --host "$host" --port "$port" \
                --worker-urls "$@" --policy cache_aware \
                --prometheus-host "$host" --prometheus-port "$metrics_port" ;;
        vllm)
            exec "$PEERS_VENV/bin/vllm-router" --host "$host" --port "$port" \
                --worker-urls "$@" --policy cache_aware \
                --prometheus-host "$host" --prometheus-port "$metrics_port" ;;
        *) echo "unknown peer router $name (sglang, vllm)" >&2; return 2 ;;
    esac
}
