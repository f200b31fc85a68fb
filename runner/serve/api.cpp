#include "runner/serve/api.h"

#include <cmath>
#include <limits>
#include <random>
#include <set>

namespace xfuser::runner::serve {
namespace {

ApiError bad(const std::string& param, const std::string& message) {
  return make_error(400, message, "invalid_request_error", param);
}

// A form's values are strings: numbers are parsed from them, whole strings only.
std::optional<nlohmann::json> as_number(const nlohmann::json& value, bool from_form) {
  if (value.is_number()) return value;
  if (!from_form || !value.is_string()) return std::nullopt;
  const std::string text = value.get<std::string>();
  try {
    size_t used = 0;
    if (text.find_first_of(".eE") == std::string::npos) {
      const long long v = std::stoll(text, &used);
      if (used == text.size()) return nlohmann::json(v);
    } else {
      const double v = std::stod(text, &used);
      if (used == text.size()) return nlohmann::json(v);
    }
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

}  // namespace

nlohmann::json error_body(const ApiError& error) {
  nlohmann::json e = {{"message", error.message}, {"type", error.type}};
  e["param"] = error.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(error.param);
  e["code"] = error.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(error.code);
  return {{"error", e}};
}

std::optional<ApiError> parse_request(const nlohmann::json& body, Endpoint endpoint, int max_n,
                                      int default_fps, bool from_form, ParsedRequest* out) {
  if (!body.is_object()) return bad("", "the request body must be a JSON object");
  const bool video = endpoint == Endpoint::kVideos;
  std::set<std::string> known = {"prompt",
                                 "model",
                                 "seed",
                                 "size",
                                 "negative_prompt",
                                 "num_inference_steps",
                                 "guidance_scale",
                                 "true_cfg_scale",
                                 "max_sequence_length",
                                 "lora_scales",
                                 "user"};
  if (video) {
    known.insert({"seconds", "num_frames", "fps", "guidance_scale_2"});
  } else {
    known.insert({"n", "response_format", "output_format"});
  }
  // OpenAI fields that would change the picture in ways these models have no knob for.
  static const std::set<std::string> unsupported = {
      "quality", "style",          "background", "moderation",    "output_compression",
      "mask",    "partial_images", "stream",     "input_fidelity"};
  for (const auto& [key, value] : body.items()) {
    if (known.count(key)) continue;
    if (unsupported.count(key)) {
      return bad(key, "'" + key + "' is not supported by xfuser serve");
    }
    return bad(key, "unknown field '" + key + "'");
  }
  ParsedRequest r;
  auto text = [&](const char* name, bool required, std::string* to) -> std::optional<ApiError> {
    if (!body.contains(name) || body[name].is_null()) {
      if (required) return bad(name, std::string("'") + name + "' is required");
      return std::nullopt;
    }
    if (!body[name].is_string()) return bad(name, std::string("'") + name + "' must be a string");
    *to = body[name].get<std::string>();
    return std::nullopt;
  };
  auto integer = [&](const char* name, long long lo, long long hi,
                     std::optional<long long>* to) -> std::optional<ApiError> {
    if (!body.contains(name) || body[name].is_null()) return std::nullopt;
    const auto v = as_number(body[name], from_form);
    const std::string range = " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (!v || !(v->is_number_integer() || v->is_number_unsigned())) {
      return bad(name, std::string("'") + name + "' must be an integer" + range);
    }
    if (v->is_number_unsigned() &&
        v->get<unsigned long long>() >
            static_cast<unsigned long long>(std::numeric_limits<long long>::max())) {
      return bad(name, std::string("'") + name + "' must be an integer" + range);
    }
    const long long x = v->get<long long>();
    if (x < lo || x > hi) {
      return bad(name,
                 std::string("'") + name + "' is " + std::to_string(x) + "; expected" + range);
    }
    *to = x;
    return std::nullopt;
  };
  auto number = [&](const char* name, std::optional<double>* to) -> std::optional<ApiError> {
    if (!body.contains(name) || body[name].is_null()) return std::nullopt;
    const auto v = as_number(body[name], from_form);
    if (!v || !std::isfinite(v->get<double>())) {
      return bad(name, std::string("'") + name + "' must be a finite number");
    }
    *to = v->get<double>();
    return std::nullopt;
  };
  JobInputs& in = r.inputs;
  if (auto e = text("prompt", true, &in.prompt)) return e;
  if (in.prompt.empty()) return bad("prompt", "'prompt' is empty");
  if (auto e = text("model", false, &r.model)) return e;
  std::string negative;
  if (auto e = text("negative_prompt", false, &negative)) return e;
  if (body.contains("negative_prompt") && !body["negative_prompt"].is_null()) {
    in.negative_prompt = negative;
  }
  std::string user;
  if (auto e = text("user", false, &user)) return e;
  std::optional<long long> v;
  if (auto e = integer("seed", std::numeric_limits<long long>::min(),
                       std::numeric_limits<long long>::max(), &v)) {
    return e;
  }
  if (v) {
    in.seed = *v;
  } else {
    // As diffusers without a generator: a new picture each time (the seed is returned).
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    in.seed = static_cast<int64_t>(rng() >> 1);
  }
  v.reset();
  if (!video) {
    if (auto e = integer("n", 1, max_n, &v)) return e;
    if (v) in.n = static_cast<int>(*v);
    v.reset();
    std::string format = "b64_json";
    if (auto e = text("response_format", false, &format)) return e;
    if (format != "b64_json" && format != "url") {
      return bad("response_format",
                 "'response_format' is '" + format + "'; expected 'b64_json' or 'url'");
    }
    r.response_format = format;
    std::string output_format = "png";
    if (auto e = text("output_format", false, &output_format)) return e;
    if (output_format != "png") {
      return bad("output_format", "'output_format' is '" + output_format + "'; expected 'png'");
    }
  }
  std::string size;
  if (auto e = text("size", false, &size)) return e;
  if (!size.empty() && size != "auto") {
    int w = 0, h = 0;
    char x = 0, rest = 0;
    if (std::sscanf(size.c_str(), "%d%c%d%c", &w, &x, &h, &rest) != 3 || x != 'x' || w <= 0 ||
        h <= 0) {
      return bad("size",
                 "'size' is '" + size + "'; expected WIDTHxHEIGHT (e.g. 1024x1024) or auto");
    }
    in.width = w;
    in.height = h;
  }
  if (auto e = integer("num_inference_steps", 1, 10000, &v)) return e;
  if (v) in.num_inference_steps = static_cast<int>(*v);
  v.reset();
  if (auto e = integer("max_sequence_length", 1, 65536, &v)) return e;
  if (v) in.max_sequence_length = static_cast<int>(*v);
  v.reset();
  if (body.contains("lora_scales") && !body["lora_scales"].is_null()) {
    nlohmann::json scales = body["lora_scales"];
    if (from_form && scales.is_string()) {
      scales =
          nlohmann::json::parse(scales.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    }
    if (!scales.is_object()) {
      return bad("lora_scales", "'lora_scales' must be an object of adapter name -> scale");
    }
    for (const auto& [name, value] : scales.items()) {
      if (!value.is_number() || !std::isfinite(value.get<double>())) {
        return bad("lora_scales",
                   "'lora_scales' of adapter '" + name + "' must be a finite number");
      }
      in.lora_scales[name] = value.get<double>();
    }
  }
  if (auto e = number("guidance_scale", &in.guidance_scale)) return e;
  if (auto e = number("true_cfg_scale", &in.true_cfg_scale)) return e;
  if (video) {
    if (auto e = number("guidance_scale_2", &in.guidance_scale_2)) return e;
    if (auto e = integer("fps", 1, 1000, &v)) return e;
    if (v) in.fps = static_cast<int>(*v);
    v.reset();
    if (auto e = integer("num_frames", 1, 4096, &v)) return e;
    if (v) in.num_frames = static_cast<int>(*v);
    v.reset();
    // OpenAI sends seconds as a string ("4"); a number is read too.
    if (body.contains("seconds") && !body["seconds"].is_null()) {
      const auto s = as_number(body["seconds"], /*from_form=*/true);
      if (!s || !std::isfinite(s->get<double>()) || s->get<double>() <= 0) {
        return bad("seconds", "'seconds' must be a positive number (e.g. \"4\")");
      }
      if (in.num_frames) {
        return bad("seconds", "'seconds' and 'num_frames' both set the length: give one");
      }
      r.seconds = s->get<double>();
      // frames = seconds x fps + 1 (the first frame, then fps frames per second).
      const int fps = in.fps.value_or(default_fps);
      const double frames = *r.seconds * fps + 1;
      if (frames > 4096) return bad("seconds", "'seconds' asks for more than 4096 frames");
      in.num_frames = static_cast<int>(std::lround(frames));
    }
  }
  *out = std::move(r);
  return std::nullopt;
}

std::string picture_extension(const std::string& bytes) {
  if (bytes.size() >= 8 && bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0) return "png";
  if (bytes.size() >= 3 && static_cast<uint8_t>(bytes[0]) == 0xFF &&
      static_cast<uint8_t>(bytes[1]) == 0xD8 && static_cast<uint8_t>(bytes[2]) == 0xFF) {
    return "jpg";
  }
  return "";
}

}  // namespace xfuser::runner::serve
