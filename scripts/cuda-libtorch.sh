#!/usr/bin/env bash
# Installs PyTorch's CUDA wheel from PyPI into a virtual environment (once) and prints the
# Torch_DIR of its libtorch: what CI builds xfuser against to check the GPU build on a machine
# without a GPU, and what most GPU hosts have.
# Usage: scripts/cuda-libtorch.sh [venv-dir]      (default: $XFUSER_TORCH_VENV or build-torch-venv)
#   XFUSER_TORCH_SPEC   the pip requirement (default torch==2.15.0: CI stays reproducible)
# Needs python3 with venv (scripts/install-deps.sh --with-python) and network. Progress goes to
# stderr; stdout is the Torch_DIR alone:  cmake -DTorch_DIR="$(scripts/cuda-libtorch.sh)" ...
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-${XFUSER_TORCH_VENV:-build-torch-venv}}
SPEC=${XFUSER_TORCH_SPEC:-torch==2.15.0}
if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV" >&2
fi
if ! PYTHONWARNINGS=ignore "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  echo "cuda-libtorch: pip install $SPEC into $VENV" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check "$SPEC" >&2
fi
PYTHONWARNINGS=ignore "$VENV/bin/python" - <<'PY'
import os, sys, torch
if torch.version.cuda is None:
    sys.exit(f"cuda-libtorch: torch {torch.__version__} has no CUDA")
print(f"cuda-libtorch: torch {torch.__version__}, CUDA {torch.version.cuda}", file=sys.stderr)
print(os.path.join(torch.utils.cmake_prefix_path, "Torch"))
PY
