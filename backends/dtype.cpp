#include "backends/dtype.h"

#include <fstream>
#include <string>

#include "backends/error.h"

namespace xfuser::backends {

c10::ScalarType parse_dtype(const std::string& name, const std::string& flag) {
  if (name == "fp32") return c10::kFloat;
  if (name == "bf16") return c10::kBFloat16;
  if (name == "fp16") return c10::kHalf;
  XF_THROW(flag, " must be fp32, bf16 or fp16, got '", name, "'");
}

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat:
      return "fp32";
    case c10::kBFloat16:
      return "bf16";
    case c10::kHalf:
      return "fp16";
    default:
      return c10::toString(dtype);
  }
}

bool cpu_has_native_bf16() {
  static const bool native = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      // x86 "flags", aarch64 "Features" (bf16: the BFDOT / BFMMLA instructions).
      if (line.rfind("flags", 0) == 0) {
        return line.find(" avx512_bf16") != std::string::npos ||
               line.find(" amx_bf16") != std::string::npos;
      }
      if (line.rfind("Features", 0) == 0) return (line + " ").find(" bf16 ") != std::string::npos;
    }
    return false;
  }();
  return native;
}

bool widen_cpu_products(const at::Tensor& x) {
  if (!x.device().is_cpu()) return false;
  return x.scalar_type() == at::kHalf ||
         (x.scalar_type() == at::kBFloat16 && !cpu_has_native_bf16());
}

}  // namespace xfuser::backends
