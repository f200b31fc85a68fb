#!/usr/bin/env bash
# The GPU checks in one run, on a machine with a GPU and no network: builds xfuser against that
# machine's PyTorch from an offline bundle, runs the `gpu` tests and the GPU benchmark, and
# writes every log and result under OUT.
#
# Usage: scripts/gpu-check.sh BUNDLE OUT [PHASES]
#   BUNDLE   scripts/bundle-deps.sh BUNDLE --no-ffmpeg --slim, made beforehand on a Debian 12
#            machine (22 MB)
#   OUT      where logs and JSON go (created)
#   PHASES   comma-separated, in order: build, test, bench (default build,test,bench;
#            --no-bench = build,test). A device call is limited to 10 minutes: run `build` in one
#            call and `test,bench` in the next on the same warm machine (build-gpu is kept).
#   PYTHON   the Python holding PyTorch (default python3); with diffusers importable, the
#            benchmark also runs diffusers' transformer eager and compiled (bench/gpu_flux.sh)
# Each step's status is in OUT/summary.txt; the script goes on after a failed step.
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${1:?bundle folder}
OUT=${2:?output folder}
PHASES=${3:-build,test,bench}
[[ "$PHASES" == "--no-bench" ]] && PHASES=build,test
has() { [[ ",$PHASES," == *",$1,"* ]]; }
# PyTorch's CMake config needs nvcc; GPU images often have the toolkit off the PATH.
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH=/usr/local/cuda/bin:$PATH
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
touch "$SUMMARY"
step() {  # step NAME COMMAND...: runs it, logs to OUT/NAME.log, records the status
  local name=$1
  shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc, $((SECONDS - t0)) s" | tee -a "$SUMMARY"
  return $rc
}

has build && step device sh -c "nvidia-smi; c++ --version | head -1; cmake --version | head -1; nvcc --version | tail -2; $PYTHON -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'; nproc; command -v mpirun || echo 'no system mpirun'"
# What the checks need, not the whole project (a build of everything takes longer than a call).
TARGETS="xfuser-run xfuser xfuser_spm test_gpu test_two_plane test_nccl test_attention test_device bench_flux_gpu"
if has build; then
  step build env PYTHON="$PYTHON" TARGETS="$TARGETS" scripts/build-offline.sh "$BUNDLE" build-gpu \
    -DXFUSER_WITH_FFMPEG=OFF || exit 1
fi
[[ -f build-gpu/xfuser-env.sh ]] || { echo "gpu-check.sh: no build-gpu: run the build phase" >&2; exit 1; }
# shellcheck disable=SC1091
source build-gpu/xfuser-env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if has test; then
  # The short unit checks first, so that they report even if the gpu label runs long.
  step ctest-unit ctest --test-dir build-gpu -R '^(test_nccl|test_attention|test_device)$' \
    --output-on-failure -V
  step ctest-gpu ctest --test-dir build-gpu -L gpu --output-on-failure -V
  cp build-gpu/Testing/Temporary/LastTest.log "$OUT/LastTest.log" 2>/dev/null
fi
if has bench; then
  if "$PYTHON" -c 'import diffusers' 2>/dev/null; then
    step bench env PYTHON="$PYTHON" bench/gpu_flux.sh build-gpu "$OUT/gpu_flux.json"
  else
    step bench build-gpu/bin/bench_flux_gpu --device cuda --out "$OUT/bench_flux_gpu.json"
  fi
fi
cat "$SUMMARY"
