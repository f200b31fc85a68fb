// FP8 weights: the codec against an independent oracle (and libtorch's own conversion where it has
// fp8 dtypes), the two weight formats on a Linear layer, the FP8 GEMM against its definition, and
// fp8 storage of every family's transformer against diffusers' enable_layerwise_casting.
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <set>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "backends/fp8.h"
#include "models/common/layers.h"
#include "models/dit/dit_parallel.h"
#include "models/registry.h"
#include "models/weights/safetensors.h"
#include "models/xfuser_model.h"
#include "test_util.h"
#include "tests/checked_device.h"

namespace {

using xfuser::backends::Fp8Format;
using xfuser::models::WeightFormat;
namespace fs = std::filesystem;

float float_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The rounding PyTorch documents for .to(float8_*), found by search: the nearest of the 256
// codes' values (plus the overflow code, at the value the next binade would start with), ties to
// the code with an even last bit; beyond the overflow value, the overflow code. e4m3fn overflows
// to NaN (0x7f) at 480, e5m2 to infinity (0x7c) at 65536; NaN inputs give NaN.
uint8_t oracle(float x, Fp8Format format) {
  const bool e4m3 = format == Fp8Format::kE4M3FN;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<uint8_t>(0x7f | sign);
  const double a = std::fabs(static_cast<double>(x));
  const double overflow_value = e4m3 ? 480.0 : 65536.0;
  const uint8_t overflow_code = e4m3 ? 0x7f : 0x7c;
  if (a >= overflow_value) return static_cast<uint8_t>(overflow_code | sign);
  int best = -1;
  double best_err = std::numeric_limits<double>::infinity();
  auto consider = [&](int code, double value) {
    const double err = std::fabs(value - a);
    if (err < best_err || (err == best_err && (code & 1) == 0)) {
      best = code;
      best_err = err;
    }
  };
  for (int code = 0; code < 0x80; ++code) {
    const float v = xfuser::backends::fp8_decode(static_cast<uint8_t>(code), format);
    if (std::isfinite(v)) consider(code, v);
  }
  consider(overflow_code, overflow_value);
  return static_cast<uint8_t>(best | sign);
}

// Every bfloat16 value (as float32) and a spread of float32 values with ties and subnormals.
std::vector<float> probe_values() {
  std::vector<float> out;
  for (uint32_t b = 0; b < 65536; ++b) out.push_back(float_from_bits(b << 16));
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 20000; ++i) out.push_back(float_from_bits(bits(gen)));
  for (Fp8Format f : {Fp8Format::kE4M3FN, Fp8Format::kE5M2}) {
    // Exact midpoints between neighbouring codes (the ties).
    for (int code = 0; code + 1 < 0x80; ++code) {
      const double lo = xfuser::backends::fp8_decode(static_cast<uint8_t>(code), f);
      const double hi = xfuser::backends::fp8_decode(static_cast<uint8_t>(code + 1), f);
      if (std::isfinite(lo) && std::isfinite(hi)) out.push_back(static_cast<float>((lo + hi) / 2));
    }
  }
  out.push_back(std::numeric_limits<float>::infinity());
  out.push_back(-std::numeric_limits<float>::infinity());
  out.push_back(std::numeric_limits<float>::quiet_NaN());
  for (float v : {448.0f, 464.0f, 470.0f, 479.9f, 480.0f, 57344.0f, 61440.0f, 65535.0f}) {
    out.push_back(v);
    out.push_back(-v);
  }
  return out;
}

// Beyond the format's range: above the tie between the largest value and the overflow value
// (464 for e4m3fn, 61440 for e5m2), and infinities and NaN.
bool overflows(float x, Fp8Format format) {
  const double a = std::fabs(static_cast<double>(x));
  if (!std::isfinite(x)) return true;
  return format == Fp8Format::kE4M3FN ? a > 464.0 : a >= 61440.0;
}

