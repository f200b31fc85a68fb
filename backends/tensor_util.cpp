#include "backends/tensor_util.h"

#include <sstream>

namespace xfuser {

std::string shape_string(c10::IntArrayRef shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

}  // namespace xfuser
