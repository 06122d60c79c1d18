#!/usr/bin/env bash
# Stops the replicas start.sh started: SIGTERM to each replica's process group, then SIGKILL
# to whatever is left after 20 s.   tests/real-vllm/stop.sh STATE_DIR
set -uo pipefail
state=${1:?usage: stop.sh STATE_DIR}
groups=()
for file in "$state"/*.pgid; do
    [ -f "$file" ] || continue
    groups+=("$(cat "$file")")
done
for pgid in "${groups[@]}"; do kill -TERM -- "-$pgid" 2>/dev/null; done
for _ in $(seq 1 40); do
    alive=0
    for pgid in "${groups[@]}"; do kill -0 -- "-$pgid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && exit 0
    sleep 0.5
done
for pgid in "${groups[@]}"; do kill -KILL -- "-$pgid" 2>/dev/null; done
exit 0
