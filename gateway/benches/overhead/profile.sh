#!/usr/bin/env bash
# Where prefixgate's instructions per request go, against the bare forwarder's: each proxy
# runs under valgrind's callgrind in front of the mock engine while wrk sends REQUESTS
# chat completions with a 20 KB prompt (chat20k.lua, plain; chat20k_sse.lua, streamed) over
# one connection. Instrumentation is off at start-up and through a warm-up of 20 requests
# (pools, first-use allocations), on for the counted requests only, so the totals divided
# by the requests are the steady cost of one request. The gateway's health probes and index
# sweep are put an hour apart: they run on wall-clock periods, and under valgrind's slowdown
# they would otherwise be charged to the requests many times over. Instruction counts do not
# depend on the machine's load, so two builds compare in any order (BASELINE_BIN, as
# side_by_side.sh).
#
#   cargo build --release -p gateway --bin prefixgate --example plain_forwarder -p mock-engine
#   gateway/benches/overhead/profile.sh [REQUESTS] [OUT_DIR]
#
# Defaults: 200 requests, the callgrind files kept in OUT_DIR (default a temporary folder,
# printed). Per proxy and case it prints instructions per request, then the top costs
# (callgrind_top.py: inclusive and exclusive, and per crate). TARGETS picks the proxies
# (default "forwarder prefixgate", plus "baseline" with BASELINE_BIN); CASES the cases.
# Needs valgrind and wrk (apt-get install -y valgrind wrk; measurement tools only).
set -euo pipefail

REQUESTS=${1:-200}
WARM_UP=20
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
GATEWAY_BIN=${GATEWAY_BIN:-$BIN/prefixgate}
TARGETS=${TARGETS:-"forwarder prefixgate${BASELINE_BIN:+ baseline}"}
CASES=${CASES:-"chat20k chat20k_sse"}
PORT_BASE=${PORT_BASE:-18500}
OUT=${2:-$(mktemp -d)}
WORK=$(mktemp -d)
PIDS=()
trap cleanup EXIT  # measure.sh's

for needed in valgrind callgrind_control wrk curl python3 "$GATEWAY_BIN" \
    "$BIN/examples/plain_forwarder" "$BIN/mock-engine"; do
    command -v "$needed" >/dev/null || { echo "missing: $needed (see the header of $0)" >&2; exit 1; }
done
# shellcheck source=gateway/benches/overhead/measure.sh
source "$HERE/measure.sh"

A=127.0.0.1:$PORT_BASE
B=127.0.0.1:$((PORT_BASE + 1))
"$BIN/mock-engine" --replicas 2 --port-base "$PORT_BASE" --name A,B --profile fast \
    --model mock-model >"$WORK/replicas.log" 2>&1 &
PIDS+=("$!")
for replica in "$A" "$B"; do
    for _ in $(seq 1 600); do curl -fs -o /dev/null "http://$replica/health" && break; sleep 0.1; done
done

# proxy TARGET: starts it under callgrind (instrumentation off) and sets STARTED_URL/PID.
proxy() {
    local callgrind=(valgrind --tool=callgrind --instr-atstart=no
        "--callgrind-out-file=$OUT/$1.$2.callgrind")
    case $1 in
        forwarder) start "$1" forwarder "${callgrind[@]}" "$BIN/examples/plain_forwarder" \
            127.0.0.1:0 "$A" ;;
        prefixgate | baseline)
            local bin=$GATEWAY_BIN
            [[ $1 == baseline ]] && bin=$BASELINE_BIN
            start "$1" "listening on" "${callgrind[@]}" "$bin" --backend "A=http://$A" \
                --backend "B=http://$B" --default-strategy prefix-cache \
                --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
                --set engine_scrape.enabled=false --set health.interval_ms=3600000 \
                --set health.timeout_ms=60000 --set routing.eviction_interval_secs=3600
            both_ready "$1" ;;
    esac
}

# both_ready NAME: until the gateway just started holds both replicas ready (bounded: 120 s).
# With the probes an hour apart, a replica its first probe missed would stay out and every request
# would take the single-replica short cut, which hashes nothing.
both_ready() {
    local metrics
    for _ in $(seq 1 1200); do
        metrics=$(grep -o "metrics on http://[0-9.:]*" "$WORK/$1.log" | head -1 | awk '{print $NF}')
        [[ -n $metrics && $(curl -fs "$metrics/admin/replicas" | grep -o '"state":"ready"' |
            wc -l) == 2 ]] && return 0
        sleep 0.1
    done
    echo "the gateway does not hold both replicas ready; its log: $WORK/$1.log" >&2; exit 1
}

send() { # URL CASE COUNT: COUNT requests over one connection, answered one after another
    CASE_LUA="$HERE/$2.lua" REQUESTS=$3 wrk -t1 -c1 -d120s -s "$HERE/counted.lua" \
        "$1/v1/chat/completions" | awk '/requests in/ {print $1}'
}

echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) (instruction counts do not depend on it), $(valgrind --version)"
printf 'target\tcase\trequests\tinstructions_per_request\n'
for case in $CASES; do
    for target in $TARGETS; do
        proxy "$target" "$case"
        send "$STARTED_URL" "$case" "$WARM_UP" >/dev/null
        callgrind_control -i on "$STARTED_PID" >/dev/null 2>&1
        sent=$(send "$STARTED_URL" "$case" "$REQUESTS")
        callgrind_control -i off "$STARTED_PID" >/dev/null 2>&1
        # TERM, not INT: a background job of a script ignores SIGINT (the forwarder has no
        # handler of its own); callgrind writes its file as the process ends.
        kill -TERM "$STARTED_PID"; wait "$STARTED_PID" 2>/dev/null || true
        total=$(python3 "$HERE/callgrind_top.py" --total "$OUT/$target.$case.callgrind")
        printf '%s\t%s\t%s\t%s\n' "$target" "$case" "$sent" \
            "$(awk -v t="$total" -v n="$sent" 'BEGIN {printf "%.0f", t / n}')"
        python3 "$HERE/callgrind_top.py" --requests "$sent" "$OUT/$target.$case.callgrind" \
            >"$OUT/$target.$case.top.txt"
    done
done
echo "# callgrind files and top-cost tables (*.top.txt) in $OUT"
