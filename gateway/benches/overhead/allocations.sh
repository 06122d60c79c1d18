#!/usr/bin/env bash
# Heap allocations per request of one or more prefixgate builds, one after another on the
# same upstream: glibc `malloc` calls counted by a perf uprobe on the gateway process while
# wrk sends chat completions, divided by the requests the gateway answered in that window
# (its own prefixgate_requests_total, read just before and after), less what it allocates
# idle over as long. A count, not a timing, though not exact: allocations that serve several
# requests at once (connection buffers, wake-ups) make it vary by a few per request between
# runs, so compare builds in alternation.
#
# The gateway routes over two replicas (both the fixed upstream), so every request takes a
# full routing decision rather than the single-replica short-circuit.
#
#   cargo build --release -p gateway --bin prefixgate --example fixed_upstream
#   gateway/benches/overhead/allocations.sh SECONDS STRATEGY BIN [BIN...]
#
# Needs root (perf probe), perf and wrk. UPSTREAM_BIN overrides the fixed upstream
# ($CARGO_TARGET_DIR/release/examples/fixed_upstream), LUA the wrk script (chat.lua;
# chat20k.lua for a 20 KB prompt), CONNECTIONS wrk's connections (8).
set -euo pipefail

if [[ $# -lt 3 ]]; then
    echo "usage: $0 SECONDS STRATEGY BIN [BIN...]" >&2
    exit 2
fi
SECONDS_PER_RUN=$1
STRATEGY=$2
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
UPSTREAM_BIN=${UPSTREAM_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/fixed_upstream}
LUA=${LUA:-$HERE/chat.lua}
CONNECTIONS=${CONNECTIONS:-8}
WORK=$(mktemp -d)
PIDS=()

cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

# shellcheck source=gateway/benches/overhead/measure.sh
source "$HERE/measure.sh"

LIBC=$(ldd "$UPSTREAM_BIN" | awk '/libc.so.6/ {print $3}')
perf probe -l 'probe_libc:malloc' 2>/dev/null | grep -q malloc || perf probe -q -x "$LIBC" malloc

answered() { # requests the gateway at $1 (its metrics listener) has answered so far
    curl -sf "$1/metrics" | awk '/^prefixgate_requests_total/ {n += $NF} END {print n + 0}'
}

start upstream upstream "$UPSTREAM_BIN" 127.0.0.1:0
UPSTREAM=$STARTED_URL
printf 'binary\tstrategy\trequests\tmallocs_less_idle\tidle\tmallocs_per_request\n'
for bin in "$@"; do
    start gateway "listening on" "$bin" --backend "a=$UPSTREAM" --backend "b=$UPSTREAM" \
        --default-strategy "$STRATEGY" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
        --set engine_scrape.enabled=false
    GATEWAY=$STARTED_URL; GATEWAY_PID=$STARTED_PID
    METRICS=$(grep -o "metrics on http://[0-9.:]*" "$WORK/gateway.log" | head -1 | awk '{print $NF}')
    for _ in $(seq 1 50); do curl -sf "$GATEWAY/ready" >/dev/null && break; sleep 0.1; done
    # What the gateway allocates with no request (health probes, timers), over the same time,
    # is taken off.
    perf stat -x, -e probe_libc:malloc -p "$GATEWAY_PID" -o "$WORK/idle.txt" -- sleep "$SECONDS_PER_RUN"
    idle=$(awk -F, '/probe_libc:malloc/ {print $1}' "$WORK/idle.txt")
    # wrk runs one second longer than the count, which starts after half a second of warm-up.
    wrk -t1 -c"$CONNECTIONS" -d"$((SECONDS_PER_RUN + 1))s" -s "$LUA" "$GATEWAY" >"$WORK/wrk.txt" &
    WRK_PID=$!
    sleep 0.5
    before=$(answered "$METRICS")
    perf stat -x, -e probe_libc:malloc -p "$GATEWAY_PID" -o "$WORK/perf.txt" -- sleep "$SECONDS_PER_RUN"
    after=$(answered "$METRICS")
    wait "$WRK_PID"
    mallocs=$(awk -F, -v idle="$idle" '/probe_libc:malloc/ {print $1 - idle}' "$WORK/perf.txt")
    requests=$((after - before))
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$bin" "$STRATEGY" "$requests" "$mallocs" "$idle" \
        "$(awk -v m="$mallocs" -v r="$requests" 'BEGIN {printf "%.1f", m / r}')"
    kill "$GATEWAY_PID"
    wait "$GATEWAY_PID" 2>/dev/null || true
done
