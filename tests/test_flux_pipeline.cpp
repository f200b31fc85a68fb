// The FLUX pipeline on the tiny model: packing, ids, schedule and determinism of the stages.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "backends/error.h"
#include "models/flux/flux_pipeline.h"
#include "models/flux/tiny_flux.h"
#include "models/registry.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::GenerationRequest;
using xfuser::models::ModelRegistry;
using xfuser::models::flux::FluxModel;

class TinyFlux : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new xfuser::testing::TempDir("tiny-flux");
    xfuser::models::flux::make_tiny_flux(dir_->path() / "pipe", 0);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static fs::path pipe() { return dir_->path() / "pipe"; }
  static std::unique_ptr<xfuser::models::XFuserModel> load(c10::ScalarType dtype) {
    const auto& spec = ModelRegistry::find("tiny-flux");
    auto model = spec.create(spec);
    xfuser::models::ModelLoadOptions opts;
    opts.dtype = dtype;
    model->load(pipe(), opts);
    return model;
  }
  static GenerationRequest request(std::vector<std::string> prompts, int64_t seed) {
    GenerationRequest r;
    r.prompts = prompts;
    r.height = 64;
    r.width = 96;
    r.num_inference_steps = 3;
    r.guidance_scale = 3.5;
    r.max_sequence_length = 16;
    r.seeds.assign(prompts.size(), seed);
    return r;
  }
  static xfuser::testing::TempDir* dir_;
};
xfuser::testing::TempDir* TinyFlux::dir_ = nullptr;

TEST(FluxPacking, PackUnpackRoundTripAndChannelOrder) {
  at::Tensor x = at::randn({2, 16, 6, 8});
  at::Tensor packed = FluxModel::pack_latents(x);
  ASSERT_EQ(packed.sizes(), (std::vector<int64_t>{2, 12, 64}));
  // token (r, c) channel (ch*4 + py*2 + px) = x[ch, 2r+py, 2c+px]
  EXPECT_EQ(packed[1][1 * 4 + 2][5 * 4 + 1 * 2 + 0].item<float>(),
            x[1][5][2 * 1 + 1][2 * 2 + 0].item<float>());
  EXPECT_TRUE(at::equal(FluxModel::unpack_latents(packed, 6, 8), x));
  EXPECT_THROW(FluxModel::pack_latents(at::randn({1, 16, 5, 8})), xfuser::Error);
}

TEST(FluxPacking, LatentImageIdsAreRowMajor) {
  at::Tensor ids = FluxModel::latent_image_ids(2, 3, at::kFloat);
  ASSERT_EQ(ids.sizes(), (std::vector<int64_t>{6, 3}));
  at::Tensor want =
      at::tensor({0, 0, 0, 0, 0, 1, 0, 0, 2, 0, 1, 0, 0, 1, 1, 0, 1, 2}, at::kFloat).view({6, 3});
  EXPECT_TRUE(at::equal(ids, want));
}

TEST_F(TinyFlux, FolderHasEveryComponent) {
  for (const char* f :
       {"model_index.json", "scheduler/scheduler_config.json", "text_encoder/config.json",
        "text_encoder/model.safetensors", "text_encoder_2/model.safetensors",
        "tokenizer/vocab.json", "tokenizer/merges.txt", "tokenizer_2/spiece.model",
        "transformer/diffusion_pytorch_model.safetensors",
        "vae/diffusion_pytorch_model.safetensors"}) {
    EXPECT_TRUE(fs::exists(pipe() / f)) << f;
  }
}

TEST_F(TinyFlux, SameSeedIsBitIdenticalAcrossRunsAndFolders) {
  auto model = load(at::kFloat);
  auto a = model->generate(request({"a cat"}, 7));
  auto b = model->generate(request({"a cat"}, 7));
  ASSERT_EQ(a.images.sizes(), (std::vector<int64_t>{1, 64, 96, 3}));
  EXPECT_EQ(a.images.scalar_type(), at::kByte);
  EXPECT_TRUE(at::equal(a.images, b.images));
  // Stage timings: encode, latents, 3 steps, decode.
  ASSERT_EQ(a.timings.size(), 6u);
  EXPECT_EQ(a.timings[2].name, "denoise_step");
  EXPECT_EQ(a.timings[4].index, 2);
  // A second folder made with the same seed gives the same weights and image.
  xfuser::testing::TempDir other("tiny-flux-2");
  xfuser::models::flux::make_tiny_flux(other.path() / "pipe", 0);
  const auto& spec = ModelRegistry::find("tiny-flux");
  auto model2 = spec.create(spec);
  model2->load(other.path() / "pipe", {});
  EXPECT_TRUE(at::equal(model2->generate(request({"a cat"}, 7)).images, a.images));
}

