// Text encoders (CLIPTextModel, CLIPTextModelWithProjection, T5EncoderModel, UMT5EncoderModel)
// against transformers v4.44.2 fixtures, plus batching, EOS pooling rules, strict loading, tied
// embeddings and input checking.
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/component.h"
#include "models/text_encoders/clip_text.h"
#include "models/text_encoders/t5_encoder.h"
#include "models/weights/component_folder.h"
#include "models/weights/safetensors.h"
#include "models/weights/tensor_source.h"
#include "tests/test_util.h"

namespace {
using xfuser::testing::read_json;

using xfuser::models::Component;
using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::TensorMapSource;
using xfuser::models::text_encoders::ClipTextConfig;
using xfuser::models::text_encoders::ClipTextModel;
using xfuser::models::text_encoders::T5Encoder;
using xfuser::models::text_encoders::T5EncoderConfig;
using xfuser::testing::fixtures_dir;
using xfuser::testing::max_rel_error;

// A case of the transformers 4.44.2 fixtures, or "transformers-vX/name" of another release.
std::filesystem::path case_dir(const std::string& name) {
  if (name.find('/') != std::string::npos) return fixtures_dir() / name;
  return fixtures_dir() / "transformers-v4.44.2" / name;
}

std::map<std::string, at::Tensor> read_all(const std::filesystem::path& path) {
  SafetensorsFile file(path.string());
  std::map<std::string, at::Tensor> out;
  for (const auto& name : file.names()) out[name] = file.get(name).clone();
  return out;
}

std::shared_ptr<Component> load_case(const std::string& name, c10::ScalarType dtype) {
  xfuser::models::register_builtin_components();
  return xfuser::models::load_component(case_dir(name).string(), dtype);
}

TensorMap case_inputs(const std::string& name) {
  TensorMap inputs;
  for (auto& [k, v] : read_all(case_dir(name) / "inputs.safetensors")) inputs[k] = v;
  return inputs;
}

// Every output the case lists (inputs.json "outputs"), fp32 run vs transformers' fp32 and f64
// outputs; returns the worst error against the f32 reference.
double check_case(const std::string& name, c10::ScalarType dtype, double tol) {
  auto model = load_case(name, dtype);
  auto out = model->call("forward", case_inputs(name));
  auto ref = read_all(case_dir(name) / "output.safetensors");
  auto spec = read_json(case_dir(name) / "inputs.json")["outputs"];
  double worst = 0;
  EXPECT_EQ(out.size(), spec.size()) << name << ": number of outputs";
  for (auto it = spec.begin(); it != spec.end(); ++it) {
    const std::string key = it.key();
    if (!out.count(key)) {
      ADD_FAILURE() << name << ": missing output " << key;
      continue;
    }
    const auto& got = out.at(key);
    EXPECT_EQ(got.sizes(), ref.at(key).sizes()) << name << " " << key;
    EXPECT_EQ(got.scalar_type(), dtype) << name << " " << key;
    const double e32 = max_rel_error(got.to(at::kFloat), ref.at(key));
    const double e64 = max_rel_error(got.to(at::kDouble), ref.at(key + "_f64"));
    std::printf("  %-24s %-26s %-9s rel err vs f32 %.3e, vs f64 %.3e\n", name.c_str(), key.c_str(),
                c10::toString(dtype), e32, e64);
    EXPECT_LT(e32, tol) << name << " " << key;
    EXPECT_LT(e64, tol) << name << " " << key;
    worst = std::max(worst, e32);
  }
  return worst;
}

// transformers 5.24 saves CLIPTextModel without the "text_model." prefix (its clip_text cases).
const std::vector<std::string> kCases = {"clip_text-tiny-s1",
                                         "clip_text-tiny_eos-s1",
                                         "clip_text_proj-tiny-s1",
                                         "t5_enc-tiny_mask-s1",
                                         "umt5_enc-tiny_mask-s1",
                                         "transformers-v5.24.0/clip_text-tiny-s1",
                                         "transformers-v5.24.0/clip_text-tiny_eos-s1",
                                         "transformers-v5.24.0/clip_text_proj-tiny-s1",
                                         "transformers-v5.24.0/clip_text_proj_g-tiny-s1",
                                         "transformers-v5.24.0/t5_enc-tiny_mask-s1",
                                         "transformers-v5.24.0/umt5_enc-tiny_mask-s1"};

// ---- fixtures -----------------------------------------------------------------------------------

TEST(TextEncoderFixtures, Float32MatchesTransformers) {
  for (const auto& name : kCases) {
    XF_REQUIRE_FIXTURE(case_dir(name));
    check_case(name, at::kFloat, 1e-4);
  }
}

// bf16 keeps 8 mantissa bits: unit roundoff 2^-9 = 2e-3 per rounding. Weights, embeddings and
// every matmul/residual output are rounded, over 5 CLIP or 2 T5 layers, and a max-abs error is
// taken over thousands of elements, so a few times 1e-2 relative is bf16's natural spread; a
// wrong formula (mask, bucket, activation, pooling index) moves outputs by 10% or more.
TEST(TextEncoderFixtures, BFloat16WithinBf16Precision) {
  for (const auto& name : kCases) {
    XF_REQUIRE_FIXTURE(case_dir(name));
    check_case(name, at::kBFloat16, 3e-2);
  }
}

// ---- batching -----------------------------------------------------------------------------------

// Rows of different lengths in one padded batch equal each row run alone, unpadded.
TEST(TextEncoderBatch, PaddedBatchEqualsRowsAlone) {
  for (const std::string name :
       {"clip_text-tiny_eos-s1", "t5_enc-tiny_mask-s1", "umt5_enc-tiny_mask-s1"}) {
    XF_REQUIRE_FIXTURE(case_dir(name));
    auto model = load_case(name, at::kFloat);
    const bool clip = name.rfind("clip", 0) == 0;
    const int64_t s = clip ? 20 : 16, vocab = clip ? 988 : 1000;
    const std::vector<int64_t> lengths = {s, 7, 12};
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    auto ids = at::randint(3, vocab, {3, s}, gen, at::TensorOptions().dtype(at::kLong));
    auto mask = at::zeros({3, s}, at::TensorOptions().dtype(at::kLong));
    for (int64_t r = 0; r < 3; ++r) {
      const int64_t n = lengths[r];
      if (clip) ids[r][n - 1].fill_(989);  // eos
      mask[r].narrow(0, 0, n).fill_(1);
      if (n < s) ids[r].narrow(0, n, s - n).fill_(clip ? 989 : 0);  // padding
    }
    auto batch = model->call("forward", {{"input_ids", ids}, {"attention_mask", mask}});
    for (int64_t r = 0; r < 3; ++r) {
      const int64_t n = lengths[r];
      auto row = ids[r].narrow(0, 0, n).unsqueeze(0);
      auto alone = model->call("forward", {{"input_ids", row}});
      for (auto& [key, value] : alone) {
        at::Tensor got = batch.at(key)[r];
        if (value.dim() == 3) got = got.narrow(0, 0, n);
        EXPECT_LT(max_rel_error(got, value[0]), 1e-5) << name << " row " << r << " " << key;
      }
    }
  }
}

// ---- CLIP pooling rules -------------------------------------------------------------------------

std::shared_ptr<ClipTextModel> tiny_clip(int64_t eos, int64_t layers = 2) {
  nlohmann::json config = {{"vocab_size", 50},         {"hidden_size", 16},
                           {"intermediate_size", 24},  {"num_hidden_layers", layers},
                           {"num_attention_heads", 2}, {"max_position_embeddings", 12},
                           {"hidden_act", "gelu"},     {"eos_token_id", eos}};
  auto m = std::make_shared<ClipTextModel>(ClipTextConfig::from_json(config, "test"), false);
  m->init_random(3, 0.3);
  return m;
}

at::Tensor ids_of(std::vector<int64_t> v) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong)).view({1, -1});
}

