#!/usr/bin/env bash
# prefixgate beside the peer routers, measured in one run on the same replicas: wrk sends the
# same 20 KB-prompt chat completion (chat20k.lua, plain; chat20k_sse.lua, streamed) straight
# to a replica (direct), through the bare forwarder (gateway/examples/plain_forwarder.rs, the
# cost of one more hop and nothing else), through prefixgate (`prefix-cache`), and through
# SGLang's router and the vLLM router (both `cache_aware`, from pip). The contestants take
# turns within each round so that machine noise hits them alike. Per run it reads each
# proxy's CPU time from /proc (user + system, all threads) and divides by the requests
# served: CPU per request.
#
# The replicas: one mock-engine process serving two replicas (A and B), profile
# $MOCK_PROFILE (default `fast`: engine time ~0, so what is measured is the HTTP path and
# the engine's own parsing). Direct and the forwarder go to replica A; the routers may use
# both, as they choose.
#
# Needs wrk (apt-get install -y wrk; a measurement tool only), the peers' pip environment
# (made on first use by loadgen/peers/peers.sh, shared with loadgen/peers/run.sh), and
# release builds:
#
#   cargo build --release -p gateway --bin prefixgate --example plain_forwarder -p mock-engine
#   gateway/benches/overhead/side_by_side.sh [SECONDS_PER_RUN] [ROUNDS] [CONCURRENCIES]
#
# Defaults: 4 s per run, 2 rounds, concurrencies "1 32". BASELINE_BIN adds a second prefixgate
# (target `baseline`, e.g. the build before a change); ROUTERS (default "sglang vllm") picks
# the peers, and `ROUTERS=` (empty) none: direct, the forwarder and prefixgate only;
# PORT_BASE (default 18400) the first of the fixed ports the peers need; PIN and the *_CPUS
# variables as in run.sh. Raw rows go to stdout as they finish, then the summary.
set -euo pipefail

SECONDS_PER_RUN=${1:-4}
ROUNDS=${2:-2}
CONCURRENCIES=${3:-"1 32"}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
GATEWAY_BIN=${GATEWAY_BIN:-$BIN/prefixgate}
ROUTERS=${ROUTERS-"sglang vllm"}
PORT_BASE=${PORT_BASE:-18400}
WORK=$(mktemp -d)
PIDS=()

trap cleanup EXIT  # measure.sh's

for needed in wrk curl "$GATEWAY_BIN" "$BIN/examples/plain_forwarder" "$BIN/mock-engine"; do
    command -v "$needed" >/dev/null || { echo "missing: $needed (see the header of $0)" >&2; exit 1; }
done

PROXY_CPUS=${PROXY_CPUS:-1}
UPSTREAM_CPUS=${UPSTREAM_CPUS:-0}
LOAD_CPUS=${LOAD_CPUS:-0}
WRK_THREADS=${WRK_THREADS:-1}

# shellcheck source=gateway/benches/overhead/measure.sh
source "$HERE/measure.sh"
# shellcheck source=loadgen/peers/peers.sh
source "$ROOT/loadgen/peers/peers.sh"
if [[ -n $ROUTERS ]]; then peers_venv; fi

wait_http() { # URL: until it answers 2xx (bounded: 60 s)
    for _ in $(seq 1 600); do
        curl -fs -o /dev/null --max-time 2 "$1" && return 0
        sleep 0.1
    done
    echo "$1 did not answer; logs in $WORK" >&2; exit 1
}

A=http://127.0.0.1:$PORT_BASE
B=http://127.0.0.1:$((PORT_BASE + 1))
pin "$UPSTREAM_CPUS" "$BIN/mock-engine" --replicas 2 --port-base "$PORT_BASE" --name A,B \
    --profile "${MOCK_PROFILE:-fast}" --model mock-model >"$WORK/replicas.log" 2>&1 &
UPSTREAM_PID=$!; PIDS+=("$UPSTREAM_PID")
wait_http "$A/health"; wait_http "$B/health"

declare -A URL PID
URL[direct]=$A; PID[direct]=""
start forwarder forwarder pin "$PROXY_CPUS" "$BIN/examples/plain_forwarder" 127.0.0.1:0 "${A#http://}"
URL[forwarder]=$STARTED_URL; PID[forwarder]=$STARTED_PID
TARGETS="direct forwarder"
gateway() { # NAME BINARY
    start "$1" "listening on" pin "$PROXY_CPUS" "$2" --backend "A=$A" --backend "B=$B" \
        --default-strategy prefix-cache --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
        --set engine_scrape.enabled=false
    URL[$1]=$STARTED_URL; PID[$1]=$STARTED_PID
    TARGETS="$TARGETS $1"
    wait_http "${URL[$1]}/ready"
}
gateway prefixgate "$GATEWAY_BIN"
[[ -n ${BASELINE_BIN:-} ]] && gateway baseline "$BASELINE_BIN"
port=$((PORT_BASE + 10))
for router in $ROUTERS; do
    # peer_router is a function (it execs the router), so the subshell pins itself first.
    (if [[ "${PIN:-0}" == 1 ]]; then taskset -p -c "$PROXY_CPUS" "$BASHPID" >/dev/null; fi
     peer_router "$router" 127.0.0.1 "$port" $((port + 1)) "$A" "$B") >"$WORK/$router.log" 2>&1 &
    PID[$router]=$!; PIDS+=("$!")
    URL[$router]=http://127.0.0.1:$port
    wait_http "${URL[$router]}/health"
    TARGETS="$TARGETS $router"
    port=$((port + 10))
done
# Each contestant answers once before measuring (the routers learn the model, the pools fill).
for target in $TARGETS; do
    curl -fs -o /dev/null --max-time 10 -H 'content-type: application/json' \
        -d '{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"max_tokens":1}' \
        "${URL[$target]}/v1/chat/completions" || { echo "$target does not answer" >&2; exit 1; }
done

describe_machine
echo "# replicas $A $B (profile ${MOCK_PROFILE:-fast}); targets: $TARGETS; ${SECONDS_PER_RUN}s per run, $ROUNDS rounds"
result_header
RESULTS=$WORK/results.tsv

for round in $(seq 1 "$ROUNDS"); do
    for case in chat20k chat20k_sse; do
        for c in $CONCURRENCIES; do
            for target in $TARGETS; do
                measure "$case" "$c" "$target" "${URL[$target]}" "${PID[$target]}" "$UPSTREAM_PID" \
                    "$HERE/$case.lua"
            done
        done
    done
done

summarize "$ROUNDS"
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
