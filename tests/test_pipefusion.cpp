// PipeFusion for FLUX (models/flux/flux_pipefusion.h) on the embedded tiny-flux pipeline
// (2 double + 2 single blocks, 2 heads): stage partition and patch layout, partial loading,
// flag validation, and under mpiexec (2 and 4 ranks) the pipeline against the one-rank result:
// - all steps warm-up (exact): final latents (fp32) within 1e-5 of serial, images within 1/255;
// - 1 warm-up step (stale K/V): PSNR vs serial above a justified bound, and sub-splitting the
//   patches over ulysses/ring inside the stages changes nothing (same staleness, exact SP).
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "backends/error.h"
#include "models/flux/flux_pipefusion.h"
#include "models/flux/flux_pipeline.h"
#include "models/flux/flux_transformer.h"
#include "models/flux/tiny_flux.h"
#include "models/registry.h"
#include "models/weights/component_folder.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/world_config.h"
#include "runner/run_config.h"
#include "tests/test_util.h"

namespace {

using xfuser::models::GenerationOutput;
using xfuser::models::GenerationRequest;
using xfuser::models::ModelRegistry;
using xfuser::models::flux::FluxConfig;
using xfuser::models::flux::FluxTransformer2DModel;
using xfuser::parallel::MpiCommunicator;
using xfuser::parallel::ProcessGroups;
using xfuser::parallel::WorldConfig;
namespace flux = xfuser::models::flux;

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const xfuser::Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

class PipeFusion : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    world_ = std::make_shared<MpiCommunicator>("world", std::chrono::seconds(60));
    setenv("XFUSER_CACHE", (xfuser::testing::binary_dir() / "test-cache").c_str(), 1);
    dir_ = new std::filesystem::path(flux::ensure_tiny_flux(0));
  }
  static void TearDownTestSuite() {
    delete dir_;
    world_.reset();
  }
  static std::unique_ptr<xfuser::models::XFuserModel> load(std::shared_ptr<ProcessGroups> groups,
                                                           std::vector<int64_t> layers = {}) {
    const auto& spec = ModelRegistry::find("tiny-flux");
    auto model = spec.create(spec);
    model->set_process_groups(std::move(groups));
    xfuser::models::ModelLoadOptions options;
    options.pipefusion_layers = std::move(layers);
    model->load(*dir_, options);
    return model;
  }
  // 64x48 -> 4 token rows x 3 columns (12 image tokens).
  static GenerationRequest request(int steps, int warmup, int patches, bool cfg, int text_len = 8) {
    GenerationRequest r;
    r.prompts = {"a cat on a sofa", "an owl at night"};
    r.height = 64;
    r.width = 48;
    r.num_inference_steps = steps;
    r.guidance_scale = 3.5;
    r.max_sequence_length = text_len;
    r.seeds = {11, 12};
    r.num_pipeline_patch = patches;
    r.pipefusion_warmup_steps = warmup;
    if (cfg) {
      r.negative_prompts = {"blurry", "dark"};
      r.true_cfg_scale = 3.0;
    }
    return r;
  }
  static std::shared_ptr<ProcessGroups> groups(int cfg, int pp, int ulysses, int ring) {
    const int world = world_->size();
    const int dp = world / (cfg * pp * ulysses * ring);
    return std::make_shared<ProcessGroups>(
        WorldConfig::from_degrees(world, dp, cfg, pp, ulysses, ring, 1), world_);
  }
  static void expect_same(const GenerationOutput& par, const GenerationOutput& ref,
                          const std::string& what, double tol = 1e-5) {
    const double rel = xfuser::testing::max_rel_error(par.latents, ref.latents);
    EXPECT_LE(rel, tol) << what;
    const int pixel = (par.images.to(at::kInt) - ref.images.to(at::kInt)).abs().max().item<int>();
    EXPECT_LE(pixel, 1) << what;
    if (world_rank() == 0)
      std::printf("%-44s latents rel %.2e, max pixel diff %d\n", what.c_str(), rel, pixel);
  }
  static std::shared_ptr<MpiCommunicator> world_;
  static std::filesystem::path* dir_;
};
std::shared_ptr<MpiCommunicator> PipeFusion::world_;
std::filesystem::path* PipeFusion::dir_ = nullptr;

// ---- one rank: partition, layout, partial models, flags
// ------------------------------------------

TEST(PipeFusionLayout, BalancedSplitMinimisesTheLargestStage) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(flux::balanced_stage_layers(V(6, 1), 3), (V{2, 2, 2}));
  EXPECT_EQ(flux::balanced_stage_layers({5, 1, 1, 1, 1, 1}, 2), (V{1, 5}));
  EXPECT_EQ(flux::balanced_stage_layers({1, 1, 1, 1}, 2, 2, 0), (V{1, 3}));  // stage 0 extra
  EXPECT_EQ(flux::balanced_stage_layers({1, 1, 1, 1}, 4), (V{1, 1, 1, 1}));
}

