#!/usr/bin/env bash
# The peer routers side by side, live: SGLang's router and the vLLM router (both `cache_aware`,
# their defaults otherwise) and prefixgate, each in front of the same fresh mock replicas,
# running the same workload: the matrix (`loadgen matrix --gateway`, the default) or a slice
# of a Mooncake-format trace (`--trace`, `loadgen replay --gateway`). Writes one result file
# per router and a merged one, and prints the table (`loadgen report`). docs/LOADGEN.md,
# "The peer routers side by side", has measured tables and what they mean.
#
# The peers set no `target-pod` header: loadgen then learns priming owners and the replica
# split from the engines' `vllm:request_success_total` counters.
#
# Usage: loadgen/peers/run.sh [options]
#   --out-dir DIR        results (default /tmp/prefixgate-peers)
#   --venv DIR           throwaway virtual environment for the peers (default /tmp/prefixgate-peers-venv)
#   --routers LIST       comma-separated subset of prefixgate,sglang,vllm (default all three)
#   --routes LIST        prefixgate's routes (default least-request,prefix-cache,prefix-load)
#   --matrix FILE        the workload (default: loadgen's built-in config/matrix-24.toml)
#   --count N            requests per phase (default: the matrix's)
#   --trace FILE         replay this Mooncake-format trace instead of the matrix; every router,
#                        and every prefixgate route, gets the same slice on fresh replicas
#   --start S            trace mode: skip S seconds of trace time (default 0)
#   --duration S         trace mode: replay S seconds of trace time (default: to the end)
#   --limit N            trace mode: at most N requests
#   --speedup X          trace mode: divide the trace's inter-arrival times by X (default 1)
#   --replicas N         mock replicas (default 2)
#   --profile NAME|PATH  engine profile (default l20-qwen27b-fp8; with --trace h200-qwen27b-fp8,
#                        whose 262k context holds the trace's long prompts)
#   --time-scale S       engine time runs S times faster than wall time (default 1: real
#                        time). The routers' own latency is multiplied by S too (a 40 ms
#                        proxy delay reads as 0.4 s at S = 10), so keep S small. With --trace
#                        the replay is sped up S times and its SLO and times are rescaled to
#                        engine seconds in the merged file
#   --port-base P        first of the loopback ports used (default 18100)
#   --sglang-version V   pip version of sglang-router (default 0.3.2)
#   --vllm-version V     pip version of vllm-router (default 0.1.17)
#   --no-build           use the binaries already in the target directory
#   --debug              build loadgen, prefixgate and mock-engine in debug (default release:
#                        the peers are release builds, and a debug gateway adds tens of ms
#                        per request, which the time scale multiplies)
set -euo pipefail

OUT_DIR=/tmp/prefixgate-peers
VENV=""
ROUTERS=prefixgate,sglang,vllm
ROUTES=least-request,prefix-cache,prefix-load
MATRIX=""
COUNT=""
TRACE=""
SLICE_ARGS=()
SPEEDUP=1
REPLICAS=2
PROFILE=""
TIME_SCALE=1
PORT_BASE=18100
PROFILE_FLAG=release
BUILD=1
MODEL=mock-model

while [[ $# -gt 0 ]]; do
    case "$1" in
        --out-dir) OUT_DIR=$2; shift 2 ;;
        --venv) VENV=$2; shift 2 ;;
        --routers) ROUTERS=$2; shift 2 ;;
        --routes) ROUTES=$2; shift 2 ;;
        --matrix) MATRIX=$2; shift 2 ;;
        --count) COUNT=$2; shift 2 ;;
        --trace) TRACE=$2; shift 2 ;;
        --start|--duration|--limit) SLICE_ARGS+=("$1" "$2"); shift 2 ;;
        --speedup) SPEEDUP=$2; shift 2 ;;
        --replicas) REPLICAS=$2; shift 2 ;;
        --profile) PROFILE=$2; shift 2 ;;
        --time-scale) TIME_SCALE=$2; shift 2 ;;
        --port-base) PORT_BASE=$2; shift 2 ;;
        --sglang-version) SGLANG_VERSION_FLAG=$2; shift 2 ;;
        --vllm-version) VLLM_VERSION_FLAG=$2; shift 2 ;;
        --debug) PROFILE_FLAG=dev; shift ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [[ -n $TRACE ]]; then
    if [[ -n $MATRIX || -n $COUNT ]]; then
        echo "run.sh: --trace replaces the matrix; drop --matrix and --count" >&2; exit 2
    fi
    [[ -r $TRACE ]] || { echo "run.sh: cannot read the trace $TRACE" >&2; exit 2; }
    TRACE=$(cd "$(dirname "$TRACE")" && pwd)/$(basename "$TRACE")
    PROFILE=${PROFILE:-h200-qwen27b-fp8}