TEST_F(TinyFlux, SeedPromptAndTrueCfgChangeTheImage) {
  auto model = load(at::kFloat);
  auto base = model->generate(request({"a cat"}, 7)).images;
  EXPECT_FALSE(at::equal(base, model->generate(request({"a cat"}, 8)).images));
  EXPECT_FALSE(at::equal(base, model->generate(request({"a red sports car"}, 7)).images));
  auto cfg = request({"a cat"}, 7);
  cfg.negative_prompts = {"a dog"};
  cfg.true_cfg_scale = 4.0;
  EXPECT_FALSE(at::equal(base, model->generate(cfg).images));
  // A negative prompt without true_cfg_scale > 1 does nothing, as in diffusers.
  cfg.true_cfg_scale = 1.0;
  EXPECT_TRUE(at::equal(base, model->generate(cfg).images));
}

TEST_F(TinyFlux, BatchEqualsSinglePromptRuns) {
  auto model = load(at::kFloat);
  auto batch = model->generate(request({"a cat", "an owl on a branch"}, 7)).images;
  auto one = model->generate(request({"a cat"}, 7)).images;
  auto two = model->generate(request({"an owl on a branch"}, 7)).images;
  // fp32 batched matmuls may round differently: allow one level of 8-bit quantisation.
  EXPECT_LE((batch[0].to(at::kInt) - one[0].to(at::kInt)).abs().max().item<int>(), 1);
  EXPECT_LE((batch[1].to(at::kInt) - two[0].to(at::kInt)).abs().max().item<int>(), 1);
}

TEST_F(TinyFlux, Bf16RunsAndStaysCloseToFp32) {
  auto f32 = load(at::kFloat)->generate(request({"a cat"}, 3)).images.to(at::kFloat);
  auto b16 = load(at::kBFloat16)->generate(request({"a cat"}, 3)).images.to(at::kFloat);
  // bf16 noise is drawn in bf16 (as diffusers' randn_tensor does), so compare loosely.
  EXPECT_LT((f32 - b16).abs().mean().item<double>(), 32.0);
}

// --enable_tiling / --enable_slicing reach the pipeline's VAE (ModelLoadOptions, as the runner
// passes them): slicing decodes the same images; tiling (a 320-pixel-high image is 40 latent
// rows, above the tiny VAE's 32-row tile) blends tiles, so the same latents give other pixels.
TEST_F(TinyFlux, VaeTilingAndSlicingOptionsReachTheDecoder) {
  auto load_with = [](bool tiling, bool slicing, bool parallel_vae = false) {
    const auto& spec = ModelRegistry::find("tiny-flux");
    auto model = spec.create(spec);
    xfuser::models::ModelLoadOptions opts;
    opts.enable_tiling = tiling;
    opts.enable_slicing = slicing;
    opts.parallel_vae = parallel_vae;
    model->load(pipe(), opts);
    return model;
  };
  auto req = request({"a cat", "a dog"}, 5);
  req.height = 320;
  req.width = 64;
  req.num_inference_steps = 1;
  auto plain = load_with(false, false)->generate(req);
  auto sliced = load_with(false, true)->generate(req);
  auto tiled = load_with(true, false)->generate(req);
  EXPECT_TRUE(at::equal(sliced.latents, plain.latents));
  EXPECT_LE((sliced.images.to(at::kInt) - plain.images.to(at::kInt)).abs().max().item<int>(), 1);
  EXPECT_TRUE(at::equal(tiled.latents, plain.latents));
  EXPECT_GT((tiled.images.to(at::kInt) - plain.images.to(at::kInt)).abs().max().item<int>(), 1);
  try {
    load_with(true, false, true);
    FAIL() << "--use_parallel_vae with --enable_tiling was accepted";
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--use_parallel_vae and --enable_tiling"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(TinyFlux, BadRequestsAreNamed) {
  auto model = load(at::kFloat);
  auto r = request({"a cat"}, 1);
  r.height = 72;
  try {
    model->generate(r);
    FAIL();
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--height 72 must be a positive multiple of 16"),
              std::string::npos)
        << e.what();
  }
  r = request({"a cat"}, 1);
  r.num_inference_steps = 0;
  EXPECT_THROW(model->generate(r), xfuser::Error);
}

TEST_F(TinyFlux, MissingComponentFolderIsNamed) {
  xfuser::testing::TempDir broken("tiny-flux-broken");
  fs::copy(pipe(), broken.path() / "pipe", fs::copy_options::recursive);
  fs::remove_all(broken.path() / "pipe" / "tokenizer_2");
  const auto& spec = ModelRegistry::find("tiny-flux");
  auto model = spec.create(spec);
  try {
    model->load(broken.path() / "pipe", {});
    FAIL();
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no tokenizer_2/ folder"), std::string::npos)
        << e.what();
  }
}

TEST(ByteBpe, LearnsFrequentPairsFirst) {
  auto [vocab, merges] = xfuser::models::flux::train_byte_bpe({"the the the then", "that"}, 3);
  ASSERT_EQ(merges.size(), 3u);
  EXPECT_EQ(merges[0], (std::pair<std::string, std::string>{"t", "h"}));
  EXPECT_EQ(vocab.size(), 512u + 3u + 2u);
  EXPECT_EQ(vocab[512], "th");
  EXPECT_EQ(vocab.back(), "<|endoftext|>");
  EXPECT_EQ(vocab[0], "!");
}

}  // namespace