TEST(PipeFusionLayout, StageLayersBalancedByParametersOrExplicit) {
  FluxConfig dev;  // diffusers' defaults: FLUX.1 (19 double + 38 single blocks)
  dev.guidance_embeds = true;
  const auto blocks = flux::flux_block_parameters(dev);
  ASSERT_EQ(blocks.size(), 57u);
  // A double block: 36 D^2 weights (AdaLN 2 x 6D^2, attention 8 D^2, two MLPs 16 D^2), 30 D
  // biases and four RMSNorm scales of the head dim; a single block: 15 D^2 (AdaLN 3, q/k/v 3,
  // MLP 4, proj_out 5), 11 D biases, two RMSNorm scales.
  const int64_t d = dev.inner_dim(), hd = dev.attention_head_dim;
  EXPECT_EQ(blocks[0], 36 * d * d + 30 * d + 4 * hd);
  EXPECT_EQ(blocks[19], 15 * d * d + 11 * d + 2 * hd);
  const auto other = flux::flux_other_parameters(dev);
  int64_t total = other[0] + other[1] + other[2];
  for (auto b : blocks) total += b;
  for (int stages : {2, 3, 4}) {
    const auto layers = flux::pipefusion_stage_layers(dev, stages, {});
    int64_t begin = 0, largest = 0;
    for (int s = 0; s < stages; ++s) {
      int64_t w = other[1] + (s == 0 ? other[0] : 0) + (s + 1 == stages ? other[2] : 0);
      for (int64_t i = begin; i < begin + layers[s]; ++i) w += blocks[i];
      largest = std::max(largest, w);
      begin += layers[s];
    }
    EXPECT_EQ(begin, 57);
    // Within one double block of the ideal share.
    EXPECT_LE(static_cast<double>(largest), static_cast<double>(total) / stages + blocks[0])
        << stages << " stages";
  }
  EXPECT_EQ(flux::pipefusion_stage_layers(dev, 2, {10, 47}), (std::vector<int64_t>{10, 47}));
  EXPECT_TRUE(contains(error_of([&] {
                         flux::pipefusion_stage_layers(dev, 2, {10, 46});
                       }),
                       "sums to 56; the model has 57"));
  EXPECT_TRUE(contains(error_of([&] {
                         flux::pipefusion_stage_layers(dev, 2, {0, 57});
                       }),
                       "at least one block"));
  EXPECT_TRUE(contains(error_of([&] {
                         flux::pipefusion_stage_layers(dev, 3, {10, 47});
                       }),
                       "gives 2 stage(s)"));
  FluxConfig small = dev;
  small.num_layers = 2;
  small.num_single_layers = 2;
  EXPECT_TRUE(contains(error_of([&] { flux::pipefusion_stage_layers(small, 5, {}); }),
                       "exceeds the 4 transformer blocks"));
  auto part = flux::pipefusion_stage_part({10, 20, 27}, 1);
  EXPECT_EQ(part.block_begin, 10);
  EXPECT_EQ(part.block_end, 30);
  EXPECT_FALSE(part.embedders);
  EXPECT_FALSE(part.head);
  EXPECT_TRUE(flux::pipefusion_stage_part({10, 20, 27}, 0).embedders);
  EXPECT_TRUE(flux::pipefusion_stage_part({10, 20, 27}, 2).head);
}

TEST(PipeFusionLayout, PatchRows) {
  using Rows = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(flux::pipefusion_patch_rows(5, 2), (Rows{{0, 3}, {3, 5}}));
  EXPECT_EQ(flux::pipefusion_patch_rows(4, 4), (Rows{{0, 1}, {1, 2}, {2, 3}, {3, 4}}));
  EXPECT_TRUE(contains(error_of([] { flux::pipefusion_patch_rows(4, 5); }),
                       "--num_pipeline_patch 5 must be between 1 and the 4 latent token rows"));
}

TEST(PipeFusionLayout, ImagePsnr) {
  auto a = at::zeros({1, 4, 4, 3}, at::kByte);
  auto b = a.clone();
  EXPECT_TRUE(std::isinf(flux::image_psnr(a, b)));
  b.fill_(1);  // MSE 1 -> 20 log10(255)
  EXPECT_NEAR(flux::image_psnr(a, b), 20.0 * std::log10(255.0), 1e-9);
}