at::Tensor pooled_row(const TensorMap& out, int64_t position) {
  return out.at("last_hidden_state")[0][position];
}

TEST(ClipText, LegacyEosTwoPoolsAtTheHighestId) {
  auto m = tiny_clip(2);
  // Highest id 45 at position 3; token 2 appears at position 1 but is not used.
  auto out = m->call("forward", {{"input_ids", ids_of({1, 2, 7, 45, 9, 44, 45})}});
  EXPECT_TRUE(at::equal(out.at("pooler_output")[0], pooled_row(out, 3)));
  EXPECT_FALSE(at::equal(out.at("pooler_output")[0], pooled_row(out, 1)));
}

TEST(ClipText, ModernEosPoolsAtTheFirstEos) {
  auto m = tiny_clip(30);
  // First eos (30) at position 2, a later eos at 5, higher ids elsewhere.
  auto out = m->call("forward", {{"input_ids", ids_of({1, 40, 30, 49, 9, 30, 0})}});
  EXPECT_TRUE(at::equal(out.at("pooler_output")[0], pooled_row(out, 2)));
  EXPECT_FALSE(at::equal(out.at("pooler_output")[0], pooled_row(out, 3)));
  // No eos at all: transformers' argmax of an all-zero row is position 0.
  auto none = m->call("forward", {{"input_ids", ids_of({5, 40, 31, 49})}});
  EXPECT_TRUE(at::equal(none.at("pooler_output")[0], pooled_row(none, 0)));
}

