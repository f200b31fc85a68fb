#!/usr/bin/env bash
# scripts/fuzz.sh TARGET SECONDS: builds the libFuzzer target fuzz_TARGET (clang-14, ASan + UBSan,
# build folder build-fuzz/, or $XFUSER_FUZZ_BUILD) and runs it for SECONDS on its seed corpus.
#   TARGET: safetensors | config | image | clip_tokenizer | clip_files | t5_tokenizer | dataset | all (each for SECONDS)
# Seeds: tests/fuzz/corpus/TARGET (small, in the repository). Inputs the fuzzer finds go to
# <build>/fuzz-corpus/TARGET, crashes to <build>/fuzz-artifacts/TARGET/ (reproduce with
# `<build>/bin/fuzz_TARGET <file>`). On the shared machine run it inside a build slot:
#   xf-build scripts/fuzz.sh config 300
# Exit status: 0 when the run ended without a finding, non-zero otherwise.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 safetensors|config|image|clip_tokenizer|clip_files|t5_tokenizer|dataset|all SECONDS" >&2
  exit 2
fi
target=$1
seconds=$2
root=$(cd "$(dirname "$0")/.." && pwd)
build=${XFUSER_FUZZ_BUILD:-$root/build-fuzz}
all=(safetensors config image clip_tokenizer clip_files t5_tokenizer dataset)
if [ "$target" = all ]; then
  targets=("${all[@]}")
else
  case " ${all[*]} " in
    *" $target "*) targets=("$target") ;;
    *) echo "unknown fuzz target '$target' (expected one of: ${all[*]} all)" >&2; exit 2 ;;
  esac
fi

if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DXFUSER_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER=clang++-14 >/dev/null
fi
ninja -C "$build" -j2 $(printf 'fuzz_%s ' "${targets[@]}")

# Leaks: libtorch and ICU keep process-lifetime caches that LeakSanitizer would report.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OMP_NUM_THREADS=1
status=0
for t in "${targets[@]}"; do
  corpus=$build/fuzz-corpus/$t
  artifacts=$build/fuzz-artifacts/$t
  mkdir -p "$corpus" "$artifacts"
  echo "== fuzz_$t for ${seconds}s (corpus $corpus, seeds tests/fuzz/corpus/$t)"
  if ! "$build/bin/fuzz_$t" -max_total_time="$seconds" -print_final_stats=1 -timeout=25 \
      -rss_limit_mb=4096 -max_len=65536 -artifact_prefix="$artifacts/" \
      "$corpus" "$root/tests/fuzz/corpus/$t"; then
    echo "fuzz_$t: finding saved in $artifacts" >&2
    status=1
  fi
done
exit $status