// What a libtorch may give there: PyTorch's scalar rule (NaN for e4m3fn, infinity for e5m2, as
// libtorch 2.11 does) or saturation to the largest finite value of the same sign (libtorch 2.15's
// CPU kernel gives 448 for 466); NaN stays NaN.
bool native_overflow_ok(float x, float got, Fp8Format format) {
  if (std::isnan(x)) return std::isnan(got);
  const float max = static_cast<float>(xfuser::backends::fp8_max(format));
  const bool overflow = format == Fp8Format::kE4M3FN
                            ? std::isnan(got)
                            : std::isinf(got) && std::signbit(got) == std::signbit(x);
  return overflow || got == (std::signbit(x) ? -max : max);
}

TEST(Fp8Codec, EncodeMatchesTheRoundingOracle) {
  const auto values = probe_values();
  for (Fp8Format f : {Fp8Format::kE4M3FN, Fp8Format::kE5M2}) {
    int wrong = 0;
    for (float v : values) {
      const uint8_t got = xfuser::backends::fp8_encode(v, f);
      const uint8_t want = oracle(v, f);
      if (got != want && wrong++ < 10) {
        ADD_FAILURE() << xfuser::backends::fp8_format_name(f) << " of " << v << " ("
                      << std::hexfloat << v << std::defaultfloat << "): got 0x" << std::hex
                      << int(got) << ", want 0x" << int(want);
      }
    }
    EXPECT_EQ(wrong, 0) << xfuser::backends::fp8_format_name(f);
  }
  EXPECT_EQ(xfuser::backends::fp8_encode(448.0f, Fp8Format::kE4M3FN), 0x7e);
  EXPECT_EQ(xfuser::backends::fp8_encode(464.0f, Fp8Format::kE4M3FN), 0x7e);  // tie: even
  EXPECT_EQ(xfuser::backends::fp8_encode(470.0f, Fp8Format::kE4M3FN), 0x7f);  // NaN
  EXPECT_EQ(xfuser::backends::fp8_encode(61440.0f, Fp8Format::kE5M2), 0x7c);  // inf
}

TEST(Fp8Codec, DecodeIsTheInverseOfEncode) {
  for (Fp8Format f : {Fp8Format::kE4M3FN, Fp8Format::kE5M2}) {
    for (int code = 0; code < 256; ++code) {
      const float v = xfuser::backends::fp8_decode(static_cast<uint8_t>(code), f);
      if (std::isnan(v)) continue;
      EXPECT_EQ(xfuser::backends::fp8_encode(v, f), code)
          << xfuser::backends::fp8_format_name(f) << " code " << code;
    }
  }
}

TEST(Fp8Codec, TensorsRoundTripOnEveryLibtorch) {
  const auto values = probe_values();
  const at::Tensor x = at::from_blob(const_cast<float*>(values.data()),
                                     {static_cast<int64_t>(values.size())}, at::kFloat)
                           .clone();
  for (Fp8Format f : {Fp8Format::kE4M3FN, Fp8Format::kE5M2}) {
    const at::Tensor q = xfuser::backends::to_fp8(x, f);
    EXPECT_EQ(q.element_size(), 1);
    const at::Tensor back = xfuser::backends::from_fp8(q, f, at::kFloat);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float want = xfuser::backends::fp8_decode(oracle(values[i], f), f);
      const float got = back[i].item<float>();
      if (overflows(values[i], f) && native_overflow_ok(values[i], got, f)) continue;
      if (!(got == want || (std::isnan(got) && std::isnan(want)))) {
        ADD_FAILURE() << xfuser::backends::fp8_format_name(f) << " of " << values[i] << ": got "
                      << got << ", want " << want;
        break;
      }
    }
    // bf16 in, bf16 out: the same values.
    const at::Tensor b = xfuser::backends::from_fp8(
        xfuser::backends::to_fp8(x.to(at::kBFloat16), f), f, at::kBFloat16);
    EXPECT_EQ(b.scalar_type(), at::kBFloat16);
  }
