// The OpenAI-shaped request bodies of `xfuser serve`: fields read, types and ranges checked, and
// the error object of a refusal. No model is needed here: what only the model can check (sizes,
// frame counts, guidance it does not read) is checked by Runner::resolve_request afterwards.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "runner/serve/scheduler.h"

namespace xfuser::runner::serve {

enum class Endpoint { kImageGenerations, kImageEdits, kVideos };

struct ParsedRequest {
  JobInputs inputs;
  std::string model;                         // "" when the body names none
  std::string response_format = "b64_json";  // images: b64_json or url
  std::optional<double> seconds;             // videos: the duration asked for
};

// Reads `body` (a JSON object; multipart forms arrive as one with string values, and numbers are
// read from strings there) for `endpoint`. `max_n`: the most outputs one request may ask for.
// `default_fps`: the model's frame rate, turning `seconds` into frames. Returns the error to
// answer (status 400, naming the field) or nullopt with *out filled; seeds left out are drawn at
// random.
std::optional<ApiError> parse_request(const nlohmann::json& body, Endpoint endpoint, int max_n,
                                      int default_fps, bool from_form, ParsedRequest* out);

// OpenAI's error object: {"error": {"message", "type", "param", "code"}}.
nlohmann::json error_body(const ApiError& error);

// The extension of a picture's bytes by their magic number ("png", "jpg"), "" when neither.
std::string picture_extension(const std::string& bytes);

}  // namespace xfuser::runner::serve
