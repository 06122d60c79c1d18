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

# shellcheck source=gateway/benches/overhead/measure.sh
source "$HERE/measure.sh"

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

describe_machine
echo "# upstream $UPSTREAM, forwarder $FORWARDER, gateway $GATEWAY; ${SECONDS_PER_RUN}s per run, $ROUNDS rounds"
result_header
RESULTS=$WORK/results.tsv

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
                measure "$case" "$c" "$target" "$url" "$pid" "$UPSTREAM_PID" "$HERE/$case.lua"
            done
        done
    done
done

summarize "$ROUNDS"
