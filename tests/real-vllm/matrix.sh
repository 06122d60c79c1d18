#!/usr/bin/env bash
# loadgen's live matrix on two real vLLM replicas: config/matrix-real-vllm.toml (cold,
# warm, hot50; every route; one round), through prefixgate's release binary.
#
#   tests/real-vllm/matrix.sh [OUT_DIR]          # default: target/real-vllm-matrix
#
# Starts two replicas (start.sh; installs vLLM first if needed), a prefixgate in front of
# them, runs `loadgen matrix --gateway`, and prints `loadgen report`'s table: good requests,
# TTFT and the replica split per scenario and route. Takes about 10 minutes here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
out=${1:-$target/real-vllm-matrix}
mkdir -p "$out"

cargo build --release --bin prefixgate --bin loadgen
state=$(mktemp -d -t real-vllm-matrix.XXXXXX)
gateway_pid=
cleanup() {
    [ -n "$gateway_pid" ] && kill "$gateway_pid" 2>/dev/null
    "$here/stop.sh" "$state"
    rm -rf "$state"
}
trap cleanup EXIT
"$here/start.sh" 2 "$state" >/dev/null

# The gateway on free ports; its first line on stderr names them.
{
    echo 'listen = "127.0.0.1:0"'
    echo 'metrics_listen = "127.0.0.1:0"'
    cat "$state/backends.toml"
} >"$state/gateway.toml"
"$target/release/prefixgate" --config "$state/gateway.toml" 2>"$out/gateway.log" &
gateway_pid=$!
for _ in $(seq 1 100); do
    grep -q '^prefixgate listening on ' "$out/gateway.log" && break
    sleep 0.1
done
line=$(grep -m1 '^prefixgate listening on ' "$out/gateway.log") || {
    echo "matrix.sh: prefixgate did not start:" >&2
    cat "$out/gateway.log" >&2
    exit 1
}
gateway=$(sed -E 's/^prefixgate listening on ([^ ]+) .*/\1/' <<<"$line")
metrics=$(sed -E 's/.*\(metrics on ([^)]+)\).*/\1/' <<<"$line")

replicas=()
while IFS= read -r replica; do replicas+=(--replica "$replica"); done <"$state/replicas"
"$target/release/loadgen" matrix --gateway "$gateway" --gateway-metrics "$metrics" \
    "${replicas[@]}" --model tiny --matrix config/matrix-real-vllm.toml \
    --out "$out/results.json"
"$target/release/loadgen" report "$out/results.json" | tee "$out/report.md"
