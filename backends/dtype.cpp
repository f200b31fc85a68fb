#include "backends/dtype.h"

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

}  // namespace xfuser::backends
