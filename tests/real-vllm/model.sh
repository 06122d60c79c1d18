#!/usr/bin/env bash
# Builds the tiny test model (make_model.py) into the cache, once per version of the
# generator, and prints its directory. Needs the venv from install.sh (its path is $1).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:?usage: model.sh VENV}
cache="${PREFIXGATE_REAL_VLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prefixgate/real-vllm}"
version=$(sha256sum "$here/make_model.py" | cut -c1-16)
model="$cache/model-$version"
if [ ! -f "$model/prefixgate-model.json" ]; then
    # Models of older generator versions are of no further use.
    find "$cache" -maxdepth 1 -name 'model-*' ! -name "model-$version" -exec rm -rf {} +
    "$venv/bin/python" "$here/make_model.py" "$model.part" >/dev/null 2>"$cache/make_model.log" || {
        echo "model.sh: error: make_model.py failed (log: $cache/make_model.log)" >&2
        exit 1
    }
    rm -rf "$model"
    mv "$model.part" "$model"
fi
echo "$model"