#if XFUSER_TORCH_MAJOR > 2 || (XFUSER_TORCH_MAJOR == 2 && XFUSER_TORCH_MINOR >= 1)
  // libtorch's own conversion agrees bit for bit with the scalar codec within the format's range;
  // beyond it libtorch versions differ (overflow, or saturation to the largest value).
  EXPECT_TRUE(xfuser::backends::native_fp8());
  for (Fp8Format f : {Fp8Format::kE4M3FN, Fp8Format::kE5M2}) {
    const at::Tensor native = xfuser::backends::to_fp8(x, f).view(at::kByte);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const uint8_t code = native[i].item<uint8_t>();
      if (overflows(values[i], f)) {
        EXPECT_TRUE(native_overflow_ok(values[i], xfuser::backends::fp8_decode(code, f), f))
            << values[i] << " -> 0x" << std::hex << int(code);
        continue;
      }
      ASSERT_EQ(code, xfuser::backends::fp8_encode(values[i], f)) << values[i];
    }
  }
#else
  EXPECT_FALSE(xfuser::backends::native_fp8());
#endif
}

TEST(Fp8Codec, FormatNamesAreChecked) {
  EXPECT_EQ(xfuser::backends::parse_fp8_format("float8_e4m3fn", "--fp8_storage"),
            Fp8Format::kE4M3FN);
  EXPECT_EQ(xfuser::backends::parse_fp8_format("e5m2", "--fp8_storage"), Fp8Format::kE5M2);
  xfuser::testing::expect_error_containing(
      [] { xfuser::backends::parse_fp8_format("fp8", "--fp8_storage"); },
      {"--fp8_storage", "float8_e4m3fn", "'fp8'"});
}

// ---- the weight formats on a Linear layer ------------------------------------------------------

TEST(Fp8Weights, StorageHoldsOneByteAndDecodesToTheRoundedWeights) {
  xfuser::models::Linear layer(64, 48);
  layer.init_random(3, 0.05);
  const at::Tensor w = layer.weight().clone(), b = layer.bias().clone();
  const int64_t before = layer.parameter_bytes();
  WeightFormat storage;
  storage.kind = WeightFormat::Kind::kFp8Storage;
  EXPECT_EQ(layer.apply_weight_format(storage), 2);  // weight and bias
  EXPECT_EQ(layer.parameter_bytes() * 4, before);
  const at::Tensor want_w = xfuser::backends::from_fp8(
      xfuser::backends::to_fp8(w, Fp8Format::kE4M3FN), Fp8Format::kE4M3FN, at::kFloat);
  EXPECT_TRUE(at::equal(layer.weight(), want_w));
  EXPECT_EQ(layer.dtype(), at::kFloat);
  const at::Tensor x = at::randn({5, 64});
  const at::Tensor want_b = xfuser::backends::from_fp8(
      xfuser::backends::to_fp8(b, Fp8Format::kE4M3FN), Fp8Format::kE4M3FN, at::kFloat);
  EXPECT_TRUE(at::allclose(layer.forward(x), at::linear(x, want_w, want_b), 1e-6, 1e-6));
  // Not against the whole layer: weights that already moved are not converted twice.
  EXPECT_EQ(layer.apply_weight_format(storage), 0);
}

