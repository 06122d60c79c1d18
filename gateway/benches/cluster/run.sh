#!/usr/bin/env bash
# Several gateways, live (docs/CLUSTER.md, "Live"): R mock-engine replicas; G prefixgate
# processes in front of them, all with the same static --backend list, sharing routing state
# through a local redis-server or not; the round-robin splitter (gateway/examples/
# plain_forwarder.rs with G upstreams) in front of the gateways, as a Service spreads requests;
# and `loadgen matrix` against the splitter (by default cold-uniform, warm-uniform and hot50
# with prefix-load, the matrix's two rounds). G = 1 is the baseline: one gateway, behind the
# same splitter so that every run pays the same extra hop.
#
#   cargo build --release -p gateway -p mock-engine -p loadgen --bins --example plain_forwarder
#   GATEWAYS=2 SHARING=on TIME_SCALE=4 gateway/benches/cluster/run.sh /tmp/g2-on.json
#
# Environment:
#   REPLICAS (2)        mock-engine replicas, named L20-A, L20-B, …
#   GATEWAYS (2)        prefixgate processes behind the splitter
#   SHARING (on)        on: every gateway gets --cluster-url of one local redis-server (needs
#                       redis-server and redis-cli: apt-get install -y redis-server); off: none
#   TIME_SCALE (1)      engine time runs this many times faster than wall time (mock-engine
#                       --time-scale, loadgen --time-scale: sends are scheduled and times
#                       reported in engine seconds). The gateways, the splitter and Redis are
#                       not scaled: their wall-time latency, and sharing's propagation delay,
#                       count TIME_SCALE times over in engine time
#   ROUTES (prefix-load) the matrix's routes, comma-separated
#   SCENARIOS ('"cold-uniform", "warm-uniform", "hot50"')  the matrix's scenarios, TOML strings
#   COUNT               requests per phase (default: the matrix's 96)
#   PROFILE (l20-qwen27b-fp8)  the replicas' engine profile
#   PROFILE_DIR (release)      the cargo profile directory whose binaries run (debug: slower
#                       gateways, whose overhead the time scale multiplies)
#   KILL_AT, RESTART_AT  wall seconds after loadgen starts: kill the redis-server, and start a
#                       fresh one on the same port (SHARING=on)
# Each gateway's cluster metrics are sampled at the end, 2 s later (settled), and around a kill.
#
# Prints the work directory first (logs, metrics samples, matrix.toml) and, at the end, one
# line per phase (good of requests, errors) and the total good; the full result is OUT.json
# (`loadgen report OUT.json` renders it).
set -euo pipefail

OUT=${1:?usage: run.sh OUT.json (see the header for the environment)}
REPLICAS=${REPLICAS:-2}
GATEWAYS=${GATEWAYS:-2}
SHARING=${SHARING:-on}
TIME_SCALE=${TIME_SCALE:-1}
ROUTES=${ROUTES:-prefix-load}
PROFILE=${PROFILE:-l20-qwen27b-fp8}
SCENARIOS=${SCENARIOS:-'"cold-uniform", "warm-uniform", "hot50"'}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/${PROFILE_DIR:-release}
MODEL=Qwen3.8-27B-FP8
case "$SHARING" in on | off) ;; *) echo "SHARING must be on or off, got $SHARING" >&2; exit 2 ;; esac
[[ "$GATEWAYS" =~ ^[1-9][0-9]*$ && "$REPLICAS" =~ ^[1-9][0-9]*$ && "$REPLICAS" -le 26 ]] || {
    echo "GATEWAYS must be >= 1 and REPLICAS 1..=26, got $GATEWAYS and $REPLICAS" >&2
    exit 2
}
for needed in "$BIN/prefixgate" "$BIN/mock-engine" "$BIN/loadgen" "$BIN/examples/plain_forwarder"; do
    [[ -x "$needed" ]] || { echo "missing: $needed (see the header of $0)" >&2; exit 1; }
done
if [[ "$SHARING" == on ]]; then
    for tool in redis-server redis-cli; do
        command -v "$tool" >/dev/null || { echo "SHARING=on needs $tool (apt-get install -y redis-server)" >&2; exit 1; }
    done
fi

WORK=$(mktemp -d /tmp/prefixgate-cluster-live.XXXXXX)
PIDS=()
echo "work directory: $WORK" >&2

cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    if [[ -f "$WORK/redis-restarted.pid" ]]; then kill "$(cat "$WORK/redis-restarted.pid")" 2>/dev/null || true; fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_for URL: until it answers (at most 30 s).
wait_for() {
    for _ in $(seq 1 300); do
        curl -sf -o /dev/null "$1" && return 0
        sleep 0.1
    done
    echo "never answered: $1" >&2
    exit 1
}

