#!/usr/bin/env bash
# Configures, builds and runs the default test set (everything but tests labelled "slow").
# Usage: scripts/test.sh [build-dir] [extra ctest args...]
#   XFUSER_FIXTURES=/path/to/fixtures   reference data (default tests/fixtures, committed)
#   TORCH_DIR=...   build against that libtorch (default Debian's libtorch-dev); CI passes PyPI's
#                   CUDA torch from scripts/cuda-libtorch.sh (the tests run on the CPU)
#   TEST_BUILD=selected   build only the programs (xfuser-run, xfuser, benchmarks, examples) and
#                   the tests that the ctest arguments select, instead of everything
#   scripts/test.sh build -L slow               run the slow tests only
# Prints how long the build and the tests took at its end.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
shift || true
GEN=()
command -v ninja >/dev/null && [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]] && GEN=(-G Ninja)
TORCH=()
[[ -n "${TORCH_DIR:-}" ]] && TORCH=(-DTorch_DIR="$TORCH_DIR")
if [[ $# -eq 0 ]]; then set -- -LE slow; fi
start=$SECONDS
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "${TORCH[@]}" >/dev/null
if [[ "${TEST_BUILD:-all}" == selected ]]; then
  mapfile -t tests < <(ctest --test-dir "$BUILD_DIR" -N "$@" |
                       sed -n 's/^ *Test *#[0-9]*: \([^ ]*\).*/\1/p')
  targets=(xfuser-programs)
  for t in "${tests[@]}"; do t="${t%%.*}"; targets+=("${t%_np[0-9]*}"); done
  mapfile -t targets < <(printf '%s\n' "${targets[@]}" | sort -u)
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${targets[@]}"
else
  cmake --build "$BUILD_DIR" -j "$(nproc)"
fi
built=$SECONDS
# mpirun as root (CI, containers) needs these; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rc=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "$@" || rc=$?
echo "test.sh: configure and build $((built - start)) s, tests $((SECONDS - built)) s" \
     "($BUILD_DIR, ctest $*)"
exit "$rc"