TEST(Fp8Weights, ScaledWeightsAndTheFp8GemmFollowTheirDefinition) {
  xfuser::models::Linear layer(96, 32);
  layer.init_random(5, 0.05);
  at::Tensor w = layer.weight().clone();
  w[7].zero_();  // an all-zero row stays zero
  layer.named_parameters()[0].second->tensor.copy_(w);
  const at::Tensor b = layer.bias().clone();
  WeightFormat scaled;
  scaled.kind = WeightFormat::Kind::kFp8Scaled;
  EXPECT_EQ(layer.apply_weight_format(scaled), 1);  // the weight only; the bias stays
  const auto* slot = layer.named_parameters()[0].second;
  ASSERT_TRUE(slot->fp8.has_value());
  EXPECT_EQ(slot->fp8->scale.sizes(), (at::IntArrayRef{32, 1}));
  const at::Tensor amax = w.abs().amax({1}, true);
  EXPECT_TRUE(at::allclose(slot->fp8->scale.narrow(0, 0, 7), amax.narrow(0, 0, 7) / 448.0));
  // Each row's largest weight maps to the format's largest value.
  const at::Tensor codes =
      xfuser::backends::from_fp8(slot->fp8->data, Fp8Format::kE4M3FN, at::kFloat);
  EXPECT_EQ(codes.abs().amax({1}).narrow(0, 0, 7).min().item<float>(), 448.0f);
  EXPECT_EQ(codes[7].abs().max().item<float>(), 0.0f);
  // The GEMM, from its definition in double: x quantized per row, W per output channel.
  const at::Tensor x = at::randn({2, 3, 96}) * 3;
  const at::Tensor xf = x.reshape({-1, 96}).to(at::kDouble);
  const at::Tensor sx = (xf.abs().amax({1}, true) / 448.0).clamp_min(1e-12);
  const at::Tensor xq = xfuser::backends::from_fp8(
                            xfuser::backends::to_fp8((xf / sx).to(at::kFloat), Fp8Format::kE4M3FN),
                            Fp8Format::kE4M3FN, at::kDouble) *
                        sx;
  const at::Tensor wq = codes.to(at::kDouble) * slot->fp8->scale.to(at::kDouble);
  const at::Tensor want = at::linear(xq, wq, b.to(at::kDouble)).reshape({2, 3, 32});
  const at::Tensor got = layer.forward(x);
  EXPECT_EQ(got.scalar_type(), at::kFloat);
  EXPECT_LE(xfuser::testing::max_rel_error(got.to(at::kDouble), want), 1e-5);
  // ... and within FP8's error of the float32 layer.
  const at::Tensor exact = at::linear(x, w, b);
  const double rel = ((got - exact).norm() / exact.norm()).item<double>();
  EXPECT_LT(rel, 0.08);
  EXPECT_GT(rel, 0.0);
  EXPECT_EQ(xfuser::backends::fp8_linear_path(c10::Device(c10::kCPU), Fp8Format::kE4M3FN,
                                              at::kBFloat16, 96, 32),
            "emulated");
  // bf16 compute returns bf16.
  EXPECT_EQ(layer.forward(x.to(at::kBFloat16)).scalar_type(), at::kBFloat16);
}

// ---- every family's transformer against diffusers' layerwise casting ---------------------------

const fs::path kCasting =
    xfuser::testing::fixtures_dir() / "diffusers-v0.42.1" / "layerwise-casting";

// (pipeline, storage dtype) cases written by tests/fixtures/generate.py's gen_layerwise_casting.
const std::vector<std::pair<std::string, std::string>> kCases = {
    {"flux-tiny", "float8_e4m3fn"},          {"flux-tiny", "float8_e5m2"},
    {"flux2-tiny", "float8_e4m3fn"},         {"sd3-tiny", "float8_e4m3fn"},
    {"wan-t2v-tiny", "float8_e4m3fn"},       {"wan22-t2v-tiny", "float8_e4m3fn"},
    {"hunyuan-video-tiny", "float8_e4m3fn"}, {"hunyuan_video15-tiny", "float8_e4m3fn"},
};

WeightFormat storage_format(const std::string& dtype) {
  WeightFormat f;
  f.kind = WeightFormat::Kind::kFp8Storage;
  f.format = xfuser::backends::parse_fp8_format(dtype, "storage dtype");
  return f;
}

TEST(Fp8Storage, CastsTheParametersDiffusersCasts) {
  for (const auto& [name, dtype] : kCases) {
    SCOPED_TRACE(name + " " + dtype);
    const fs::path refs = kCasting / (name + "-" + dtype);
    XF_REQUIRE_FIXTURE(refs / "cast.json");
    std::ifstream in(refs / "cast.json");
    const auto cast = nlohmann::json::parse(in);
    for (const auto& [component, names] : cast.items()) {
      const fs::path dir = xfuser::testing::fixtures_dir() / "pipelines" / name / component;
      auto model = xfuser::models::dit::load_dit_transformer(
          dir.string(), at::kFloat, nullptr, {}, "", c10::Device(c10::kCPU), storage_format(dtype));
      std::set<std::string> got, want(names.begin(), names.end());
      for (const auto& [param, slot] : model->named_parameters()) {
        if (slot->fp8) got.insert(param);
      }
      EXPECT_EQ(got, want) << component;
      EXPECT_FALSE(want.empty());
    }
  }
}

