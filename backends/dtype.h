// The compute dtype's names on the command line and in reports: fp32, bf16, fp16 (--dtype of
// xfuser-run, xfuser forward and the benchmarks; "dtype" in timings.json and bench JSON).
#pragma once

#include <string>

#include <c10/core/ScalarType.h>

namespace xfuser::backends {

// fp32 -> kFloat, bf16 -> kBFloat16, fp16 -> kHalf. Anything else is an xfuser::Error naming
// `flag` and the value: "--dtype must be fp32, bf16 or fp16, got 'x'".
c10::ScalarType parse_dtype(const std::string& name, const std::string& flag = "--dtype");

// The inverse of parse_dtype; other dtypes by libtorch's name ("Double", "Int", ...).
std::string dtype_name(c10::ScalarType dtype);

}  // namespace xfuser::backends
