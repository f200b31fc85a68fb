#!/usr/bin/env bash
# ASan + UBSan (gcc, XFUSER_SANITIZE=ON) build of the project and its `unit` tests.
# Usage: scripts/sanitize.sh [build-dir] [extra ctest args...]   (default build-asan)
#   TORCH_DIR=...          build against that libtorch (CI: PyPI's CUDA torch, from
#                          scripts/cuda-libtorch.sh), else Debian's
#   SANITIZE_BUILD_ALL=1   build every target (the whole project: all tests, bench, examples),
#                          then run the same tests
#   SANITIZE_EXTRA_TARGETS="a b"  build these targets too (e.g. bench_flux_gpu test_gpu)
# Any AddressSanitizer or UndefinedBehaviorSanitizer report fails the test that raised it.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build-asan}"
shift || true
GEN=()
command -v ninja >/dev/null && [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]] && GEN=(-G Ninja)
CFG=(-DCMAKE_BUILD_TYPE=Release -DXFUSER_SANITIZE=ON -DXFUSER_SHARED_LIBS=ON)
[[ -n "${TORCH_DIR:-}" ]] && CFG+=(-DTorch_DIR="$TORCH_DIR")
BUILD_ALL=${SANITIZE_BUILD_ALL:-0}
EXTRA=${SANITIZE_EXTRA_TARGETS:-}
((BUILD_ALL)) || [[ -n "$EXTRA" ]] || CFG+=(-DXFUSER_BUILD_BENCH=OFF -DXFUSER_BUILD_EXAMPLES=OFF)
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" "${CFG[@]}" >/dev/null
# Default selection: the `unit` label, minus the tests that load SentencePiece (the T5 tokenizer,
# `xfuser make-tiny`, which tiny-flux runs need) and test_install (an outside project built
# against the install) in a libtorch process. Under ASan the shim cannot be dlopen()ed with
# RTLD_DEEPBIND, so sentencepiece binds to libtorch's protobuf and crashes in
# ModelProto parsing (docs/fuzzing.md); those paths are fuzzed torch-free instead. test_serve
# starts `xfuser serve` with tiny-shapes, whose T5 tokenizer is SentencePiece.
SPM_IN_TORCH='^(test_serve|test_tokenizers|test_bad_inputs|test_xfuser_run|test_tools|test_flux_pipeline|test_pipefusion|test_pipefusion_run|test_install|test_sd3_tiny|test_pipeline_parity|test_sd3_run|test_device|test_dtype_run|test_dataset_resume|test_nvtx)$'
# Only what the selected tests need: their executables and the programs they spawn.
if [[ $# -eq 0 ]]; then set -- -L unit -LE slow -E "$SPM_IN_TORCH"; fi
mapfile -t tests < <(ctest --test-dir "$BUILD_DIR" -N "$@" | sed -n 's/^ *Test *#[0-9]*: \([^ ]*\).*/\1/p')
targets=()
for t in "${tests[@]}"; do targets+=("${t%_np[0-9]*}"); done
if ((BUILD_ALL)); then
  cmake --build "$BUILD_DIR" -j "$(nproc)"
else
  # shellcheck disable=SC2086
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target xfuser-run xfuser $EXTRA \
    $(printf '%s\n' "${targets[@]}" | sort -u)
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Leak checking is off: Open MPI and libtorch keep process-lifetime allocations that
# LeakSanitizer reports at exit. Everything else aborts the process with a report.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" "$@"