TEST(ClipText, PenultimateOfOneLayerModelIsTheEmbedding) {
  auto m = tiny_clip(30, 1);
  auto ids = ids_of({4, 8, 30});
  auto out = m->call("forward", {{"input_ids", ids}});
  at::Tensor tok, pos;
  for (auto& [name, slot] : m->named_parameters()) {
    if (name == "text_model.embeddings.token_embedding.weight") tok = slot->tensor;
    if (name == "text_model.embeddings.position_embedding.weight") pos = slot->tensor;
  }
  auto expected = tok.index_select(0, ids[0]) + pos.narrow(0, 0, 3);
  EXPECT_TRUE(at::allclose(out.at("hidden_states_penultimate")[0], expected));
}

TEST(ClipText, ProjectionVariantNamesAndShapes) {
  nlohmann::json config = {{"vocab_size", 50},
                           {"hidden_size", 16},
                           {"intermediate_size", 24},
                           {"num_hidden_layers", 1},
                           {"num_attention_heads", 2},
                           {"projection_dim", 8},
                           {"max_position_embeddings", 12}};
  ClipTextModel m(ClipTextConfig::from_json(config, "test"), true);
  std::vector<std::string> names;
  for (auto& [name, slot] : m.named_parameters()) names.push_back(name);
  EXPECT_EQ(names.back(), "text_projection.weight");
  m.init_random(1);
  auto out = m.call("forward", {{"input_ids", ids_of({1, 2, 3})}});
  EXPECT_EQ(out.count("pooler_output"), 0u);
  EXPECT_EQ(out.at("text_embeds").sizes(), (std::vector<int64_t>{1, 8}));
  EXPECT_EQ(m.class_name(), "CLIPTextModelWithProjection");
}

// ---- strict loading -----------------------------------------------------------------------------

std::string load_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const xfuser::Error& e) {
    return e.what();
  }
  return "";
}

