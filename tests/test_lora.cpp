// LoRA adapters (models/common/lora.h).
//
// Against diffusers 0.42.1 / peft 0.21.2: lora-v0.42.1/<pipeline>/ holds adapters written by
// diffusers' save_lora_weights (and, for FLUX.1 and Wan, files in kohya's and the original Wan
// layout), and cases run by diffusers from the same initial latents: one adapter, two with
// different scales, scale 0, fused (fuse_lora) and unfused (set_adapters). xfuser's final
// latents equal diffusers' within 1e-4 relative (fp32), in the case's mode and in the other one.
// Unfused adapters change scale per generation, and scale 0 gives the base model's result bit
// for bit. Tensor-parallel slicing of adapters, and every bad adapter as a clear error.
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/common/layers.h"
#include "models/common/lora.h"
#include "models/common/tensor_parallel.h"
#include "models/registry.h"
#include "models/weights/safetensors.h"
#include "models/weights/tensor_source.h"
#include "models/xfuser_model.h"
#include "runner/outputs.h"
#include "tests/lora_case.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
namespace models = xfuser::models;
using models::GenerationRequest;
using models::ModelRegistry;

const std::vector<std::string> kPipelines = {
    "flux-tiny",    "kontext-tiny",   "flux2-tiny",         "sd3-tiny",
    "wan-t2v-tiny", "wan22-t2v-tiny", "hunyuan-video-tiny", "hunyuan_video15-tiny"};

using xfuser::testing::lora_root;
const auto& case_adapters = xfuser::testing::lora_case_adapters;

GenerationRequest case_request(const std::string& pipeline, const fs::path& dir) {
  GenerationRequest r = xfuser::testing::reference_case_request(dir);
  // diffusers 0.42's UniPC takes its flow sigmas from one, whatever the folder's version.
  if (pipeline.rfind("wan", 0) == 0) r.flow_sigmas = "from_one";
  return r;
}

std::unique_ptr<models::XFuserModel> load(const fs::path& folder,
                                          std::vector<models::LoraSpec> lora, bool fused) {
  const auto& spec = ModelRegistry::for_pipeline_folder(folder);
  auto model = spec.create(spec);
  models::ModelLoadOptions options;  // fp32
  options.lora = std::move(lora);
  options.lora_fused = fused;
  model->load(folder, options);
  return model;
}

class LoraParity : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraParity, FinalLatentsEqualDiffusersFusedAndUnfused) {
  const std::string name = GetParam();
  const fs::path root = lora_root(name);
  XF_REQUIRE_FIXTURE(root);
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / name;
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    const fs::path dir = entry.path();
    if (!fs::exists(dir / "case.json")) continue;
    SCOPED_TRACE(dir.string());
    const auto c = xfuser::testing::read_json(dir / "case.json");
    const bool fused = c["lora"]["fused"];
    const at::Tensor want =
        models::SafetensorsFile((dir / "final.safetensors").string()).get("latents");
    for (const bool mode : {fused, !fused}) {
      auto model = load(folder, case_adapters(root, c), mode);
      const auto out = model->generate(case_request(name, dir));
      ASSERT_EQ(out.latents.sizes(), want.sizes());
      const double rel = xfuser::testing::max_rel_error(out.latents, want);
      EXPECT_LE(rel, 1e-4) << (mode ? "fused" : "unfused") << " vs diffusers ("
                           << (fused ? "fused" : "unfused") << ")";
      std::printf("%s/%s %s: rel %.2e (diffusers' change from the base: %.2e)\n", name.c_str(),
                  dir.filename().c_str(), mode ? "fused" : "unfused", rel,
                  c.value("base_rel_change", 0.0));
    }
    ++cases;
  }
  EXPECT_GE(cases, 3) << "one adapter, two adapters, scale 0 at least";
}