TEST(Fp8Storage, EveryFamilyEqualsDiffusersLayerwiseCasting) {
  for (const auto& [name, dtype] : kCases) {
    SCOPED_TRACE(name + " " + dtype);
    // The folder as diffusers 0.42.1 reads it (its scheduler defaults included).
    xfuser::testing::TempDir tmp("xfuser-fp8");
    const fs::path folder = xfuser::testing::resaved_pipeline(name, "0.42.1", tmp.path());
    xfuser::testing::check_pipeline(name, folder, c10::Device(c10::kCPU),
                                    kCasting / (name + "-" + dtype), storage_format(dtype));
  }
}

TEST(Fp8Gemms, QuantizeTheLinearWeightsInsideTheBlocksOnly) {
  const fs::path dir = xfuser::testing::fixtures_dir() / "pipelines" / "flux-tiny" / "transformer";
  XF_REQUIRE_FIXTURE(dir);
  WeightFormat scaled;
  scaled.kind = WeightFormat::Kind::kFp8Scaled;
  auto model = xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, nullptr, {}, "",
                                                         c10::Device(c10::kCPU), scaled);
  int quantized = 0;
  for (const auto& [param, slot] : model->named_parameters()) {
    const bool in_blocks = param.rfind("transformer_blocks.", 0) == 0 ||
                           param.rfind("single_transformer_blocks.", 0) == 0;
    if (slot->fp8) {
      ++quantized;
      EXPECT_TRUE(in_blocks) << param;
      EXPECT_EQ(slot->shape.size(), 2u) << param;
      EXPECT_TRUE(slot->fp8->scale.defined()) << param;
    } else if (in_blocks && slot->layer == xfuser::models::LayerKind::kLinear &&
               slot->shape.size() == 2) {
      ADD_FAILURE() << "a Linear weight in a block kept its dtype: " << param;
    }
  }
  EXPECT_GT(quantized, 0);
}

}  // namespace

// ---- pre-quantized checkpoints -----------------------------------------------------------------

namespace {

// flux-tiny as diffusers 0.42.1 saves it (its T5 tokenizer as tokenizer.json: the sanitizer
// build runs this test without SentencePiece) with the fp8r transformer (gen_bfl_fp8r) laid over
// it, under `into`.
fs::path fp8r_flux(const fs::path& into) {
  const fs::path fixture = kCasting.parent_path() / "bfl-fp8r" / "flux-tiny" / "transformer";
  const fs::path folder = xfuser::testing::resaved_pipeline("flux-tiny", "0.42.1", into);
  fs::remove_all(folder / "transformer");
  fs::copy(fixture, folder / "transformer", fs::copy_options::recursive);
  return folder;
}

}  // namespace

TEST(Fp8Checkpoint, PerRowScaledWeightsEqualDiffusersBflFp8r) {
  const fs::path refs = kCasting.parent_path() / "bfl-fp8r" / "flux-tiny.ref";
  XF_REQUIRE_FIXTURE(refs);
  xfuser::testing::TempDir tmp("xfuser-fp8r");
  const fs::path folder = fp8r_flux(tmp.path());
  // As loaded: weight * weight_scale per row, the model diffusers' BFLFP8RLinear runs on the CPU.
  xfuser::testing::check_pipeline("flux-tiny", folder, c10::Device(c10::kCPU), refs);
}