TEST(PipeFusionFlags, Validation) {
  using xfuser::runner::RunConfig;
  auto check = [](RunConfig c) { return error_of([&] { xfuser::runner::validate_values(c); }); };
  RunConfig c;
  c.pipefusion_parallel_degree = 2;
  EXPECT_EQ(check(c), "(no error)");
  c.pipefusion_warmup_steps = 0;
  EXPECT_TRUE(contains(check(c), "--pipefusion_warmup_steps must be >= 1 with 2 pipeline patches"));
  c.num_pipeline_patch = 1;  // one patch: a plain stage pipeline, no stale K/V
  EXPECT_EQ(check(c), "(no error)");
  c = RunConfig{};
  c.pipefusion_parallel_degree = 2;
  c.pipefusion_layers = {10, 20, 27};
  EXPECT_TRUE(contains(check(c), "--pipefusion_layers gives 3 stage(s)"));
  c.pipefusion_layers = {0, 57};
  EXPECT_TRUE(contains(check(c), "every stage needs at least one block"));
  c = RunConfig{};
  c.num_pipeline_patch = 4;
  EXPECT_TRUE(contains(check(c), "need --pipefusion_parallel_degree > 1"));
  c = RunConfig{};
  c.pipefusion_psnr = true;
  EXPECT_TRUE(contains(check(c), "need --pipefusion_parallel_degree > 1"));
}

// Two stage models (each loading only its part of the checkpoint) chained by hand equal the
// whole model; a stage holds fewer parameters.
TEST_F(PipeFusion, StagePartsChainToTheWholeModel) {
  auto folder = xfuser::models::open_component_folder((*dir_ / "transformer").string());
  auto config = FluxConfig::from_json(folder.config, folder.config_path);
  FluxTransformer2DModel whole(config);
  whole.load(*folder.weights, at::kFloat);
  for (const std::vector<int64_t>& layers :
       {std::vector<int64_t>{2, 2}, std::vector<int64_t>{1, 3}, std::vector<int64_t>{3, 1}}) {
    FluxTransformer2DModel a(config, flux::pipefusion_stage_part(layers, 0));
    FluxTransformer2DModel b(config, flux::pipefusion_stage_part(layers, 1));
    xfuser::models::LoadOptions partial;
    partial.allow_unexpected = true;
    a.load(*folder.weights, at::kFloat, "", partial);
    b.load(*folder.weights, at::kFloat, "", partial);
    EXPECT_LT(a.num_parameters(), whole.num_parameters());
    EXPECT_LT(b.num_parameters(), whole.num_parameters());
    // Strict loading still applies to the part's own tensors.
    EXPECT_TRUE(contains(error_of([&] {
                           FluxTransformer2DModel c(config, flux::pipefusion_stage_part(layers, 1));
                           c.load(*folder.weights, at::kFloat);
                         }),
                         "x_embedder"));

    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    flux::FluxInputs in;
    in.hidden_states = at::randn({1, 12, config.in_channels}, gen);
    in.encoder_hidden_states = at::randn({1, 5, config.joint_attention_dim}, gen);
    in.pooled_projections = at::randn({1, config.pooled_projection_dim}, gen);
    in.timestep = at::full({1}, 0.7);
    in.guidance = at::full({1}, 3.5);
    in.img_ids = at::randint(0, 4, {12, 3}, gen).to(at::kFloat);
    in.txt_ids = at::zeros({5, 3});
    auto st = a.embed(in);
    const int64_t nl = config.num_layers;
    a.run_double_blocks(st, 0, std::min(layers[0], nl));
    a.run_single_blocks(st, 0, std::max<int64_t>(layers[0] - nl, 0));
    auto next = b.embed(in);
    next.hidden = st.hidden;
    next.context = st.context;
    next.joined = st.joined;
    b.run_double_blocks(next, std::min(layers[0], nl), nl);
    b.run_single_blocks(next, std::max<int64_t>(layers[0] - nl, 0), config.num_single_layers);
    auto ref = whole.forward(in);
    EXPECT_LE(xfuser::testing::max_rel_error(b.finalize(next), ref), 1e-6)
        << layers[0] << "," << layers[1];
    EXPECT_TRUE(contains(error_of([&] { a.finalize(st); }), "norm_out/proj_out are not held"));
  }
}

// ---- under mpiexec -----------------------------------------------------------------------------

