#!/usr/bin/env bash
# Create .venv and install musacoder. Torch is not pinned for GPU users: with a GPU we take pip's default
# (CUDA) build; without one we take the CPU build so a laptop or CI box does not download gigabytes of CUDA.
# Usage: scripts/setup.sh [test]      (MUSACODER_TORCH="torch==X" overrides the torch requirement)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip install -q --disable-pip-version-check"
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if [ -n "${MUSACODER_TORCH:-}" ]; then
    $PIP "$MUSACODER_TORCH"
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    $PIP torch
  else
    echo "no GPU found: installing the CPU build of torch" >&2
    $PIP "torch==2.13.0+cpu" 2>/dev/null || $PIP torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
extras=""
[ "${1:-}" = "test" ] && extras="[test,bench,train,serve,cluster,verl]"
$PIP -e ".$extras"
if [ "${1:-}" = "test" ]; then
  # verl pins an older transformers: it goes in without its pins, for the adapter's CPU tests (docs/rl.md)
  $PIP --no-deps "verl==0.9.1" "tensordict>=0.8,<=0.10" pyvers cloudpickle orjson
fi
