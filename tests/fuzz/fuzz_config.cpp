// libFuzzer target: the JSON configs xfuser reads from a pipeline folder. One input is parsed
// as JSON and handed to every config reader (transformer config.json, scheduler_config.json,
// CLIP/T5 text encoder config.json, VAE config.json), and written as a sharded checkpoint's
// model.safetensors.index.json and as a pipeline's model_index.json and read back.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "models/flux/flux_config.h"
#include "models/schedulers/flow_match_euler.h"
#include "models/text_encoders/clip_text.h"
#include "models/text_encoders/t5_encoder.h"
#include "models/vae/autoencoder_kl.h"
#include "models/weights/checkpoint.h"
#include "models/weights/hub_cache.h"
#include "tests/fuzz/fuzz_common.h"

namespace fs = std::filesystem;
using xfuser::fuzz::expect_named_errors_only;

namespace {

const fs::path& scratch_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("xfuser-fuzz-config-" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace m = xfuser::models;
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json j;
  bool parsed = true;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    parsed = false;  // the readers wrap this into a named error (checked below through files)
  }
  if (parsed) {
    expect_named_errors_only([&] { m::flux::FluxConfig::from_json(j, "transformer/config.json"); });
    expect_named_errors_only([&] { m::schedulers::FlowMatchEulerConfig::from_json(j); });
    expect_named_errors_only(
        [&] { m::text_encoders::ClipTextConfig::from_json(j, "text_encoder/config.json"); });
    expect_named_errors_only([&] {
      m::text_encoders::T5EncoderConfig::from_json(j, "text_encoder_2/config.json", false);
    });
    expect_named_errors_only([&] {
      m::text_encoders::T5EncoderConfig::from_json(j, "text_encoder_2/config.json", true);
    });
    expect_named_errors_only([&] { m::vae::AutoencoderKLConfig::from_json(j, "vae/config.json"); });
  }
  // Through files: the readers' own JSON parsing and error wrapping.
  const fs::path dir = scratch_dir();
  {
    std::ofstream(dir / "scheduler_config.json", std::ios::binary) << text;
    expect_named_errors_only(
        [&] { m::schedulers::FlowMatchEulerConfig::from_file(dir / "scheduler_config.json"); });
  }
  {
    std::ofstream(dir / "model.safetensors.index.json", std::ios::binary) << text;
    expect_named_errors_only(
        [&] { m::ShardedCheckpoint((dir / "model.safetensors.index.json").string()); });
  }
  {
    std::ofstream(dir / "model_index.json", std::ios::binary) << text;
    expect_named_errors_only([&] { m::read_model_index(dir); });
  }
  return 0;
}
