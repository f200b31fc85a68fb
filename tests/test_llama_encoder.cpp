// LlamaModel / MistralModel text encoders (HunyuanVideo, FLUX.2) against transformers v4.44.2
// fixtures (and Mistral3ForConditionalGeneration's language model, FLUX.2's text encoder, against
// v4.57.1) (GQA, default and llama3 RoPE, biases, Mistral's explicit head_dim and sliding window,
// right and left padding), plus hidden-state selection, *ForCausalLM loading, config and input
// errors.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/text_encoders/llama_encoder.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "models/weights/tensor_source.h"
#include "tests/test_util.h"

namespace {

using xfuser::models::Component;
using xfuser::models::TensorMap;
using xfuser::models::TensorMapSource;
using xfuser::models::text_encoders::LlamaEncoder;
using xfuser::models::text_encoders::LlamaEncoderConfig;
using xfuser::testing::fixtures_dir;
using xfuser::testing::max_rel_error;
using xfuser::testing::read_json;
using xfuser::testing::read_tensors;

// Mistral 3 (FLUX.2's text encoder) needs transformers 4.57.1; the others are 4.44.2's.
std::filesystem::path case_dir(const std::string& name) {
  return fixtures_dir() /
         (name.rfind("mistral3-", 0) == 0 ? "transformers-v4.57.1" : "transformers-v4.44.2") / name;
}

std::shared_ptr<LlamaEncoder> load_case(const std::string& name, c10::ScalarType dtype) {
  xfuser::models::register_builtin_components();
  auto component = xfuser::models::load_component(case_dir(name).string(), dtype);
  auto model = std::dynamic_pointer_cast<LlamaEncoder>(component);
  EXPECT_TRUE(model) << name << " did not load as a LlamaEncoder";
  return model;
}

TensorMap case_inputs(const std::string& name) {
  TensorMap inputs;
  for (auto& [k, v] : read_tensors(case_dir(name) / "inputs.safetensors")) inputs[k] = v;
  return inputs;
}

const std::vector<std::string> kCases = {"llama-tiny_mask-s1",      "llama-tiny_llama3rope-s1",
                                         "llama-tiny_leftpad-s1",   "mistral-tiny_headdim-s1",
                                         "mistral-tiny_window-s1",  "mistral3-tiny_flux2-s1",
                                         "mistral3-tiny_leftpad-s1"};

// Every output the case lists against transformers' fp32 and f64 outputs; returns the worst
// error against the fp32 reference.
double check_case(const std::string& name, c10::ScalarType dtype, double tol) {
  auto model = load_case(name, dtype);
  if (!model) return 1;
  auto out = model->call("forward", case_inputs(name));
  auto ref = read_tensors(case_dir(name) / "output.safetensors");
  auto spec = read_json(case_dir(name) / "inputs.json")["outputs"];
  EXPECT_EQ(out.size(), spec.size()) << name << ": number of outputs";
  double worst = 0;
  for (auto it = spec.begin(); it != spec.end(); ++it) {
    const std::string key = it.key();
    if (!out.count(key)) {
      ADD_FAILURE() << name << ": missing output " << key;
      continue;
    }
    const auto& got = out.at(key);
    EXPECT_EQ(got.sizes(), ref.at(key).sizes()) << name << " " << key;
    EXPECT_EQ(got.scalar_type(), dtype) << name << " " << key;
    if (got.sizes() != ref.at(key).sizes()) continue;
    const double e32 = max_rel_error(got.to(at::kFloat), ref.at(key));
    const double e64 = max_rel_error(got.to(at::kDouble), ref.at(key + "_f64"));
    std::printf("  %-26s %-18s %-9s rel err vs f32 %.3e, vs f64 %.3e\n", name.c_str(), key.c_str(),
                c10::toString(dtype), e32, e64);
    EXPECT_LT(e32, tol) << name << " " << key;
    EXPECT_LT(e64, tol) << name << " " << key;
    worst = std::max(worst, e32);
  }
  return worst;
}

// ---- fixtures -----------------------------------------------------------------------------------

// FLUX.2's text encoder: the language model of a Mistral3ForConditionalGeneration folder, read
// from transformers 4.57's "language_model.model." names or the in-memory "model.language_model."
// ones; the vision tower, projector and lm_head are not parameters of the encoder.
TEST(LlamaEncoderFixtures, Mistral3LanguageModelUnderEitherPrefix) {
  const std::string name = "mistral3-tiny_flux2-s1";
  XF_REQUIRE_FIXTURE(case_dir(name));
  auto model = load_case(name, at::kFloat);
  ASSERT_TRUE(model);
  EXPECT_EQ(model->class_name(), "Mistral3ForConditionalGeneration");
  EXPECT_TRUE(model->config().multimodal);
  EXPECT_EQ(model->config().head_dim, 24);
  EXPECT_EQ(model->config().num_hidden_layers, 4);
  const auto stored = read_tensors(case_dir(name) / "model.safetensors");
  TensorMap renamed;
  const std::string legacy = "language_model.model.";
  for (const auto& [k, v] : stored) {
    renamed[k.rfind(legacy, 0) == 0 ? "model.language_model." + k.substr(legacy.size()) : k] = v;
  }
  ASSERT_EQ(renamed.count("model.language_model.embed_tokens.weight"), 1u);
  LlamaEncoder other(model->config());
  other.load(TensorMapSource(renamed, "renamed"), at::kFloat);
  const auto inputs = case_inputs(name);
  const auto a = model->forward(inputs.at("input_ids"), inputs.at("attention_mask"));
  const auto b = other.forward(inputs.at("input_ids"), inputs.at("attention_mask"));
  EXPECT_TRUE(at::equal(a.hidden_states, b.hidden_states));
  // The left-padded case pins the zero rule: attending to every key instead moves the pad rows.
  {
    const std::string left = "mistral3-tiny_leftpad-s1";
    XF_REQUIRE_FIXTURE(case_dir(left));
    auto zero = load_case(left, at::kFloat);
    ASSERT_TRUE(zero);
    EXPECT_EQ(zero->config().fully_masked_rows, LlamaEncoderConfig::FullyMaskedRows::kZero);
    auto config = zero->config();
    config.fully_masked_rows = LlamaEncoderConfig::FullyMaskedRows::kAttendAll;
    LlamaEncoder attend_all(config);
    attend_all.load(
        xfuser::models::SafetensorsFile((case_dir(left) / "model.safetensors").string()),
        at::kFloat);
    const auto in = case_inputs(left);
    const auto ref = read_tensors(case_dir(left) / "output.safetensors").at("hidden_states");
    const auto got = attend_all.forward(in.at("input_ids"), in.at("attention_mask")).hidden_states;
    EXPECT_GT(max_rel_error(got, ref), 1e-3) << "the fixture does not tell the two rules apart";
    const auto real = in.at("attention_mask").ne(0);  // [B, S]
    EXPECT_LT(max_rel_error(got.index({at::indexing::Slice(), real}),
                            ref.index({at::indexing::Slice(), real})),
              1e-5)
        << "real tokens never see the pad rows";
  }
  // Neither prefix: the error names both.
  TensorMap bare;
  for (const auto& [k, v] : stored) {
    if (k.rfind(legacy, 0) == 0) bare[k.substr(legacy.size())] = v;
  }
  xfuser::testing::expect_error_containing(
      [&] { LlamaEncoder(model->config()).load(TensorMapSource(bare, "bare"), at::kFloat); },
      {"language_model.model.embed_tokens.weight", "model.language_model.embed_tokens.weight"});
  // A config without text_config is refused by name.
  nlohmann::json config = read_json(case_dir(name) / "config.json");
  config.erase("text_config");
  xfuser::testing::expect_error_containing(
      [&] {
        LlamaEncoderConfig::from_json(config, "config.json", "Mistral3ForConditionalGeneration");
      },
      {"config.json", "text_config"});
}

TEST(LlamaEncoderFixtures, Float32MatchesTransformers) {
  double worst = 0;
  for (const auto& name : kCases) {
    XF_REQUIRE_FIXTURE(case_dir(name));
    worst = std::max(worst, check_case(name, at::kFloat, 1e-4));
  }
  std::printf("  worst fp32 relative error: %.3e\n", worst);
}

// bf16 keeps 8 mantissa bits (unit roundoff 2^-9 ~ 2e-3); weights, embeddings, RoPE tables and
// every matmul / residual output are rounded over 3 layers, and the max error is taken over
// thousands of elements, so a few 1e-2 is bf16's spread. A wrong mask, RoPE band or head grouping
// moves the outputs by 10% or more.
TEST(LlamaEncoderFixtures, BFloat16WithinBf16Precision) {
  for (const auto& name : kCases) {
    XF_REQUIRE_FIXTURE(case_dir(name));
    check_case(name, at::kBFloat16, 4e-2);
  }
}

// HunyuanVideo runs its text encoder in float16 (10 mantissa bits: 4x finer than bf16).
TEST(LlamaEncoderFixtures, Float16WithinFp16Precision) {
  for (const auto& name : kCases) {
    XF_REQUIRE_FIXTURE(case_dir(name));
    check_case(name, at::kHalf, 1e-2);
  }
}

// The structural features the fixtures are meant to cover really are in them.
TEST(LlamaEncoderFixtures, CasesCoverGqaHeadDimWindowAndRope) {
  XF_REQUIRE_FIXTURE(case_dir("mistral-tiny_window-s1"));
  auto mistral = load_case("mistral-tiny_headdim-s1", at::kFloat);
  const auto& mc = mistral->config();
  EXPECT_EQ(mc.head_dim, 24);
  EXPECT_NE(mc.head_dim * mc.num_attention_heads, mc.hidden_size);
  EXPECT_LT(mc.num_key_value_heads, mc.num_attention_heads);
  EXPECT_FALSE(mc.sliding_window.has_value());
  EXPECT_EQ(load_case("mistral-tiny_window-s1", at::kFloat)->config().sliding_window.value_or(0),
            5);
  auto llama3 = load_case("llama-tiny_llama3rope-s1", at::kFloat)->config();
  EXPECT_EQ(llama3.rope_type, LlamaEncoderConfig::RopeType::kLlama3);
  EXPECT_TRUE(llama3.attention_bias && llama3.mlp_bias);
  // The llama3 frequencies: high band kept, medium smoothed, low divided by the factor.
  auto plain = llama3;
  plain.rope_type = LlamaEncoderConfig::RopeType::kDefault;
  auto base = xfuser::models::text_encoders::llama_rope_inv_freq(plain);
  auto scaled = xfuser::models::text_encoders::llama_rope_inv_freq(llama3);
  ASSERT_EQ(scaled.numel(), 8);
  EXPECT_EQ(scaled[0].item<float>(), base[0].item<float>());
  const float mid = scaled[1].item<float>();
  EXPECT_LT(mid, base[1].item<float>());
  EXPECT_GT(mid, base[1].item<float>() / 8);
  for (int i = 2; i < 8; ++i) EXPECT_EQ(scaled[i].item<float>(), base[i].item<float>() / 8.0f);
}

// The sliding window changes the result (the fixture would catch a model that ignores it).
TEST(LlamaEncoderFixtures, SlidingWindowMatters) {
  XF_REQUIRE_FIXTURE(case_dir("mistral-tiny_window-s1"));
  auto config = read_json(case_dir("mistral-tiny_window-s1") / "config.json");
  config["sliding_window"] = nullptr;
  LlamaEncoder no_window(LlamaEncoderConfig::from_json(config, "config.json", "MistralModel"));
  no_window.load(
      TensorMapSource(read_tensors(case_dir("mistral-tiny_window-s1") / "model.safetensors")),
      at::kFloat);
  auto out = no_window.call("forward", case_inputs("mistral-tiny_window-s1"));
  auto ref = read_tensors(case_dir("mistral-tiny_window-s1") / "output.safetensors");
  EXPECT_GT(max_rel_error(out.at("last_hidden_state"), ref.at("last_hidden_state")), 1e-2);
}

// ---- hidden states ------------------------------------------------------------------------------

TEST(LlamaEncoderHidden, LastEntryIsNormedAndSelectionMatchesStack) {
  XF_REQUIRE_FIXTURE(case_dir("llama-tiny_mask-s1"));
  auto model = load_case("llama-tiny_mask-s1", at::kFloat);
  auto inputs = case_inputs("llama-tiny_mask-s1");
  auto out = model->call("forward", inputs);
  const auto& all = out.at("hidden_states");  // [4, 2, 12, 64]
  ASSERT_EQ(all.size(0), 4);
  // transformers 4.44.2: the last entry is after the final norm.
  EXPECT_TRUE(at::equal(all[3], out.at("last_hidden_state")));
  auto ids = inputs.at("input_ids"), mask = inputs.at("attention_mask");
  auto picked = model->forward_hidden_states(ids, mask, {-3, 0, 1, 3, -1});
  ASSERT_EQ(picked.size(), 5u);
  EXPECT_TRUE(at::equal(picked[0], all[1]));  // -3 of 4 entries
  EXPECT_TRUE(at::equal(picked[1], all[0]));
  EXPECT_TRUE(at::equal(picked[2], all[1]));
  EXPECT_TRUE(at::equal(picked[3], all[3]));
  EXPECT_TRUE(at::equal(picked[4], all[3]));
  // Only the embeddings: no layer runs.
  auto emb = model->forward_hidden_states(ids, mask, {0});
  EXPECT_TRUE(at::equal(emb[0], all[0]));
  try {
    model->forward_hidden_states(ids, mask, {4});
    ADD_FAILURE() << "hidden state 4 of a 3-layer model accepted";
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden state 4 out of range [-4, 3]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(model->forward_hidden_states(ids, mask, {-5}), xfuser::Error);
  EXPECT_THROW(model->forward_hidden_states(ids, mask, {}), xfuser::Error);
}

// Rows of different lengths in one right-padded batch equal each row alone, unpadded, at the
// real tokens (every hidden state).
TEST(LlamaEncoderHidden, RightPaddedBatchEqualsRowsAlone) {
  XF_REQUIRE_FIXTURE(case_dir("llama-tiny_mask-s1"));
  for (const std::string name : {"llama-tiny_mask-s1", "mistral-tiny_headdim-s1"}) {
    auto model = load_case(name, at::kFloat);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    const int64_t s = 10;
    const std::vector<int64_t> lengths = {s, 4, 7};
    auto ids = at::randint(1, 1000, {3, s}, gen, at::TensorOptions().dtype(at::kLong));
    auto mask = at::zeros({3, s}, at::TensorOptions().dtype(at::kLong));
    for (int64_t r = 0; r < 3; ++r) mask[r].narrow(0, 0, lengths[r]).fill_(1);
    auto batch = model->call("forward", {{"input_ids", ids}, {"attention_mask", mask}});
    for (int64_t r = 0; r < 3; ++r) {
      const int64_t n = lengths[r];
      auto alone = model->call("forward", {{"input_ids", ids[r].narrow(0, 0, n).unsqueeze(0)}});
      EXPECT_LT(max_rel_error(batch.at("hidden_states").select(1, r).narrow(1, 0, n),
                              alone.at("hidden_states").select(1, 0)),
                1e-5)
          << name << " row " << r;
    }
  }
}

// Left padding: the real tokens equal the plain eager model (the generator checked that they do
// not depend on the rule for fully masked rows), and the fully masked rows are finite.
TEST(LlamaEncoderHidden, LeftPaddingRealTokensMatch) {
  XF_REQUIRE_FIXTURE(case_dir("llama-tiny_leftpad-s1"));
  auto model = load_case("llama-tiny_leftpad-s1", at::kFloat);
  auto inputs = case_inputs("llama-tiny_leftpad-s1");
  auto out = model->call("forward", inputs);
  auto ref = read_tensors(case_dir("llama-tiny_leftpad-s1") / "output.safetensors");
  auto keep = inputs.at("attention_mask").to(at::kBool);  // [2, 12], row 1: 7 pads then 5
  ASSERT_EQ(keep[1].sum().item<int64_t>(), 5);
  auto got = out.at("hidden_states").permute({1, 2, 0, 3});  // [B, S, L+1, d]
  auto want = ref.at("hidden_states").permute({1, 2, 0, 3});
  EXPECT_LT(max_rel_error(got.index({keep}), want.index({keep})), 1e-4);
  EXPECT_TRUE(at::isfinite(out.at("hidden_states")).all().item<bool>());
}

// ---- loading ------------------------------------------------------------------------------------

// A *ForCausalLM checkpoint: the same weights under "model." plus lm_head, which is ignored.
TEST(LlamaEncoderLoad, ForCausalLmUsesTheModelPrefix) {
  XF_REQUIRE_FIXTURE(case_dir("mistral-tiny_headdim-s1"));
  const std::string name = "mistral-tiny_headdim-s1";
  auto config = read_json(case_dir(name) / "config.json");
  auto state = read_tensors(case_dir(name) / "model.safetensors");
  std::map<std::string, at::Tensor> causal;
  for (auto& [k, v] : state) causal["model." + k] = v;
  causal["lm_head.weight"] = at::zeros({1000, 64});
  LlamaEncoder lm(LlamaEncoderConfig::from_json(config, "config.json", "MistralForCausalLM"));
  EXPECT_EQ(lm.class_name(), "MistralForCausalLM");
  lm.load(TensorMapSource(causal), at::kFloat);
  auto out = lm.call("forward", case_inputs(name));
  auto ref = read_tensors(case_dir(name) / "output.safetensors");
  EXPECT_LT(max_rel_error(out.at("hidden_states"), ref.at("hidden_states")), 1e-4);
  // Tied embeddings: no lm_head saved at all.
  causal.erase("lm_head.weight");
  EXPECT_NO_THROW(lm.load(TensorMapSource(causal), at::kFloat));

  // The plain model names an lm_head (and a missing tensor) as a mismatch.
  LlamaEncoder plain(LlamaEncoderConfig::from_json(config, "config.json", "MistralModel"));
  state["lm_head.weight"] = at::zeros({1000, 64});
  state.erase("layers.2.mlp.up_proj.weight");
  try {
    plain.load(TensorMapSource(state, "mistral-state"), at::kFloat);
    ADD_FAILURE() << "mismatched state dict accepted";
  } catch (const xfuser::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("lm_head.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("layers.2.mlp.up_proj.weight [96, 64]"), std::string::npos) << msg;
  }
}

nlohmann::json tiny_llama_config() {
  return {{"vocab_size", 50},         {"hidden_size", 16},
          {"intermediate_size", 24},  {"num_hidden_layers", 2},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"rms_norm_eps", 1e-5},     {"rope_theta", 10000.0},
          {"hidden_act", "silu"},     {"max_position_embeddings", 64}};
}

// Every architecture name is registered and builds the encoder with that class name.
TEST(LlamaEncoderLoad, RegisteredArchitectures) {
  xfuser::models::register_builtin_components();
  for (const std::string arch :
       {"LlamaModel", "LlamaForCausalLM", "MistralModel", "MistralForCausalLM"}) {
    auto component = xfuser::models::ComponentRegistry::create(arch, tiny_llama_config(), "x");
    auto model = std::dynamic_pointer_cast<LlamaEncoder>(component);
    ASSERT_TRUE(model) << arch;
    EXPECT_EQ(model->class_name(), arch);
    const std::string first = model->named_parameters().front().first;
    const bool causal = arch.find("ForCausalLM") != std::string::npos;
    EXPECT_EQ(first, causal ? "model.embed_tokens.weight" : "embed_tokens.weight") << arch;
  }
}

// ---- config errors ------------------------------------------------------------------------------

std::string config_error(const nlohmann::json& config, const std::string& arch) {
  try {
    LlamaEncoderConfig::from_json(config, "te/config.json", arch);
  } catch (const xfuser::Error& e) {
    return e.what();
  }
  return "";
}

TEST(LlamaEncoderConfigTest, DefaultsAndErrors) {
  auto c = tiny_llama_config();
  auto cfg = LlamaEncoderConfig::from_json(c, "te/config.json", "LlamaModel");
  EXPECT_EQ(cfg.head_dim, 4);
  EXPECT_FALSE(cfg.sliding_window.has_value());
  // Mistral: sliding_window absent -> 4096 (MistralConfig's default); null -> none.
  EXPECT_EQ(LlamaEncoderConfig::from_json(c, "x", "MistralModel").sliding_window.value_or(0), 4096);
  auto m = c;
  m["sliding_window"] = nullptr;
  EXPECT_FALSE(LlamaEncoderConfig::from_json(m, "x", "MistralModel").sliding_window.has_value());
  // num_key_value_heads null -> num_attention_heads.
  m["num_key_value_heads"] = nullptr;
  EXPECT_EQ(LlamaEncoderConfig::from_json(m, "x", "MistralModel").num_key_value_heads, 4);

  auto bad = c;
  bad["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  auto msg = config_error(bad, "LlamaModel");
  EXPECT_NE(msg.find("te/config.json \"rope_scaling\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("'yarn'"), std::string::npos) << msg;
  bad["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  msg = config_error(bad, "LlamaModel");
  EXPECT_NE(msg.find("low_freq_factor"), std::string::npos) << msg;
  bad["rope_scaling"] = {{"type", "default"}};
  EXPECT_EQ(config_error(bad, "LlamaModel"), "");

  bad = c;
  bad["num_key_value_heads"] = 3;
  msg = config_error(bad, "LlamaModel");
  EXPECT_NE(msg.find("not a multiple of num_key_value_heads 3"), std::string::npos) << msg;
  bad = c;
  bad["head_dim"] = 8;
  msg = config_error(bad, "LlamaModel");
  EXPECT_NE(msg.find("head_dim 8"), std::string::npos) << msg;
  EXPECT_EQ(config_error(bad, "MistralModel"), "");  // Mistral honours it
  bad = c;
  bad["hidden_act"] = "tanhshrink";
  msg = config_error(bad, "LlamaModel");
  EXPECT_NE(msg.find("hidden_act"), std::string::npos) << msg;
  msg = config_error(c, "GemmaModel");
  EXPECT_NE(msg.find("GemmaModel"), std::string::npos) << msg;
  bad = c;
  bad["attention_bias"] = true;
  msg = config_error(bad, "MistralModel");
  EXPECT_NE(msg.find("attention_bias"), std::string::npos) << msg;
}

// transformers 5 writes the rotary settings in one rope_parameters object (no top-level rope_theta
// or rope_scaling); both layouts give the same config, and an unknown or conflicting one is an
// error naming the key.
TEST(LlamaEncoderConfigTest, RopeParametersOfTransformers5) {
  const nlohmann::json llama3 = {{"factor", 8.0},
                                 {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0},
                                 {"original_max_position_embeddings", 32}};
  auto v4 = tiny_llama_config();
  v4["rope_theta"] = 500000.0;
  v4["rope_scaling"] = llama3;
  v4["rope_scaling"]["rope_type"] = "llama3";
  auto v5 = tiny_llama_config();
  v5.erase("rope_theta");
  v5["rope_parameters"] = llama3;
  v5["rope_parameters"]["rope_type"] = "llama3";
  v5["rope_parameters"]["rope_theta"] = 500000.0;
  const auto a = LlamaEncoderConfig::from_json(v4, "x", "LlamaModel");
  const auto b = LlamaEncoderConfig::from_json(v5, "x", "LlamaModel");
  EXPECT_EQ(b.rope_theta, 500000.0);
  EXPECT_EQ(b.rope_type, LlamaEncoderConfig::RopeType::kLlama3);
  EXPECT_EQ(b.rope_factor, 8.0);
  EXPECT_TRUE(at::equal(xfuser::models::text_encoders::llama_rope_inv_freq(a),
                        xfuser::models::text_encoders::llama_rope_inv_freq(b)));
  // The default rope of a transformers 5 Mistral (FLUX.2's text_config): its theta is read.
  auto m = tiny_llama_config();
  m.erase("rope_theta");
  m["rope_parameters"] = {{"rope_theta", 1e9}, {"rope_type", "default"}};
  EXPECT_EQ(LlamaEncoderConfig::from_json(m, "x", "MistralModel").rope_theta, 1e9);
  // Qwen2.5-VL's text model: theta and the mrope section come from rope_parameters.
  auto q = tiny_llama_config();
  q.erase("rope_theta");
  q["model_type"] = "qwen2_5_vl_text";
  q["rope_parameters"] = {
      {"rope_theta", 5000.0}, {"rope_type", "default"}, {"mrope_section", {1, 1, 0}}};
  EXPECT_EQ(LlamaEncoderConfig::from_json(q, "x", "Qwen2_5_VLTextModel").rope_theta, 5000.0);
  q["rope_parameters"]["mrope_section"] = {1, 1, 1};
  const std::string qmsg = config_error(q, "Qwen2_5_VLTextModel");
  EXPECT_NE(qmsg.find("\"rope_parameters\": mrope_section"), std::string::npos) << qmsg;
  // Errors name rope_parameters.
  for (const auto& [patch, want] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"rope_parameters", {{"rope_type", "yarn"}}}},
            "te/config.json \"rope_parameters\": rope_type 'yarn'"},
           {{{"rope_theta", 10000.0}}, "rope_parameters.rope_theta"},
           {{{"rope_parameters", 3}}, "\"rope_parameters\" must be an object"}}) {
    auto bad = v5;
    bad.merge_patch(patch);
    const std::string msg = config_error(bad, "LlamaModel");
    EXPECT_NE(msg.find(want), std::string::npos) << patch.dump() << ": " << msg;
  }
}

// ---- input errors -------------------------------------------------------------------------------

std::string call_error(Component& model, const TensorMap& inputs) {
  try {
    model.call("forward", inputs);
  } catch (const xfuser::Error& e) {
    return e.what();
  }
  return "";
}

TEST(LlamaEncoderInputs, BadInputsAreNamed) {
  LlamaEncoder model(LlamaEncoderConfig::from_json(tiny_llama_config(), "x", "LlamaModel"));
  auto ids = at::arange(6, at::TensorOptions().dtype(at::kLong)).view({1, 6});
  EXPECT_NE(call_error(model, {{"input_ids", ids}}).find("used before load()"), std::string::npos);
  model.init_random(1, 0.1);
  EXPECT_EQ(call_error(model, {{"input_ids", ids}}), "");

  auto msg = call_error(model, {{"input_ids", ids + 45}});
  EXPECT_NE(msg.find("input_ids hold ids in [45, 50]"), std::string::npos) << msg;
  msg = call_error(model, {{"input_ids", ids - 1}});
  EXPECT_NE(msg.find("outside the vocabulary [0, 50)"), std::string::npos) << msg;
  msg = call_error(model, {{"input_ids", ids.view({6})}});
  EXPECT_NE(msg.find("input_ids must be [batch, seq], got shape [6]"), std::string::npos) << msg;
  msg = call_error(model, {{"input_ids", ids.to(at::kFloat)}});
  EXPECT_NE(msg.find("input_ids must be an integer tensor"), std::string::npos) << msg;
  msg = call_error(model, {{"input_ids", ids}, {"attention_mask", at::ones({1, 5})}});
  EXPECT_NE(msg.find("attention_mask shape [1, 5] does not match input_ids shape [1, 6]"),
            std::string::npos)
      << msg;
  msg = call_error(model, {{"input_ids", ids}, {"mask", at::ones({1, 6})}});
  EXPECT_NE(msg.find("unknown input 'mask'"), std::string::npos) << msg;
  msg = call_error(model, {{"attention_mask", at::ones({1, 6})}});
  EXPECT_NE(msg.find("missing required input 'input_ids'"), std::string::npos) << msg;
  try {
    model.call("encode", {{"input_ids", ids}});
    ADD_FAILURE() << "unknown method accepted";
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no method 'encode'"), std::string::npos) << e.what();
  }
  msg = "";
  try {
    model.forward_hidden_states(ids.view({6}), {}, {1});
  } catch (const xfuser::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("input_ids must be [batch, seq]"), std::string::npos) << msg;

  // A float or bool mask works like the int one (key kept where mask != 0).
  auto mask = at::ones({1, 6}, at::TensorOptions().dtype(at::kLong));
  mask[0][5] = 0;
  auto ref = model.call("forward", {{"input_ids", ids}, {"attention_mask", mask}});
  for (auto dtype : {at::kFloat, at::kBool}) {
    auto out = model.call("forward", {{"input_ids", ids}, {"attention_mask", mask.to(dtype)}});
    EXPECT_TRUE(at::equal(out.at("hidden_states"), ref.at("hidden_states")));
  }
  // Without padding the mask changes nothing.
  auto full = model.call("forward", {{"input_ids", ids}, {"attention_mask", at::ones({1, 6})}});
  auto none = model.call("forward", {{"input_ids", ids}});
  EXPECT_TRUE(at::equal(full.at("hidden_states"), none.at("hidden_states")));
}

}  // namespace
