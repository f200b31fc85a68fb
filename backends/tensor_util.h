// Small tensor helpers shared by every layer (error messages).
#pragma once

#include <string>

#include <c10/util/ArrayRef.h>

namespace xfuser {

// "[2, 3, 4]": a shape as error messages print it.
std::string shape_string(c10::IntArrayRef shape);

}  // namespace xfuser
