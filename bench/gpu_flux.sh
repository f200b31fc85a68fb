#!/usr/bin/env bash
# The FLUX.1-dev transformer on one GPU, xfuser against diffusers (eager and torch.compile), in
# one job: ms per step, s per 28-step image, MFU against the GEMM peak measured in the same run.
# Usage: bench/gpu_flux.sh BUILD_DIR OUT.json [extra flags for both programs, e.g. --dtype bf16]
#   PYTHON=...  the Python with torch and diffusers (default python3)
# Writes OUT.json: {"xfuser": {...}, "diffusers": {...}, "ratios": {...}}. Needs a GPU.
set -euo pipefail
BUILD=${1:?build dir}
OUT=${2:?output json}
shift 2
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$BUILD/bin/bench_flux_gpu" --device cuda --out "$tmp/xfuser.json" "$@"
"$PYTHON" "$HERE/flux_gpu_diffusers.py" --device cuda --compile --out "$tmp/diffusers.json" "$@"
"$PYTHON" - "$tmp/xfuser.json" "$tmp/diffusers.json" "$OUT" <<'PY'
import json, sys
x, d = (json.load(open(p)) for p in sys.argv[1:3])
eager, comp = d["eager"]["ms_per_step"], d.get("compiled", {}).get("ms_per_step")
r = {"diffusers_eager_over_xfuser": eager / x["ms_per_step"]}
if comp:
    r["diffusers_compiled_over_xfuser"] = comp / x["ms_per_step"]
json.dump({"xfuser": x, "diffusers": d, "ratios": r}, open(sys.argv[3], "w"), indent=2)
print(json.dumps(r))
PY