elif (( ${#SLICE_ARGS[@]} )) || [[ $SPEEDUP != 1 ]]; then
    echo "run.sh: --start, --duration, --limit and --speedup slice a --trace" >&2; exit 2
fi
PROFILE=${PROFILE:-l20-qwen27b-fp8}

REPO=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
BIN=$TARGET/$([[ $PROFILE_FLAG == release ]] && echo release || echo debug)
mkdir -p "$OUT_DIR"
LOGS=$OUT_DIR/logs
mkdir -p "$LOGS"

# Processes this script started, stopped on exit whatever happens (by PID, never by name).
PIDS=()
stop_all() {
    for pid in "${PIDS[@]:-}"; do
        [[ -n $pid ]] && kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]:-}"; do
        [[ -n $pid ]] && wait "$pid" 2>/dev/null || true
    done
    PIDS=()
}
trap stop_all EXIT INT TERM

wait_http() { # URL SECONDS: until URL answers 2xx, or fail naming it
    local url=$1 deadline=$((SECONDS + $2))
    until curl -fs -o /dev/null --max-time 2 "$url"; do
        if (( SECONDS >= deadline )); then
            echo "run.sh: $url did not answer within $2 s (logs in $LOGS)" >&2
            return 1
        fi
        sleep 0.5
    done
}

if (( BUILD )); then
    echo "== building loadgen, prefixgate and mock-engine ($PROFILE_FLAG)" >&2
    cargo build --manifest-path "$REPO/Cargo.toml" --profile "$PROFILE_FLAG" \
        -p loadgen -p gateway -p mock-engine >&2
fi

# The peers' venv and command lines, shared with gateway/benches/overhead/side_by_side.sh.
PEERS_VENV=${VENV:-${PEERS_VENV:-}}
SGLANG_VERSION=${SGLANG_VERSION_FLAG:-${SGLANG_VERSION:-}}
VLLM_VERSION=${VLLM_VERSION_FLAG:-${VLLM_VERSION:-}}
# shellcheck source=loadgen/peers/peers.sh
source "$REPO/loadgen/peers/peers.sh"
if [[ ,$ROUTERS, == *,sglang,* || ,$ROUTERS, == *,vllm,* ]]; then
    peers_venv
fi

# Replica names and ports, the same for every router; the names say the profile's GPU.
case $(basename "$PROFILE" .toml) in
    l20-*) REPLICA_PREFIX=L20- ;;
    h200-*) REPLICA_PREFIX=H200- ;;
    *) REPLICA_PREFIX=replica- ;;
esac
NAMES=()
WORKERS=()
REPLICA_ARGS=()
for ((i = 0; i < REPLICAS; i++)); do
    name="$REPLICA_PREFIX$(printf "\\x$(printf %x $((65 + i)))")"
    port=$((PORT_BASE + i))
    NAMES+=("$name")
    WORKERS+=("http://127.0.0.1:$port")
    REPLICA_ARGS+=(--replica "$name=http://127.0.0.1:$port")
done
ROUTER_PORT=$((PORT_BASE + 50))
METRICS_PORT=$((PORT_BASE + 51))
NAMES_CSV=$(IFS=,; echo "${NAMES[*]}")

start_replicas() { # fresh engines (empty caches) for each router
    "$BIN/mock-engine" --replicas "$REPLICAS" --port-base "$PORT_BASE" --name "$NAMES_CSV" \
        --profile "$PROFILE" --time-scale "$TIME_SCALE" --model "$MODEL" \
        >"$LOGS/replicas-$1.log" 2>&1 &
    PIDS+=($!)
    for url in "${WORKERS[@]}"; do wait_http "$url/health" 60; done
}