TEST(TextEncoderLoad, MissingAndUnexpectedWeightsAreNamed) {
  XF_REQUIRE_FIXTURE(case_dir("clip_text-tiny-s1"));
  auto config = read_json(case_dir("clip_text-tiny-s1") / "config.json");
  auto state = read_all(case_dir("clip_text-tiny-s1") / "model.safetensors");
  state.erase("text_model.encoder.layers.3.mlp.fc1.bias");
  state["text_model.encoder.layers.5.mlp.fc1.bias"] = at::zeros({37});
  ClipTextModel clip(ClipTextConfig::from_json(config, "config.json"), false);
  auto msg = load_error([&] { clip.load(TensorMapSource(state, "clip-state"), at::kFloat); });
  EXPECT_NE(msg.find("text_model.encoder.layers.3.mlp.fc1.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("text_model.encoder.layers.5.mlp.fc1.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("clip-state"), std::string::npos) << msg;

  // The legacy position_ids buffer is not an error.
  auto legacy = read_all(case_dir("clip_text-tiny-s1") / "model.safetensors");
  legacy["text_model.embeddings.position_ids"] = at::arange(77).view({1, 77});
  EXPECT_NO_THROW(clip.load(TensorMapSource(legacy), at::kFloat));

  // A T5 checkpoint lacks UMT5's per-block relative bias; a UMT5 one has biases T5 does not use.
  XF_REQUIRE_FIXTURE(case_dir("umt5_enc-tiny_mask-s1"));
  auto t5_config = read_json(case_dir("t5_enc-tiny_mask-s1") / "config.json");
  auto t5_state = read_all(case_dir("t5_enc-tiny_mask-s1") / "model.safetensors");
  auto umt5_state = read_all(case_dir("umt5_enc-tiny_mask-s1") / "model.safetensors");
  T5Encoder umt5(T5EncoderConfig::from_json(t5_config, "config.json", true));
  msg = load_error([&] { umt5.load(TensorMapSource(t5_state), at::kFloat); });
  EXPECT_NE(msg.find("missing tensors:\n    encoder.block.1.layer.0.SelfAttention."
                     "relative_attention_bias.weight"),
            std::string::npos)
      << msg;
  T5Encoder t5(T5EncoderConfig::from_json(t5_config, "config.json", false));
  msg = load_error([&] { t5.load(TensorMapSource(umt5_state), at::kFloat); });
  EXPECT_NE(msg.find("unexpected tensors:\n    encoder.block.1.layer.0.SelfAttention."
                     "relative_attention_bias.weight"),
            std::string::npos)
      << msg;
  // A full T5 checkpoint's decoder is ignored, as transformers' T5EncoderModel does.
  auto full = t5_state;
  full["decoder.block.0.layer.0.SelfAttention.q.weight"] = at::zeros({32, 32});
  EXPECT_NO_THROW(t5.load(TensorMapSource(full), at::kFloat));
}

TEST(TextEncoderLoad, TiedEmbeddingUnderEitherNameOrBoth) {
  const std::string name = "t5_enc-tiny_mask-s1";
  XF_REQUIRE_FIXTURE(case_dir(name));
  auto config = T5EncoderConfig::from_json(read_json(case_dir(name) / "config.json"), "c", false);
  auto state = read_all(case_dir(name) / "model.safetensors");
  ASSERT_TRUE(state.count("shared.weight"));
  ASSERT_FALSE(state.count("encoder.embed_tokens.weight"));
  auto inputs = case_inputs(name);
  auto ref = read_all(case_dir(name) / "output.safetensors").at("last_hidden_state");
  auto run = [&](const std::map<std::string, at::Tensor>& s) {
    T5Encoder m(config);
    m.load(TensorMapSource(s), at::kFloat);
    return m.call("forward", inputs).at("last_hidden_state");
  };
  EXPECT_LT(max_rel_error(run(state), ref), 1e-4);  // shared.weight only

  auto embed_only = state;
  embed_only["encoder.embed_tokens.weight"] = embed_only.at("shared.weight");
  embed_only.erase("shared.weight");
  EXPECT_LT(max_rel_error(run(embed_only), ref), 1e-4);

  auto both = state;
  both["encoder.embed_tokens.weight"] = state.at("shared.weight");
  EXPECT_LT(max_rel_error(run(both), ref), 1e-4);
  // With both, transformers ends up with encoder.embed_tokens.weight (loaded last).
  both["shared.weight"] = at::zeros_like(state.at("shared.weight"));
  EXPECT_LT(max_rel_error(run(both), ref), 1e-4);

  auto neither = state;
  neither.erase("shared.weight");
  auto msg = load_error([&] { run(neither); });
  EXPECT_NE(msg.find("missing tensors:\n    shared.weight [1000, 32]"), std::string::npos) << msg;
}

TEST(TextEncoderLoad, Float16KeepsWoInFloat32) {
  const std::string name = "t5_enc-tiny_mask-s1";
  XF_REQUIRE_FIXTURE(case_dir(name));
  auto config = T5EncoderConfig::from_json(read_json(case_dir(name) / "config.json"), "c", false);
  auto state = read_all(case_dir(name) / "model.safetensors");
  T5Encoder m(config);
  m.load(TensorMapSource(state), at::kHalf);
  for (auto& [pname, slot] : m.named_parameters()) {
    const bool wo = pname.find("DenseReluDense.wo.") != std::string::npos;
    EXPECT_EQ(slot->tensor.scalar_type(), wo ? at::kFloat : at::kHalf) << pname;
  }
  m.load(TensorMapSource(state), at::kBFloat16);  // transformers 4.44: fp16 loads only
  for (auto& [pname, slot] : m.named_parameters()) {
    EXPECT_EQ(slot->tensor.scalar_type(), at::kBFloat16) << pname;
  }
}

// fp16 as transformers runs it (wo in fp32, hidden states fp32 after the first feed-forward,
// fp16 clamping): fp16 keeps 11 mantissa bits (unit roundoff 4.9e-4), so 1e-2 relative has a
// wide margin. libtorch CPU builds without fp16 matmul skip it.
TEST(TextEncoderLoad, Float16ForwardMatchesReference) {
  try {
    at::linear(at::ones({2, 2}, at::kHalf), at::ones({2, 2}, at::kHalf));
  } catch (const std::exception&) {
    GTEST_SKIP() << "this libtorch has no fp16 matmul on CPU";
  }
  for (const std::string name : {"t5_enc-tiny_mask-s1", "umt5_enc-tiny_mask-s1"}) {
    XF_REQUIRE_FIXTURE(case_dir(name));
    auto config =
        T5EncoderConfig::from_json(read_json(case_dir(name) / "config.json"), "c", name[0] == 'u');
    T5Encoder m(config);
    m.load(TensorMapSource(read_all(case_dir(name) / "model.safetensors")), at::kHalf);
    auto out = m.call("forward", case_inputs(name)).at("last_hidden_state");
    EXPECT_EQ(out.scalar_type(), at::kHalf);
    auto ref = read_all(case_dir(name) / "output.safetensors").at("last_hidden_state_f64");
    const double err = max_rel_error(out.to(at::kDouble), ref);
    std::printf("  %-24s last_hidden_state          Half      rel err vs f64 %.3e\n", name.c_str(),
                err);
    EXPECT_LT(err, 1e-2) << name;
  }
}

// ---- inputs and configs -------------------------------------------------------------------------

TEST(TextEncoderInputs, WrongInputsAreNamedErrors) {
  auto m = tiny_clip(30);
  auto ids = ids_of({1, 2, 3});
  auto msg = load_error([&] { m->call("forward", {{"input_idz", ids}}); });
  EXPECT_NE(msg.find("unknown input 'input_idz'"), std::string::npos) << msg;
  msg = load_error([&] { m->call("forward", {{"attention_mask", at::ones({1, 3})}}); });
  EXPECT_NE(msg.find("missing required input 'input_ids'"), std::string::npos) << msg;
  msg = load_error([&] { m->call("decode", {{"input_ids", ids}}); });
  EXPECT_NE(msg.find("no method 'decode'"), std::string::npos) << msg;
  msg = load_error([&] {
    m->call("forward", {{"input_ids", ids}, {"attention_mask", at::ones({1, 4})}});
  });
  EXPECT_NE(msg.find("attention_mask shape [1, 4]"), std::string::npos) << msg;
  msg = load_error([&] { m->call("forward", {{"input_ids", ids_of({1, 50})}}); });
  EXPECT_NE(msg.find("outside the vocabulary [0, 50)"), std::string::npos) << msg;
  msg = load_error([&] { m->call("forward", {{"input_ids", at::ones({1, 3})}}); });
  EXPECT_NE(msg.find("input_ids must be an integer tensor"), std::string::npos) << msg;
  msg = load_error([&] { m->call("forward", {{"input_ids", at::ones({1, 13}, at::kLong)}}); });
  EXPECT_NE(msg.find("exceeds max_position_embeddings 12"), std::string::npos) << msg;

  T5Encoder t5(T5EncoderConfig::from_json({{"vocab_size", 10},
                                           {"d_model", 8},
                                           {"d_kv", 4},
                                           {"d_ff", 8},
                                           {"num_layers", 1},
                                           {"num_heads", 2}},
                                          "c", false));
  t5.init_random(1);
  msg = load_error([&] { t5.call("forward", {{"input_ids", ids}, {"inputs_embeds", ids}}); });
  EXPECT_NE(msg.find("T5EncoderModel.forward: unknown input 'inputs_embeds'"), std::string::npos)
      << msg;
}

TEST(TextEncoderConfig, FeedForwardProjAndActivations) {
  auto relu = T5EncoderConfig::from_json({{"feed_forward_proj", "relu"}}, "c", false);
  EXPECT_FALSE(relu.is_gated_act);
  T5Encoder m(relu);
  bool has_wi = false;
  for (auto& [name, slot] : m.named_parameters()) {
    has_wi |= name == "encoder.block.0.layer.1.DenseReluDense.wi.weight";
    EXPECT_EQ(name.find("wi_0"), std::string::npos);
  }
  EXPECT_TRUE(has_wi);
  auto gated = T5EncoderConfig::from_json({{"feed_forward_proj", "gated-gelu"}}, "c", false);
  EXPECT_TRUE(gated.is_gated_act);
  auto msg = load_error([&] {
    T5EncoderConfig::from_json({{"feed_forward_proj", "gated-gelu-x"}}, "c.json", false);
  });
  EXPECT_NE(msg.find("feed_forward_proj 'gated-gelu-x'"), std::string::npos) << msg;
  // A decoder's config builds other layers than the encoder's: refused, never run as an encoder.
  EXPECT_NO_THROW(T5EncoderConfig::from_json({{"is_decoder", false}}, "c.json", false));
  msg = load_error([&] { T5EncoderConfig::from_json({{"is_decoder", true}}, "c.json", true); });
  EXPECT_NE(msg.find("c.json: is_decoder = true is not supported"), std::string::npos) << msg;
  msg = load_error([&] { ClipTextConfig::from_json({{"hidden_act", "mish"}}, "c.json"); });
  EXPECT_NE(msg.find("unsupported activation 'mish' in c.json \"hidden_act\""), std::string::npos)
      << msg;
}

TEST(T5, RelativePositionBuckets) {
  // Row: query 200, keys 0..400. relative = key - query.
  auto b = xfuser::models::text_encoders::t5_relative_position_buckets(201, 401, 32, 128);
  auto at_rel = [&](int64_t rel) { return b[200][200 + rel].item<int64_t>(); };
  EXPECT_EQ(at_rel(0), 0);
  EXPECT_EQ(at_rel(-1), 1);
  EXPECT_EQ(at_rel(-7), 7);
  EXPECT_EQ(at_rel(-8), 8);    // 8 + floor(log(8/8) / log(16) * 8)
  EXPECT_EQ(at_rel(-20), 10);  // 8 + floor(log(2.5) / log(16) * 8) = 8 + 2
  EXPECT_EQ(at_rel(-127), 15);
  EXPECT_EQ(at_rel(-200), 15);
  EXPECT_EQ(at_rel(1), 17);  // keys after the query use the upper half
  EXPECT_EQ(at_rel(20), 26);
  EXPECT_EQ(at_rel(200), 31);
}

TEST(TextEncoderRegistry, FourClassesRegistered) {
  xfuser::models::register_builtin_components();
  auto known = xfuser::models::ComponentRegistry::known_classes();
  for (const std::string cls :
       {"CLIPTextModel", "CLIPTextModelWithProjection", "T5EncoderModel", "UMT5EncoderModel"}) {
    EXPECT_NE(std::find(known.begin(), known.end(), cls), known.end()) << cls;
    auto c = xfuser::models::ComponentRegistry::create(cls, nlohmann::json::object(), "cfg");
    EXPECT_EQ(c->class_name(), cls);
  }
}

}  // namespace
