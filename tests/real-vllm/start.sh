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

# N free loopback ports, picked while all are held, so none is given twice.
free_ports() {
    "$venv/bin/python" - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

declare -a port kv replay
# Starts replica I on its ports (HTTP, KV events, replay) in its own session, so stop.sh (or
# a test) can end the API server and its engine processes together, as a pod's end does.
launch() {
    local i=$1 name="vllm-$1"
    setsid "$here/replica.sh" "$venv" "$model" "${port[$i]}" "${kv[$i]}" "${replay[$i]}" \
        "$((i % cores))" >"$state/$name.log" 2>&1 </dev/null &
    echo "$!" >"$state/$name.pgid"
}

# Every replica's three ports in one pick, so that no two replicas share one.
read -r -a picked < <(free_ports "$((3 * count))")
for ((i = 0; i < count; i++)); do
    port[i]=${picked[$((3 * i))]} kv[i]=${picked[$((3 * i + 1))]} replay[i]=${picked[$((3 * i + 2))]}
done
for ((i = 0; i < count; i++)); do launch "$i"; done
echo "start.sh: starting $count replica(s); state and logs in $state" >&2

# Each replica until it answers /health. One that exits because a port it was given was
# taken before it bound it (vLLM picks ports of its own for its processes while it starts,
# from the same free range) is started once more on new ports; any other exit, or no answer
# within the timeout, stops them all.
deadline=$((SECONDS + startup_timeout))
for ((i = 0; i < count; i++)); do
    name="vllm-$i" retried=0
    until curl -sf -o /dev/null "http://127.0.0.1:${port[$i]}/health"; do
        if ! kill -0 "$(cat "$state/$name.pgid")" 2>/dev/null; then
            if [ "$retried" = 0 ] && grep -q "Address already in use" "$state/$name.log"; then
                echo "start.sh: $name lost a port before it bound it; starting it again" >&2
                mv "$state/$name.log" "$state/$name-first.log"
                read -r "port[$i]" "kv[$i]" "replay[$i]" < <(free_ports 3)
                launch "$i"
                retried=1
                continue
            fi
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
done

# The replicas as the suite and prefixgate read them, with the ports they came up on.
: >"$state/replicas"
: >"$state/backends.toml"
for ((i = 0; i < count; i++)); do
    name="vllm-$i"
    echo "$name=http://127.0.0.1:${port[$i]}" >>"$state/replicas"
    cat >>"$state/backends.toml" <<TOML
[[backends]]
name = "$name"
url = "http://127.0.0.1:${port[$i]}"
model = "tiny"
kv_events = "tcp://127.0.0.1:${kv[$i]}"
kv_replay = "tcp://127.0.0.1:${replay[$i]}"

TOML
done
cat "$state/replicas"