INSTANTIATE_TEST_SUITE_P(Families, LoraParity, ::testing::ValuesIn(kPipelines),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

// Unfused adapters: each generation sets its own scales; 0 is the base model bit for bit, and
// going back to the load scale gives diffusers' result again.
TEST(Lora, UnfusedScalesChangePerGeneration) {
  const std::string name = "flux-tiny";
  const fs::path root = lora_root(name);
  XF_REQUIRE_FIXTURE(root / "a");
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / name;
  const auto c = xfuser::testing::read_json(root / "a" / "case.json");
  auto model = load(folder, case_adapters(root, c), /*fused=*/false);
  auto base = load(folder, {}, true);
  GenerationRequest r = case_request(name, root / "a");
  const at::Tensor want =
      models::SafetensorsFile((root / "a" / "final.safetensors").string()).get("latents");
  GenerationRequest off = r;
  off.lora_scales["a"] = 0.0;
  const auto zero = model->generate(off);
  const auto plain = base->generate(r);
  EXPECT_TRUE(at::equal(zero.latents, plain.latents)) << "scale 0 vs no adapter";
  EXPECT_TRUE(at::equal(zero.images, plain.images));
  const auto back = model->generate(r);  // the load scale again
  EXPECT_LE(xfuser::testing::max_rel_error(back.latents, want), 1e-4);
  GenerationRequest half = r;
  half.lora_scales["a"] = 0.4;
  const auto mid = model->generate(half);
  EXPECT_GT(xfuser::testing::max_rel_error(mid.latents, plain.latents), 1e-3);
  EXPECT_GT(xfuser::testing::max_rel_error(mid.latents, want), 1e-3);
  // Fused adapters have their scale in the weights: another scale is refused, naming the mode.
  auto fused = load(folder, case_adapters(root, c), true);
  try {
    fused->generate(half);
    FAIL() << "a fused adapter ran at another scale";
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--lora_mode unfused"), std::string::npos) << e.what();
  }
  GenerationRequest unknown = r;
  unknown.lora_scales["nope"] = 1.0;
  EXPECT_THROW(model->generate(unknown), xfuser::Error);
}

TEST(Lora, ParseSpec) {
  auto s = models::parse_lora_spec("style.safetensors:0.7", "--lora");
  EXPECT_EQ(s.path, "style.safetensors");
  EXPECT_DOUBLE_EQ(s.scale, 0.7);
  s = models::parse_lora_spec("/data/a:b/style.safetensors", "--lora");
  EXPECT_EQ(s.path, "/data/a:b/style.safetensors");
  EXPECT_DOUBLE_EQ(s.scale, 1.0);
  s = models::parse_lora_spec("x.safetensors:-1.5e-1", "--lora");
  EXPECT_DOUBLE_EQ(s.scale, -0.15);
  EXPECT_THROW(models::parse_lora_spec(":0.5", "--lora"), xfuser::Error);
}

// Column- and row-parallel layers take their slices of the adapter as of the weight: the parts'
// outputs, gathered or summed, equal the unsharded layer with the update fused, fused or not.
TEST(Lora, TensorParallelSlicesEqualTheWholeLayer) {
  const int64_t in = 12, out = 8, r = 3;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto randn = [&](std::vector<int64_t> shape) {
    return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat));
  };
  const at::Tensor w = randn({out, in}), b = randn({out}), down = randn({r, in}),
                   up = randn({out, r}), up_bias = randn({out}), x = randn({2, 5, in});
  // Row-parallel: the weight [out, in'] with in' = out for a square second layer.
  const at::Tensor w2 = randn({in, out}), b2 = randn({in}), down2 = randn({r, out}),
                   up2 = randn({in, r}), x2 = randn({2, 5, out});
  models::TensorMapSource source(
      {{"col.weight", w}, {"col.bias", b}, {"row.weight", w2}, {"row.bias", b2}});
  models::LoraAdapter adapter;
  adapter.name = "t";
  adapter.path = "memory";
  models::LoraUpdate uc{"col.lora_A.weight", {"col"}, down, up, up_bias, 0.5};
  models::LoraUpdate ur{"row.lora_A.weight", {"row"}, down2, up2, at::Tensor(), 2.0};
  adapter.components["transformer"] = {uc, ur};
  auto scale = std::make_shared<double>(0.75);
  const double sc = 0.75 * 0.5, sr = 0.75 * 2.0;
  const at::Tensor want_col = at::linear(x, w + sc * at::matmul(up, down), b + sc * up_bias);
  const at::Tensor want_row = at::linear(x2, w2 + sr * at::matmul(up2, down2), b2);

  struct Pair : models::Module {
    std::shared_ptr<models::ColumnParallelLinear> col;
    std::shared_ptr<models::RowParallelLinear> row;
    explicit Pair(const models::TensorParallel& tp, int64_t in, int64_t out) {
      col = child("col", std::make_shared<models::ColumnParallelLinear>(in, out, tp));
      row = child("row", std::make_shared<models::RowParallelLinear>(out, in, tp));
    }
  };
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    auto lora = std::make_shared<models::ComponentLora>();
    lora->component = "transformer";
    lora->fused = fused;
    for (const auto& u : adapter.components["transformer"]) {
      lora->entries.push_back({&adapter, &u, scale});
    }
    models::LoadOptions options;
    options.lora = lora;
    std::vector<at::Tensor> cols;
    at::Tensor row_sum;
    for (int part = 0; part < 2; ++part) {
      Pair m(models::TensorParallel{part, 2}, in, out);
      m.load(source, at::kFloat, "", options);
      cols.push_back(m.col->forward(x));
      models::TensorParallelOps ops;
      at::Tensor partial;
      ops.all_reduce = [&](at::Tensor& t) { partial = t.clone(); };
      // The row layer's input is this part's columns of x2.
      const at::Tensor local = x2.narrow(-1, part * out / 2, out / 2);
      at::Tensor y = m.row->forward(local, ops);
      // forward added the bias after the (stubbed) reduction: keep the partial sum only.
      row_sum = row_sum.defined() ? row_sum + partial : partial;
    }
    EXPECT_LE(xfuser::testing::max_rel_error(at::cat(cols, -1), want_col), 1e-5);
    EXPECT_LE(xfuser::testing::max_rel_error(row_sum + b2, want_row), 1e-5);
  }
}

