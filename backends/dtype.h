// The compute dtype's names on the command line and in reports: fp32, bf16, fp16 (--dtype of
// xfuser-run, xfuser forward and the benchmarks; "dtype" in timings.json and bench JSON).
#pragma once

#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace xfuser::backends {

// fp32 -> kFloat, bf16 -> kBFloat16, fp16 -> kHalf. Anything else is an xfuser::Error naming
// `flag` and the value: "--dtype must be fp32, bf16 or fp16, got 'x'".
c10::ScalarType parse_dtype(const std::string& name, const std::string& flag = "--dtype");

// The inverse of parse_dtype; other dtypes by libtorch's name ("Double", "Int", ...).
std::string dtype_name(c10::ScalarType dtype);

// Whether this CPU multiplies bf16 in hardware (x86: the avx512_bf16 or amx_bf16 flag of
// /proc/cpuinfo). Without it libtorch emulates bf16 GEMMs and convolutions, several times slower
// than float32 (measured 8x for a [2304, 512] x [512, 2048] linear on an AVX2 EPYC). Read once.
bool cpu_has_native_bf16();

// Whether a GEMM or convolution on `x` should run in float32 on the widened operands, its result
// rounded once to x's dtype: CPU tensors in fp16 (libtorch has few CPU fp16 kernels), or in bf16
// on a CPU without native bf16. Widening is exact, and a bf16 product is a float32 product of
// the same values accumulated in float32, so this is the same math at float32 speed; only the
// order of the float32 sums may differ from the emulated kernel's.
bool widen_cpu_products(const at::Tensor& x);

}  // namespace xfuser::backends
