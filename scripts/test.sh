#!/usr/bin/env bash
# Configures, builds and runs the default test set (everything but tests labelled "slow").
# Usage: scripts/test.sh [build-dir] [extra ctest args...]
#   XFUSER_FIXTURES=/path/to/fixtures   reference data (default tests/fixtures, committed)
#   TORCH_DIR=...   build against that libtorch (default Debian's libtorch-dev); CI passes PyPI's
#                   CUDA torch from scripts/cuda-libtorch.sh (the tests run on the CPU)
#   scripts/test.sh build -L slow               run the slow tests only
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
shift || true
GEN=()
command -v ninja >/dev/null && [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]] && GEN=(-G Ninja)
TORCH=()
[[ -n "${TORCH_DIR:-}" ]] && TORCH=(-DTorch_DIR="$TORCH_DIR")
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "${TORCH[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
# mpirun as root (CI, containers) needs these; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [[ $# -eq 0 ]]; then set -- -LE slow; fi
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"