// All steps synchronous: the pipeline is exact, for every block split and patch count, with and
// without true CFG (both branches in one batch).
TEST_F(PipeFusion, WarmupThroughAllStepsEqualsSerial) {
  if (world_->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  auto serial = load(nullptr);
  for (const std::vector<int64_t>& layers :
       {std::vector<int64_t>{}, std::vector<int64_t>{1, 3}, std::vector<int64_t>{3, 1}}) {
    auto model = load(groups(1, 2, 1, 1), layers);
    for (int patches : {2, 3}) {
      for (bool cfg : {false, true}) {
        const auto req = request(3, 3, patches, cfg);
        std::string what =
            "pp2 layers " +
            (layers.empty() ? std::string("balanced")
                            : std::to_string(layers[0]) + "," + std::to_string(layers[1])) +
            " M" + std::to_string(patches) + (cfg ? " +cfg" : "");
        expect_same(model->generate(req), serial->generate(req), what);
      }
    }
  }
}

// With one warm-up step the stale K/V make an approximation. The bound, 40 dB, is an RMS pixel
// error of 1/100 of the range (2.55 levels of 255): beyond what the eye separates, and far from
// what a wrong pipeline gives: the tiny model's images are noise-like (random weights), so a
// patch attending to wrong or missing keys changes its pixels at full scale; two unrelated
// images of this model (another seed) score about 16 dB. Measured: about 78 dB. The PSNR must
// also be finite: the asynchronous path really ran with stale K/V.
TEST_F(PipeFusion, OneWarmupStepPsnrAboveBound) {
  if (world_->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  auto serial = load(nullptr);
  auto model = load(groups(1, 2, 1, 1));
  const auto ref = serial->generate(request(4, 1, 2, false));
  const auto approx = model->generate(request(4, 1, 2, false));
  const double psnr = flux::image_psnr(approx.images, ref.images);
  auto other = request(4, 4, 2, false);
  other.seeds = {21, 22};
  const double unrelated = flux::image_psnr(serial->generate(other).images, ref.images);
  if (world_rank() == 0)
    std::printf("pp2 M2 W1, 4 steps: PSNR vs serial %.2f dB (another seed: %.2f dB)\n", psnr,
                unrelated);
  EXPECT_TRUE(std::isfinite(psnr));
  EXPECT_GT(psnr, 40.0);
  EXPECT_LT(unrelated, 25.0);
  EXPECT_GT(xfuser::testing::max_rel_error(approx.latents, ref.latents), 1e-7);
}

TEST_F(PipeFusion, BadLayoutsAreClearErrors) {
  if (world_->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  EXPECT_TRUE(contains(error_of([&] {
                         load(groups(1, 2, 1, 1), {1, 1});
                       }),
                       "--pipefusion_layers 1,1 sums to 2; the model has 4"));
  auto model = load(groups(1, 2, 1, 1));
  EXPECT_TRUE(contains(error_of([&] { model->generate(request(2, 1, 5, false)); }),
                       "--num_pipeline_patch 5 must be between 1 and the 4 latent token rows"));
  EXPECT_TRUE(contains(error_of([&] { model->generate(request(2, 0, 2, false)); }),
                       "--pipefusion_warmup_steps must be >= 1"));
  // After errors raised before any communication the model still works.
  expect_same(model->generate(request(2, 2, 2, false)),
              load(nullptr)->generate(request(2, 2, 2, false)), "pp2 after errors");
}

// pp 2 inside each stage composed with ulysses 2, ring 2 and CFG parallel: exact with full
// warm-up; with 1 warm-up step equal to the plain pp 2 pipeline (the sp split of a patch is
// exact, so the staleness is the same).
TEST_F(PipeFusion, ComposesWithSequenceParallelAndCfg) {
  if (world_->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  auto serial = load(nullptr);
  auto plain = load(groups(1, 2, 1, 1));  // pp 2 x dp 2: two identical pipelines
  struct Layout {
    int cfg, ulysses, ring;
    const char* name;
  };
  for (const Layout& l : {Layout{1, 2, 1, "pp2 x ulysses2"}, Layout{1, 1, 2, "pp2 x ring2"},
                          Layout{2, 1, 1, "pp2 x cfg2"}}) {
    auto model = load(groups(l.cfg, 2, l.ulysses, l.ring));
    const bool cfg = l.cfg == 2;
    // text 8 splits over sp 2, text 7 is replicated.
    for (int text : {8, 7}) {
      const std::string what = std::string(l.name) + " text " + std::to_string(text);
      expect_same(model->generate(request(3, 3, 2, cfg, text)),
                  serial->generate(request(3, 3, 2, cfg, text)), what + " exact");
      expect_same(model->generate(request(3, 1, 2, cfg, text)),
                  plain->generate(request(3, 1, 2, cfg, text)), what + " W1 == pp2 W1");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  xfuser::set_process_rank(world_rank());
  const int result = RUN_ALL_TESTS();
  MPI_Finalize();
  return result;
}
