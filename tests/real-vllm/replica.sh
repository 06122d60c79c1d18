#!/usr/bin/env bash
# Runs one real vLLM replica in the foreground (exec: this process becomes vLLM's API server):
#
#   replica.sh VENV MODEL_DIR PORT KV_PORT REPLAY_PORT [CORE]
#
# serving the tiny model as `tiny` on http://127.0.0.1:PORT with prefix caching, prompt-token
# details (`usage.prompt_tokens_details.cached_tokens`) and vLLM's ZMQ KV-cache events on
# tcp://*:KV_PORT (replay on tcp://*:REPLAY_PORT). vLLM binds a PUB socket only on a wildcard
# endpoint (`tcp://*:P`; `tcp://HOST:P` makes it connect instead), so replicas on one host
# need ports of their own. CORE pins the engine's OpenMP threads to one core, so that two
# replicas on a small machine do not fight over the same one.
#
# CPU build constraints (see docs/REAL_VLLM.md): the KV block size must be a multiple of 32,
# and float32 is the dtype every x86 CPU runs.
set -euo pipefail
venv=${1:?usage: replica.sh VENV MODEL_DIR PORT KV_PORT REPLAY_PORT [CORE]}
model=${2:?model dir}
port=${3:?port}
kv_port=${4:?kv events port}
replay_port=${5:?replay port}
core=${6:-}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
# The same hash seed on every replica, so that their block hashes agree (vLLM's NONE_HASH).
export PYTHONHASHSEED=0
# Quiet and offline: no usage stats, no hub.
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [ -n "$core" ]; then
    export VLLM_CPU_OMP_THREADS_BIND=$core
fi
exec "$venv/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$model" --served-model-name tiny \
    --host 127.0.0.1 --port "$port" \
    --dtype float32 --max-model-len 2048 --block-size 32 \
    --enable-prefix-caching --enable-prompt-tokens-details \
    --kv-events-config "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://*:$kv_port\", \"replay_endpoint\": \"tcp://*:$replay_port\", \"topic\": \"kv-events\"}"
