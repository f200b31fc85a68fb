// Base64 (RFC 4648's standard alphabet): tiktoken vocabularies are read with it and the HTTP
// service's b64_json pictures are written with it.
#pragma once

#include <string>

namespace xfuser::backends {

// Encodes with '=' padding.
std::string base64_encode(const std::string& bytes);

// Decodes up to the first '=' (padding optional); any other character outside the alphabet is an
// xfuser::Error naming `context` and the character.
std::string base64_decode(const std::string& text, const std::string& context);

}  // namespace xfuser::backends