TEST(Fp8Checkpoint, Fp8GemmsKeepTheStoredCodesAndScales) {
  xfuser::testing::TempDir tmp("xfuser-fp8r");
  const fs::path dir = fp8r_flux(tmp.path()) / "transformer";
  WeightFormat scaled;
  scaled.kind = WeightFormat::Kind::kFp8Scaled;
  auto model = xfuser::models::dit::load_dit_transformer(dir.string(), at::kBFloat16, nullptr, {},
                                                         "", c10::Device(c10::kCPU), scaled);
  const xfuser::models::SafetensorsFile file(
      (dir / "diffusion_pytorch_model.safetensors").string());
  int kept = 0;
  for (const auto& [name, slot] : model->named_parameters()) {
    if (!file.contains(name + "_scale")) continue;
    ASSERT_TRUE(slot->fp8.has_value()) << name;
    EXPECT_TRUE(
        at::equal(xfuser::backends::from_fp8(slot->fp8->data, Fp8Format::kE4M3FN, at::kFloat),
                  file.get(name).to(at::kFloat)))
        << name;
    EXPECT_TRUE(at::equal(slot->fp8->scale.flatten(), file.get(name + "_scale").to(at::kFloat)))
        << name;
    EXPECT_EQ(slot->fp8->dtype, at::kBFloat16);
    ++kept;
  }
  EXPECT_EQ(kept, 20);
}

TEST(Fp8Checkpoint, OtherQuantizationMethodsAndBadScalesAreClearErrors) {
  xfuser::testing::TempDir tmp("xfuser-fp8r");
  const fs::path dir = fp8r_flux(tmp.path()) / "transformer";
  const fs::path config = dir / "config.json";
  std::ifstream in(config);
  auto c = nlohmann::json::parse(in);
  in.close();
  c["quantization_config"] = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}};
  std::ofstream(config) << c.dump();
  xfuser::testing::expect_error_containing(
      [&] { xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, nullptr); },
      {"config.json", "quantization_config.quant_method 'bitsandbytes'", "not supported"});
  // A scale beside a weight that is not fp8: the error names both tensors.
  c["quantization_config"] = {{"quant_method", "bfl"}};
  std::ofstream(config) << c.dump();
  const std::string weights = (dir / "diffusion_pytorch_model.safetensors").string();
  std::map<std::string, at::Tensor> tensors;
  {
    const xfuser::models::SafetensorsFile file(weights);
    for (const auto& name : file.names()) tensors[name] = file.get(name).to(at::kFloat).clone();
  }
  xfuser::models::save_safetensors(weights, tensors);
  xfuser::testing::expect_error_containing(
      [&] { xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, nullptr); },
      {"transformer_blocks.0.attn.to_q.weight", "F8_E4M3", "weight_scale", "F32"});
}

// ---- under a GPU's device rules ----------------------------------------------------------------

TEST(Fp8Device, BothFormatsRunOnTheCheckedDevice) {
  if (!xfuser::testing::checked_device_available()) {
    GTEST_SKIP() << "the checked device needs libtorch >= 2.4";
  }
  // fp8 storage against diffusers' layerwise casting, every tensor on the device.
  xfuser::testing::TempDir tmp("xfuser-fp8-dev");
  const fs::path folder = xfuser::testing::resaved_pipeline("flux-tiny", "0.42.1", tmp.path());
  xfuser::testing::check_pipeline("flux-tiny", folder, xfuser::testing::checked_device(),
                                  kCasting / "flux-tiny-float8_e4m3fn",
                                  storage_format("float8_e4m3fn"));
  // FP8 GEMMs: the same final latents as on the CPU.
  const auto& spec = xfuser::models::ModelRegistry::for_pipeline_folder(folder);
  xfuser::models::GenerationRequest r;
  r.prompts = {"a red cat"};
  r.seeds = {3};
  r.height = 32;
  r.width = 32;
  r.num_inference_steps = 2;
  r.guidance_scale = 3.5;
  r.max_sequence_length = 8;
  at::Tensor latents[2];
  int i = 0;
  for (const c10::Device device : {c10::Device(c10::kCPU), xfuser::testing::checked_device()}) {
    auto model = spec.create(spec);
    xfuser::models::ModelLoadOptions options;
    options.device = device;
    options.transformer_weights.kind = WeightFormat::Kind::kFp8Scaled;
    model->load(folder, options);
    latents[i++] = model->generate(r).latents.cpu();
  }
  EXPECT_LE(xfuser::testing::max_rel_error(latents[1], latents[0]), 1e-6);
}
