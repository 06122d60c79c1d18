#!/usr/bin/env bash
# Gateway overhead, measured fairly: three separate processes (upstream, proxy, load tool),
# the same load sent in one run straight to the upstream, through a minimal hyper forwarder
# (the fair ceiling for any proxy here) and through prefixgate, taking turns so machine
# noise hits all three alike. Also reports each proxy's CPU time per request, read from
# /proc/PID/stat (user + system, all threads), which CPU sharing does not distort.
#
# Needs `wrk` (Debian: apt-get install -y wrk; a measurement tool, not a build dependency)
# and release builds of the gateway binary and the two helper examples:
#
#   cargo build --release -p gateway --bin prefixgate --example fixed_upstream --example plain_forwarder
#   gateway/benches/overhead/run.sh [SECONDS_PER_RUN] [ROUNDS] [CONCURRENCIES]
#
# Defaults: 5 s per run, 2 rounds, concurrencies "1 8 64". Release binaries are looked up in
# $CARGO_TARGET_DIR/release (default target/release). PIN=1 pins with taskset: the proxies to
# PROXY_CPUS (default 1), the upstream to UPSTREAM_CPUS (default 0) and wrk to LOAD_CPUS
# (default 0); on a machine with cores to spare give each its own, so that the proxy is not
# measured against its own load tool. WRK_THREADS (default 1) sets wrk's threads, which
# should be raised with LOAD_CPUS so that wrk is not what caps the direct connection. GATEWAY_BIN picks another prefixgate binary (to
# compare builds); BASELINE_BIN adds a second prefixgate, measured as target `baseline` in
# the same run (e.g. the build before a change). UPSTREAM_KIND=mock puts mock-engine (profile
# $MOCK_PROFILE, default fast; build it with `cargo build --release -p mock-engine`) behind
# all three instead of the fixed-answer upstream. GATEWAY_ARGS adds flags to prefixgate, GATEWAY_ENV environment
# settings (e.g. TOKIO_WORKER_THREADS=1). Raw rows go to
# stdout as they finish, then one summary row per (case, concurrency, target).
set -euo pipefail

SECONDS_PER_RUN=${1:-5}
ROUNDS=${2:-2}
CONCURRENCIES=${3:-"1 8 64"}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
GATEWAY_BIN=${GATEWAY_BIN:-$BIN/prefixgate}
TICKS=$(getconf CLK_TCK)
WORK=$(mktemp -d)
PIDS=()

cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

for needed in wrk "$GATEWAY_BIN" "$BIN/examples/fixed_upstream" "$BIN/examples/plain_forwarder"; do
    command -v "$needed" >/dev/null || { echo "missing: $needed (see the header of $0)" >&2; exit 1; }
done

PROXY_CPUS=${PROXY_CPUS:-1}
UPSTREAM_CPUS=${UPSTREAM_CPUS:-0}
LOAD_CPUS=${LOAD_CPUS:-0}
WRK_THREADS=${WRK_THREADS:-1}

pin() { # pin CPUS COMMAND...: run pinned when PIN=1 (exec: $! must be the measured process)
    local cpus=$1; shift
    if [[ "${PIN:-0}" == 1 ]]; then exec taskset -c "$cpus" "$@"; else exec "$@"; fi
}

# start NAME PATTERN COMMAND...: starts a process, waits (bounded) for PATTERN + URL in its
# output, and sets $STARTED_URL and $STARTED_PID.
start() {
    local name=$1 pattern=$2; shift 2
    "$@" >"$WORK/$name.log" 2>&1 &
    STARTED_PID=$!
    PIDS+=("$STARTED_PID")
    for _ in $(seq 1 100); do
        STARTED_URL=$(grep -o "$pattern http://[0-9.:]*" "$WORK/$name.log" 2>/dev/null | head -1 | awk '{print $NF}') || true
        [[ -n "$STARTED_URL" ]] && return 0
        sleep 0.1
    done
    echo "$name did not start:" >&2; cat "$WORK/$name.log" >&2; exit 1
}

cpu_ticks() { # user + system ticks of a process, all threads
    awk '{print $14 + $15}' "/proc/$1/stat"
}

if [[ "${UPSTREAM_KIND:-fixed}" == mock ]]; then
    # A simulated vLLM replica instead: its own per-request work (tokenizing, the engine
    # model's steps) makes the proxy's share of the time smaller, as a real engine would.
    start upstream fixed pin "$UPSTREAM_CPUS" "$BIN/mock-engine" --profile "${MOCK_PROFILE:-fast}" \
        --listen 127.0.0.1:0 --name fixed
else
    start upstream upstream pin "$UPSTREAM_CPUS" "$BIN/examples/fixed_upstream" 127.0.0.1:0
fi
UPSTREAM=$STARTED_URL; UPSTREAM_PID=$STARTED_PID
start forwarder forwarder pin "$PROXY_CPUS" "$BIN/examples/plain_forwarder" 127.0.0.1:0 "${UPSTREAM#http://}"
FORWARDER=$STARTED_URL; FORWARDER_PID=$STARTED_PID
# shellcheck disable=SC2086
start gateway "listening on" pin "$PROXY_CPUS" env ${GATEWAY_ENV:-} "$GATEWAY_BIN" --backend "fixed=$UPSTREAM" \
    --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --set engine_scrape.enabled=false ${GATEWAY_ARGS:-}