start_router() { # NAME
    case "$1" in
        prefixgate)
            local backends=()
            for ((i = 0; i < REPLICAS; i++)); do backends+=(--backend "${NAMES[i]}=${WORKERS[i]}"); done
            "$BIN/prefixgate" --listen "127.0.0.1:$ROUTER_PORT" \
                --metrics-listen "127.0.0.1:$METRICS_PORT" "${backends[@]}" \
                --set "replica_time_scale=$TIME_SCALE" \
                >"$LOGS/router-$1.log" 2>&1 &
            ;;
        sglang|vllm)
            (peer_router "$1" 127.0.0.1 "$ROUTER_PORT" "$METRICS_PORT" "${WORKERS[@]}") \
                >"$LOGS/router-$1.log" 2>&1 &
            ;;
        *) echo "run.sh: unknown router $1 (prefixgate, sglang, vllm)" >&2; exit 2 ;;
    esac
    PIDS+=($!)
    wait_http "http://127.0.0.1:$ROUTER_PORT/health" 120
}

MATRIX_ARGS=()
[[ -n $MATRIX ]] && MATRIX_ARGS+=(--matrix "$MATRIX")
[[ -n $COUNT ]] && MATRIX_ARGS+=(--count "$COUNT")

run_matrix() { # ROUTER: the matrix through the router, every prefixgate route in one run
    local router=$1 routes result
    start_replicas "$router"
    start_router "$router"
    if [[ $router == prefixgate ]]; then
        routes=$ROUTES
        result=$OUT_DIR/$router.json
    else
        # The peers ignore the routing-strategy header: one pass with a placeholder route,
        # renamed after the router when the results are merged.
        routes=random
        result=$OUT_DIR/$router.json:$router-cache_aware
    fi
    # A run that stops early (e.g. hot priming finds no balanced owners behind a router that
    # keeps new prefixes together) still writes the phases done, marked incomplete.
    if ! "$BIN/loadgen" matrix --gateway "http://127.0.0.1:$ROUTER_PORT" "${REPLICA_ARGS[@]}" \
        --model "$MODEL" --time-scale "$TIME_SCALE" --routes "$routes" \
        "${MATRIX_ARGS[@]}" --out "$OUT_DIR/$router.json" 2>"$LOGS/loadgen-$router.log"; then
        echo "run.sh: $router stopped early: $(grep -m1 '^Error' "$LOGS/loadgen-$router.log")" >&2
    fi
    [[ -s $OUT_DIR/$router.json ]] && RESULTS+=("$result")
    stop_all
}

# `loadgen replay --gateway` measures wall seconds: at time scale S it replays S times faster
# with the SLO divided by S, and merge.py turns the times back into engine seconds.
REPLAY_SCALED=(--speedup "$(python3 -c "print($SPEEDUP * $TIME_SCALE)")"
    --slo-ttft "$(python3 -c "print(2 / $TIME_SCALE)")"
    --slo-tpot "$(python3 -c "print(0.15 / $TIME_SCALE)")"
    --slo-e2e "$(python3 -c "print(30 / $TIME_SCALE)")")

run_trace() { # ROUTER: the trace slice through the router, each prefixgate route on fresh
    # replicas and a fresh gateway, as every peer gets them (a running stack's engines would
    # keep their caches from one route to the next)
    local router=$1 route name routes
    if [[ $router == prefixgate ]]; then routes=$ROUTES; else routes=random; fi
    for route in ${routes//,/ }; do
        if [[ $router == prefixgate ]]; then name=$router-$route; else name=$router; fi
        start_replicas "$name"
        start_router "$router"
        if ! "$BIN/loadgen" replay --trace "$TRACE" --gateway "http://127.0.0.1:$ROUTER_PORT" \
            "${REPLICA_ARGS[@]}" --replicas "$REPLICAS" --engine-profile "$PROFILE" \
            --model "$MODEL" --routes "$route" "${SLICE_ARGS[@]}" "${REPLAY_SCALED[@]}" \
            --records --out "$OUT_DIR/$name.json" >"$LOGS/loadgen-$name.log" 2>&1; then
            echo "run.sh: $name stopped early: $(grep -m1 '^Error' "$LOGS/loadgen-$name.log")" >&2
        fi
        if [[ -s $OUT_DIR/$name.json ]]; then
            if [[ $router == prefixgate ]]; then RESULTS+=("$OUT_DIR/$name.json")
            else RESULTS+=("$OUT_DIR/$name.json:$router-cache_aware"); fi
        fi
        stop_all
    done
}

RESULTS=()
for router in ${ROUTERS//,/ }; do
    echo "== $router" >&2
    if [[ -n $TRACE ]]; then run_trace "$router"; else run_matrix "$router"; fi
done

python3 "$REPO/loadgen/peers/merge.py" --time-scale "$TIME_SCALE" "$OUT_DIR/all.json" "${RESULTS[@]}"
"$BIN/loadgen" report "$OUT_DIR/all.json"