REDIS_PORT=$(free_port)
# start_redis: a redis-server on $REDIS_PORT, keeping nothing on disk; its pid in REDIS_PID.
start_redis() {
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
        >>"$WORK/redis.log" 2>&1 &
    REDIS_PID=$!
    for _ in $(seq 1 100); do
        redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "redis-server did not start" >&2
    exit 1
}
CLUSTER_ARGS=()
if [[ "$SHARING" == on ]]; then
    start_redis
    PIDS+=("$REDIS_PID")
    CLUSTER_ARGS=(--cluster-url "redis://127.0.0.1:$REDIS_PORT" --set cluster.name=live)
fi

BACKENDS=()
REPLICA_ARGS=()
for i in $(seq 0 $((REPLICAS - 1))); do
    name="L20-$(printf "\\x$(printf %x $((65 + i)))")"
    port=$(free_port)
    "$BIN/mock-engine" --listen "127.0.0.1:$port" --name "$name" --profile "$PROFILE" \
        --time-scale "$TIME_SCALE" --model "$MODEL" >"$WORK/$name.log" 2>&1 &
    PIDS+=($!)
    wait_for "http://127.0.0.1:$port/health"
    BACKENDS+=(--backend "$name=http://127.0.0.1:$port")
    REPLICA_ARGS+=(--replica "$name=http://127.0.0.1:$port")
done

UPSTREAMS=()
METRICS=()
for g in $(seq 0 $((GATEWAYS - 1))); do
    port=$(free_port)
    metrics=$(free_port)
    "$BIN/prefixgate" "${BACKENDS[@]}" --listen "127.0.0.1:$port" \
        --metrics-listen "127.0.0.1:$metrics" "${CLUSTER_ARGS[@]}" \
        --set "replica_time_scale=$TIME_SCALE" \
        ${CLUSTER_ARGS[0]:+--set "cluster.gateway_id=gw-$g"} >"$WORK/gw-$g.log" 2>&1 &
    PIDS+=($!)
    wait_for "http://127.0.0.1:$port/ready"
    UPSTREAMS+=("127.0.0.1:$port")
    METRICS+=("http://127.0.0.1:$metrics/metrics")
    echo "gw-$g http://127.0.0.1:$port metrics http://127.0.0.1:$metrics" >&2
done

SPLIT=$(free_port)
"$BIN/examples/plain_forwarder" "127.0.0.1:$SPLIT" "${UPSTREAMS[@]}" >"$WORK/splitter.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do grep -q forwarder "$WORK/splitter.log" && break; sleep 0.1; done
grep -q forwarder "$WORK/splitter.log" || { echo "the splitter did not start" >&2; exit 1; }

# sample_metrics LABEL: each gateway's cluster series now, into $WORK/gw-G.LABEL.metrics.
sample_metrics() {
    for g in "${!METRICS[@]}"; do
        curl -s "${METRICS[$g]}" | grep '^prefixgate_cluster_' >"$WORK/gw-$g.$1.metrics" || true
    done
}

sed "s/^scenarios = .*/scenarios = [$SCENARIOS]/" "$ROOT/config/matrix-24.toml" >"$WORK/matrix.toml"

if [[ -n "${KILL_AT:-}" && "$SHARING" == on ]]; then
    (
        sleep "$KILL_AT"
        sample_metrics before-kill
        echo "$(date -u +%T) killing redis-server" >&2
        kill "$REDIS_PID"
        if [[ -n "${RESTART_AT:-}" ]]; then
            sleep $((RESTART_AT - KILL_AT))
            sample_metrics before-restart
            echo "$(date -u +%T) restarting redis-server" >&2
            redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
                >>"$WORK/redis.log" 2>&1 &
            echo $! >"$WORK/redis-restarted.pid"
        fi
    ) &
    PIDS+=($!)
fi

"$BIN/loadgen" matrix --gateway "http://127.0.0.1:$SPLIT" "${REPLICA_ARGS[@]}" \
    --model "$MODEL" --matrix "$WORK/matrix.toml" --routes "$ROUTES" --out "$OUT" \
    --time-scale "$TIME_SCALE" ${COUNT:+--count "$COUNT"} \
    2> >(tee "$WORK/loadgen.log" >&2)
sample_metrics end
# The gauges of peers' requests are refreshed on the expiry tick: once it has run, none is
# left (no phantom load).
sleep 2
sample_metrics settled

python3 - "$OUT" "$REPLICAS" "$GATEWAYS" "$SHARING" "$TIME_SCALE" <<'EOF'
import json, sys
path, replicas, gateways, sharing, scale = sys.argv[1:]
phases = json.load(open(path))["phases"]
for p in phases:
    print(f"{p['phase']}: good {p['good']}/{p['requests']}, errors {p['errors']}, dropped {p['dropped']}")
good = sum(p["good"] for p in phases)
errors = sum(p["errors"] for p in phases)
print(f"replicas={replicas} gateways={gateways} sharing={sharing} time_scale={scale}: "
      f"good {good} of {sum(p['requests'] for p in phases)}, errors {errors}")
EOF