GATEWAY=$STARTED_URL; GATEWAY_PID=$STARTED_PID
TARGETS="direct forwarder gateway"
if [[ -n "${BASELINE_BIN:-}" ]]; then
    # shellcheck disable=SC2086
    start baseline "listening on" pin "$PROXY_CPUS" env ${GATEWAY_ENV:-} "$BASELINE_BIN" --backend "fixed=$UPSTREAM" \
        --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --set engine_scrape.enabled=false ${GATEWAY_ARGS:-}
    BASELINE=$STARTED_URL; BASELINE_PID=$STARTED_PID
    TARGETS="$TARGETS baseline"
fi
# The gateway learns the upstream's model in its first health round; wait for it (bounded).
for url in "$GATEWAY" "${BASELINE:-$GATEWAY}"; do
    for _ in $(seq 1 50); do
        curl -sf "$url/ready" >/dev/null && break
        sleep 0.1
    done
done

echo "# $(date -u +%FT%TZ) $(nproc) CPUs, load average: $(cut -d' ' -f1-3 /proc/loadavg), PIN=${PIN:-0} (proxy ${PROXY_CPUS}, upstream ${UPSTREAM_CPUS}, wrk ${LOAD_CPUS} with ${WRK_THREADS} threads)"
echo "# upstream $UPSTREAM, forwarder $FORWARDER, gateway $GATEWAY; ${SECONDS_PER_RUN}s per run, $ROUNDS rounds"
printf 'case\tc\ttarget\trequests\trps\tp50_us\tp99_us\tproxy_cpu_us_per_req\tupstream_cpu_us_per_req\tnon2xx\n'
RESULTS=$WORK/results.tsv

to_us() { # wrk latency ("85.00us", "1.20ms", "2.00s") to microseconds
    awk -v v="$1" 'BEGIN {
        n = v + 0
        if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print n }'
}

for round in $(seq 1 "$ROUNDS"); do
    for case in chat chat_sse; do
        for c in $CONCURRENCIES; do
            for target in $TARGETS; do
                case $target in
                    direct) url=$UPSTREAM; pid="" ;;
                    forwarder) url=$FORWARDER; pid=$FORWARDER_PID ;;
                    gateway) url=$GATEWAY; pid=$GATEWAY_PID ;;
                    baseline) url=$BASELINE; pid=$BASELINE_PID ;;
                esac
                before=0; [[ -n "$pid" ]] && before=$(cpu_ticks "$pid")
                up_before=$(cpu_ticks "$UPSTREAM_PID")
                threads=$(( c < WRK_THREADS ? c : WRK_THREADS ))  # wrk needs connections >= threads
                out=$( (pin "$LOAD_CPUS" wrk -t"$threads" -c"$c" -d"${SECONDS_PER_RUN}s" --latency \
                    -s "$HERE/$case.lua" "$url/v1/chat/completions") )
                after=0; [[ -n "$pid" ]] && after=$(cpu_ticks "$pid")
                up_after=$(cpu_ticks "$UPSTREAM_PID")
                requests=$(echo "$out" | awk '/requests in/ {print $1}')
                rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
                p50=$(to_us "$(echo "$out" | awk '$1 == "50%" {print $2}')")
                p99=$(to_us "$(echo "$out" | awk '$1 == "99%" {print $2}')")
                non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
                cpu=$(awk -v d=$((after - before)) -v t="$TICKS" -v n="$requests" \
                    'BEGIN { printf "%.1f", (n > 0 ? d / t * 1e6 / n : 0) }')
                up_cpu=$(awk -v d=$((up_after - up_before)) -v t="$TICKS" -v n="$requests" \
                    'BEGIN { printf "%.1f", (n > 0 ? d / t * 1e6 / n : 0) }')
                row=$(printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s' "$case" "$c" "$target" \
                    "$requests" "$rps" "$p50" "$p99" "$cpu" "$up_cpu" "${non2xx:-0}")
                echo "$row" | tee -a "$RESULTS"
            done
        done
    done
done

echo
echo "# summary over $ROUNDS rounds: mean rps and p50/p99, CPU per request over all requests;"
echo "# ratio = target rps / direct rps, added = target p50 - direct p50"
printf 'case\tc\ttarget\trps\tratio\tp50_us\tadded_p50_us\tp99_us\tproxy_cpu_us_per_req\n'
awk -F'\t' -v rounds="$ROUNDS" '
    { key = $1 "\t" $2 "\t" $3; if (!(key in n)) order[++k] = key
      n[key]++; req[key] += $4; rps[key] += $5; p50[key] += $6; p99[key] += $7
      cpu[key] += $8 * $4 }
    END {
        for (i = 1; i <= k; i++) {
            key = order[i]; split(key, f, "\t"); d = f[1] "\t" f[2] "\tdirect"
            printf "%s\t%.0f\t%.2f\t%.0f\t%+.0f\t%.0f\t%.1f\n", key, rps[key] / n[key],
                rps[key] / rps[d], p50[key] / n[key], p50[key] / n[key] - p50[d] / n[d],
                p99[key] / n[key], (req[key] > 0 ? cpu[key] / req[key] : 0)
        }
    }' "$RESULTS"