// Bad adapters fail at load, naming the file, the key and the module.
class LoraErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = xfuser::testing::fixtures_dir() / "pipelines" / "flux-tiny";
    XF_REQUIRE_FIXTURE(folder_);
    const auto t = models::SafetensorsFile(
        (folder_ / "transformer" / "diffusion_pytorch_model.safetensors").string());
    q_ = t.info("transformer_blocks.0.attn.to_q.weight").shape;
  }
  std::string error_of(const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const std::string& flag_target = "") {
    const fs::path file = tmp_ / "bad.safetensors";
    models::save_safetensors(file.string(), tensors, metadata);
    models::LoraSpec spec;
    spec.path = file.string();
    spec.target = flag_target;
    try {
      load(folder_, {spec}, true);
    } catch (const xfuser::Error& e) {
      return e.what();
    }
    return "";
  }
  at::Tensor zeros(std::vector<int64_t> shape) { return at::zeros(shape); }
  xfuser::testing::TempDir tmp_{"xfuser-lora"};
  fs::path folder_;
  std::vector<int64_t> q_;  // [out, in] of to_q
};

TEST_F(LoraErrors, UnknownModule) {
  const std::string e =
      error_of({{"transformer.transformer_blocks.0.attn.to_z.lora_A.weight", zeros({2, q_[1]})},
                {"transformer.transformer_blocks.0.attn.to_z.lora_B.weight", zeros({q_[0], 2})}});
  EXPECT_NE(e.find("bad.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("transformer_blocks.0.attn.to_z"), std::string::npos) << e;
  EXPECT_NE(e.find("does not have"), std::string::npos) << e;
}

TEST_F(LoraErrors, ShapeThatDoesNotFit) {
  std::string e =
      error_of({{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", zeros({2, q_[1] + 1})},
                {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", zeros({q_[0], 2})}});
  EXPECT_NE(e.find("does not fit 'transformer.transformer_blocks.0.attn.to_q'"), std::string::npos)
      << e;
  e = error_of(
      {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", zeros({2, q_[1]})},
       {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", zeros({q_[0] * 2, 2})}});
  EXPECT_NE(e.find("output rows"), std::string::npos) << e;
}

TEST_F(LoraErrors, RankMismatch) {
  std::string e =
      error_of({{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", zeros({2, q_[1]})},
                {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", zeros({q_[0], 3})}});
  EXPECT_NE(e.find("rank mismatch"), std::string::npos) << e;
  EXPECT_NE(e.find("transformer_blocks.0.attn.to_q"), std::string::npos) << e;
  // The header's configuration disagrees with the weights.
  e = error_of({{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", zeros({2, q_[1]})},
                {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", zeros({q_[0], 2})}},
               {{"lora_adapter_metadata", R"({"transformer.r": 4, "transformer.lora_alpha": 4})"}});
  EXPECT_NE(e.find("lora_adapter_metadata gives r = 4"), std::string::npos) << e;
}

TEST_F(LoraErrors, OtherKindsAndOtherFamiliesAreNamed) {
  std::string e = error_of({{"lora_unet_double_blocks_0_img_attn_qkv.lokr_w1", zeros({2, 2})}});
  EXPECT_NE(e.find("LoKr"), std::string::npos) << e;
  e = error_of(
      {{"transformer.transformer_blocks.0.attn.to_q.lora_magnitude_vector", zeros({q_[0]})},
       {"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", zeros({2, q_[1]})},
       {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", zeros({q_[0], 2})}});
  EXPECT_NE(e.find("DoRA"), std::string::npos) << e;
  // A Wan adapter in musubi-tuner's layout given to FLUX.1: kohya-style names FLUX does not have.
  e = error_of({{"lora_unet_blocks_0_self_attn_q.lora_down.weight", zeros({2, q_[1]})},
                {"lora_unet_blocks_0_self_attn_q.lora_up.weight", zeros({q_[0], 2})}});
  EXPECT_NE(e.find("lora_unet_blocks_0_self_attn_q"), std::string::npos) << e;
  EXPECT_NE(e.find("no FLUX.1 module"), std::string::npos) << e;
  // The original Wan layout given to FLUX.1: read as a model's own PEFT file, whose modules
  // FLUX does not have.
  e = error_of({{"diffusion_model.blocks.0.self_attn.q.lora_A.weight", zeros({2, q_[1]})},
                {"diffusion_model.blocks.0.self_attn.q.lora_B.weight", zeros({q_[0], 2})}});
  EXPECT_NE(e.find("diffusion_model.blocks.0.self_attn.q"), std::string::npos) << e;
  EXPECT_NE(e.find("does not have"), std::string::npos) << e;
  // Neither a LoRA layout nor a family's.
  e = error_of({{"model.layers.0.weight", zeros({2, 2})}});
  EXPECT_NE(e.find("not a LoRA layout xfuser reads"), std::string::npos) << e;
  // A Wan diffusers-layout adapter: the right layout, modules FLUX does not have.
  e = error_of({{"transformer.blocks.0.attn1.to_q.lora_A.weight", zeros({2, q_[1]})},
                {"transformer.blocks.0.attn1.to_q.lora_B.weight", zeros({q_[0], 2})}});
  EXPECT_NE(e.find("blocks.0.attn1.to_q"), std::string::npos) << e;
  // A component the family's loader does not adapt.
  e = error_of(
      {{"text_encoder_2.encoder.block.0.layer.0.SelfAttention.q.lora_A.weight", zeros({2, 4})},
       {"text_encoder_2.encoder.block.0.layer.0.SelfAttention.q.lora_B.weight", zeros({4, 2})}});
  EXPECT_NE(e.find("adapt only: transformer, text_encoder"), std::string::npos) << e;
  // --lora_2 on a model without a second expert.
  e = error_of({{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", zeros({2, q_[1]})},
                {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", zeros({q_[0], 2})}},
               {}, "transformer_2");
  EXPECT_NE(e.find("transformer_2"), std::string::npos) << e;
  // A layer that is not Linear.
  e = error_of({{"transformer.transformer_blocks.0.norm1.norm.lora_A.weight", zeros({2, 4})},
                {"transformer.transformer_blocks.0.norm1.norm.lora_B.weight", zeros({4, 2})}});
  EXPECT_NE(e.find("norm1.norm"), std::string::npos) << e;
}

}  // namespace

namespace {

// CPU offload (whole components, or the transformer's blocks streamed) holds the adapters as it
// holds the weights: the same result as without. FP8 weights take a fused adapter before they are
// quantized, and an unfused one runs beside them in the compute dtype: the adapter's change
// survives the fp8 rounding (measured against the fp32 run with the adapter).
TEST(Lora, OffloadAndFp8WeightsKeepTheAdapter) {
  const std::string name = "flux-tiny";
  const fs::path root = lora_root(name);
  XF_REQUIRE_FIXTURE(root / "ab");
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / name;
  const auto c = xfuser::testing::read_json(root / "ab" / "case.json");
  const GenerationRequest r = case_request(name, root / "ab");
  auto run = [&](bool fused, bool with_adapters, models::OffloadMode offload,
                 models::WeightFormat::Kind weights) {
    const auto& spec = ModelRegistry::for_pipeline_folder(folder);
    auto model = spec.create(spec);
    models::ModelLoadOptions options;
    if (with_adapters) options.lora = case_adapters(root, c);
    options.lora_fused = fused;
    options.offload = offload;
    options.transformer_weights.kind = weights;
    model->load(folder, options);
    return model->generate(r).latents;
  };
  using K = models::WeightFormat::Kind;
  const at::Tensor base = run(true, false, models::OffloadMode::kNone, K::kAsLoaded);
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    const at::Tensor want = run(fused, true, models::OffloadMode::kNone, K::kAsLoaded);
    const double effect = xfuser::testing::max_rel_error(want, base);
    ASSERT_GT(effect, 1e-2);
    for (const auto mode : {models::OffloadMode::kModel, models::OffloadMode::kSequential}) {
      const at::Tensor got = run(fused, true, mode, K::kAsLoaded);
      EXPECT_LE(xfuser::testing::max_rel_error(got, want), 1e-6)
          << models::offload_mode_name(mode) << " offload";
    }
    for (const auto kind : {K::kFp8Storage, K::kFp8Scaled}) {
      const at::Tensor fp8_base = run(true, false, models::OffloadMode::kNone, kind);
      const at::Tensor got = run(fused, true, models::OffloadMode::kNone, kind);
      const double err = xfuser::testing::max_rel_error(got, want);
      const double base_err = xfuser::testing::max_rel_error(fp8_base, base);
      std::printf(
          "%s %s: vs fp32 with the adapter %.2e (fp8 without adapters vs fp32: %.2e; "
          "the adapter's change %.2e)\n",
          fused ? "fused" : "unfused", kind == K::kFp8Storage ? "fp8 storage" : "fp8 GEMMs", err,
          base_err, effect);
      // fp8's own rounding, not a lost or doubled adapter.
      EXPECT_LE(err, 2 * base_err + 1e-3);
      EXPECT_LT(err, 0.5 * effect);
    }
  }
}

// kohya's single-block linear1 (BFL's fused q, k, v and MLP input) splits its up rows by the
// targets' widths, which diffusers' converter fixes at FLUX.1-dev's: the same as the PEFT file
// that names the four layers; final_layer_adaLN_modulation_1 swaps BFL's (shift, scale) halves.
TEST(Lora, KohyaFusedProjectionsSplitByTheModelsWidths) {
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / "flux-tiny";
  const fs::path root = lora_root("flux-tiny");
  XF_REQUIRE_FIXTURE(root / "a");
  const auto t = models::SafetensorsFile(
      (folder / "transformer" / "diffusion_pytorch_model.safetensors").string());
  const int64_t d = t.info("single_transformer_blocks.0.attn.to_q.weight").shape[0];
  const int64_t mlp = t.info("single_transformer_blocks.0.proj_mlp.weight").shape[0];
  const auto mod = t.info("norm_out.linear.weight").shape;  // [2 D, D]
  const int64_t r = 4;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  auto randn = [&](std::vector<int64_t> s, double std) {
    return at::randn(s, gen, at::TensorOptions().dtype(at::kFloat)) * std;
  };
  const at::Tensor down = randn({r, d}, 0.1), up = randn({3 * d + mlp, r}, 0.1);
  const at::Tensor fdown = randn({r, mod[1]}, 0.1), fup = randn({mod[0], r}, 0.1);
  const double alpha = 2.0;  // factor alpha / r = 0.5
  xfuser::testing::TempDir tmp("xfuser-lora-kohya");
  models::save_safetensors((tmp / "kohya.safetensors").string(),
                           {{"lora_unet_single_blocks_0_linear1.lora_down.weight", down},
                            {"lora_unet_single_blocks_0_linear1.lora_up.weight", up},
                            {"lora_unet_single_blocks_0_linear1.alpha", at::full({}, alpha)},
                            {"lora_unet_final_layer_adaLN_modulation_1.lora_down.weight", fdown},
                            {"lora_unet_final_layer_adaLN_modulation_1.lora_up.weight", fup}});
  std::map<std::string, at::Tensor> peft;
  const std::vector<std::pair<std::string, int64_t>> parts = {
      {"attn.to_q", d}, {"attn.to_k", d}, {"attn.to_v", d}, {"proj_mlp", mlp}};
  int64_t row = 0;
  for (const auto& [m, rows] : parts) {
    const std::string k = "transformer.single_transformer_blocks.0." + m;
    peft[k + ".lora_A.weight"] = down * (alpha / r);
    peft[k + ".lora_B.weight"] = up.narrow(0, row, rows).clone();
    row += rows;
  }
  const auto halves = fup.chunk(2, 0);
  peft["transformer.norm_out.linear.lora_A.weight"] = fdown;
  peft["transformer.norm_out.linear.lora_B.weight"] = at::cat({halves[1], halves[0]}, 0);
  models::save_safetensors((tmp / "peft.safetensors").string(), peft);
  const GenerationRequest req = case_request("flux-tiny", root / "a");
  for (const bool fused : {true, false}) {
    models::LoraSpec k, p;
    k.path = (tmp / "kohya.safetensors").string();
    p.path = (tmp / "peft.safetensors").string();
    const auto a = load(folder, {k}, fused)->generate(req).latents;
    const auto b = load(folder, {p}, fused)->generate(req).latents;
    const auto plain = load(folder, {}, true)->generate(req).latents;
    EXPECT_LE(xfuser::testing::max_rel_error(a, b), 1e-6) << (fused ? "fused" : "unfused");
    EXPECT_GT(xfuser::testing::max_rel_error(a, plain), 1e-3) << "the adapter changed nothing";
  }
}

}  // namespace

namespace {

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// xfuser-run end to end: --lora PATH:SCALE from the command line gives diffusers' final latents
// (from the case's initial latents through --latents), records the adapter in the PNG text, and
// a missing file or an unknown mode is refused with a non-zero exit; `xfuser validate` checks the
// adapters against the components.
TEST(Lora, XfuserRunLoraFlags) {
  const std::string name = "flux-tiny";
  const fs::path root = lora_root(name);
  const fs::path dir = root / "ab";
  XF_REQUIRE_FIXTURE(dir);
  const fs::path folder = xfuser::testing::fixtures_dir() / "pipelines" / name;
  const auto c = xfuser::testing::read_json(dir / "case.json");
  const std::string binary = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
  xfuser::testing::TempDir out("xfuser-lora-run");
  std::string args =
      " --model_path " + quoted(folder.string()) + " --prompt " +
      quoted(c["prompt"].get<std::string>()) + " --height " +
      std::to_string(c["height"].get<int>()) + " --width " + std::to_string(c["width"].get<int>()) +
      " --num_inference_steps " + std::to_string(c["num_inference_steps"].get<int>()) +
      " --guidance_scale " + std::to_string(c["guidance_scale"].get<double>()) +
      " --max_sequence_length " + std::to_string(c["max_sequence_length"].get<int>()) +
      " --dtype fp32 --save_latents --latents " + quoted((dir / "latents.safetensors").string());
  for (const auto& a : c["lora"]["adapters"]) {
    args += " --lora " + quoted((root / a["file"].get<std::string>()).string() + ":" +
                                std::to_string(a["scale"].get<double>()));
  }
  for (const char* mode : {"fused", "unfused"}) {
    SCOPED_TRACE(mode);
    const fs::path o = out / mode;
    std::string log;
    ASSERT_EQ(xfuser::testing::run_command(binary + args + " --lora_mode " + mode +
                                               " --output_directory " + quoted(o.string()),
                                           &log),
              0)
        << log;
    fs::path png, latents;
    for (const auto& e : fs::directory_iterator(o)) {
      const std::string f = e.path().filename().string();
      if (f.size() > 4 && f.compare(f.size() - 4, 4, ".png") == 0) png = e.path();
      if (f.find(".latents.safetensors") != std::string::npos) latents = e.path();
    }
    ASSERT_FALSE(png.empty()) << log;
    std::map<std::string, std::string> text;
    xfuser::runner::read_png(png, &text);
    EXPECT_EQ(text["lora"].rfind(mode, 0), 0u) << text["lora"];
    EXPECT_NE(text["lora"].find("a.safetensors@"), std::string::npos) << text["lora"];
    EXPECT_NE(text["lora"].find("b.safetensors@"), std::string::npos) << text["lora"];
    EXPECT_NE(text["lora"].find(":-0.5"), std::string::npos) << text["lora"];
    const at::Tensor got = models::SafetensorsFile(latents.string()).get("final_latents");
    const at::Tensor want =
        models::SafetensorsFile((dir / "final.safetensors").string()).get("latents");
    EXPECT_LE(xfuser::testing::max_rel_error(got, want), 1e-4);
  }
  // `xfuser validate` reads the adapters and checks them against the components, loading no
  // weight data: the run's adapters pass, a Wan adapter given to FLUX.1 fails naming its module.
  const std::string tool = (xfuser::testing::binary_dir() / "bin" / "xfuser").string();
  std::string log;
  EXPECT_EQ(xfuser::testing::run_command(tool + " validate" + args, &log), 0) << log;
  EXPECT_NE(log.find("transformer: LoRA ok"), std::string::npos) << log;
  EXPECT_NE(log.find("text_encoder: LoRA ok"), std::string::npos) << log;
  const fs::path wan = lora_root("wan-t2v-tiny") / "adapters" / "a.safetensors";
  EXPECT_NE(
      xfuser::testing::run_command(tool + " validate --model_path " + quoted(folder.string()) +
                                       " --prompt x --lora " + quoted(wan.string()),
                                   &log),
      0);
  EXPECT_NE(log.find("which the model (transformer) does not have"), std::string::npos) << log;
  EXPECT_NE(log.find("blocks.0.attn"), std::string::npos) << log;
  EXPECT_NE(xfuser::testing::run_command(binary + " --model_path " + quoted(folder.string()) +
                                             " --prompt x --lora /nonexistent/style.safetensors",
                                         &log),
            0);
  EXPECT_NE(log.find("/nonexistent/style.safetensors: no such file"), std::string::npos) << log;
  EXPECT_NE(xfuser::testing::run_command(binary + " --model_path " + quoted(folder.string()) +
                                             " --prompt x --lora_mode half",
                                         &log),
            0);
  EXPECT_NE(log.find("--lora_mode"), std::string::npos) << log;
}

}  // namespace
