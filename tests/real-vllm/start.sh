#!/usr/bin/env bash
# Starts N real vLLM replicas (CPU build, the tiny model) in the background and prints one
# `name=url` line per replica once every one answers /health:
#
#   tests/real-vllm/start.sh [N] [STATE_DIR]      # N defaults to 2
#   prefixgate --backend vllm-0=http://127.0.0.1:PORT --backend vllm-1=http://127.0.0.1:PORT
#   tests/real-vllm/stop.sh STATE_DIR
#
# Installs vLLM first if the cached venv is missing (install.sh) and builds the model
# (model.sh). STATE_DIR (default: a new temporary directory, named on stderr) receives each
# replica's log, its process group id (`NAME.pgid`), `replicas` (the printed lines), `venv`
# and `model` (the paths replica.sh takes), and
# `backends.toml`: the same replicas as a prefixgate config, with each replica's KV-event
# endpoints (replicas on one host publish on ports of their own), for `prefixgate --config`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
count=${1:-2}
state=${2:-$(mktemp -d -t real-vllm.XXXXXX)}
startup_timeout=${REAL_VLLM_STARTUP_TIMEOUT:-600}
case "$count" in '' | *[!0-9]* | 0) echo "start.sh: N must be a positive number, not '$count'" >&2; exit 2 ;; esac
mkdir -p "$state"

venv=$("$here/install.sh")
model=$("$here/model.sh" "$venv")
cores=$(nproc)
# For whoever starts more replicas like these (the suite's SIGKILL test starts its own).
echo "$venv" >"$state/venv"
echo "$model" >"$state/model"

# Free loopback ports, three per replica (HTTP, KV events, replay).
mapfile -t ports < <("$venv/bin/python" - "$((3 * count))" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
for s in socks:
    print(s.getsockname()[1])
PY
)

: >"$state/replicas"
: >"$state/backends.toml"
for ((i = 0; i < count; i++)); do
    name="vllm-$i"
    port=${ports[$((3 * i))]} kv=${ports[$((3 * i + 1))]} replay=${ports[$((3 * i + 2))]}
    # Its own session, so stop.sh (or a test) can end the API server and its engine
    # processes together, as a pod's end does.
    setsid "$here/replica.sh" "$venv" "$model" "$port" "$kv" "$replay" "$((i % cores))" \
        >"$state/$name.log" 2>&1 </dev/null &
    echo "$!" >"$state/$name.pgid"
    echo "$name=http://127.0.0.1:$port" >>"$state/replicas"
    cat >>"$state/backends.toml" <<TOML
[[backends]]
name = "$name"
url = "http://127.0.0.1:$port"
model = "tiny"
kv_events = "tcp://127.0.0.1:$kv"
kv_replay = "tcp://127.0.0.1:$replay"

TOML
done
echo "start.sh: starting $count replica(s); state and logs in $state" >&2

deadline=$((SECONDS + startup_timeout))
while IFS='=' read -r name url; do
    until curl -sf -o /dev/null "$url/health"; do
        if ! kill -0 "$(cat "$state/$name.pgid")" 2>/dev/null; then
            echo "start.sh: error: $name exited during startup; the end of its log:" >&2
            tail -n 20 "$state/$name.log" >&2
            "$here/stop.sh" "$state"
            exit 1
        fi
        if ((SECONDS > deadline)); then
            echo "start.sh: error: $name did not answer /health within ${startup_timeout}s (log: $state/$name.log)" >&2
            "$here/stop.sh" "$state"
            exit 1
        fi
        sleep 1
    done
done <"$state/replicas"
cat "$state/replicas"
