// Every parallel layout of a family that runs through the generic DiT drivers, against the
// one-rank result, under mpiexec (2 and 4 ranks): Ulysses, ring, USP, CFG parallel, PipeFusion
// (exact: warm-up covers every step; and its stale-patch mode, measured), tensor parallel and the
// patch-parallel VAE on the embedded tiny-sd3 (SD3.5 layout: dual attention, QK norms, image-first
// joint attention). fp32 final latents within 1e-5 of the serial ones relative to their max,
// images within 1/255. FLUX runs the same drivers; its layouts are tests/test_parallel_flux.cpp,
// test_pipefusion.cpp and test_tensor_parallel.cpp.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "backends/error.h"
#include "models/dit/dit_parallel.h"
#include "models/dit/dit_pipefusion.h"
#include "models/dit/step_cache.h"
#include "models/registry.h"
#include "models/sd3/sd3_transformer.h"
#include "models/xfuser_model.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/world_config.h"
#include "tests/test_util.h"

namespace {

using xfuser::models::GenerationOutput;
using xfuser::models::GenerationRequest;
using xfuser::models::ModelRegistry;
using xfuser::parallel::MpiCommunicator;
using xfuser::parallel::ProcessGroups;
using xfuser::parallel::WorldConfig;

struct Layout {
  int cfg = 1, pp = 1, ulysses = 1, ring = 1, tp = 1;
  bool parallel_vae = false;
  std::string name() const {
    return "cfg" + std::to_string(cfg) + " pp" + std::to_string(pp) + " u" +
           std::to_string(ulysses) + " r" + std::to_string(ring) + " tp" + std::to_string(tp) +
           (parallel_vae ? " +vae" : "");
  }
};

class ParallelDiT : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    world_ = std::make_shared<MpiCommunicator>("world", std::chrono::seconds(60));
    // Every rank builds (or finds) the same tiny pipeline; the cache is lock-protected.
    setenv("XFUSER_CACHE", (xfuser::testing::binary_dir() / "test-cache").c_str(), 1);
  }
  static void TearDownTestSuite() { world_.reset(); }

  static std::unique_ptr<xfuser::models::XFuserModel> load(
      const std::string& id, std::shared_ptr<ProcessGroups> groups, bool parallel_vae = false,
      const xfuser::models::WeightFormat& weights = {},
      xfuser::models::OffloadMode offload = xfuser::models::OffloadMode::kNone,
      const xfuser::models::StepCacheConfig& cache = {}) {
    const auto& spec = ModelRegistry::find(id);
    auto model = spec.create(spec);
    model->set_process_groups(std::move(groups));
    xfuser::models::ModelLoadOptions options;
    options.parallel_vae = parallel_vae;
    options.transformer_weights = weights;
    options.offload = offload;
    options.cache = cache;
    model->load(spec.embedded_dir(), options);
    return model;
  }
  static GenerationRequest request(int height, int width, int text_len, int steps) {
    GenerationRequest r;
    r.prompts = {"a cat on a sofa", "an owl at night"};
    r.negative_prompts = {"blurry", ""};
    r.height = height;
    r.width = width;
    r.num_inference_steps = steps;
    r.guidance_scale = 3.0;
    r.max_sequence_length = text_len;
    r.seeds = {11, 12};
    return r;
  }
  static void expect_same(const GenerationOutput& par, const GenerationOutput& ref,
                          const std::string& what) {
    const double rel = xfuser::testing::max_rel_error(par.latents, ref.latents);
    EXPECT_LE(rel, 1e-5) << what;
    const int pixel = (par.images.to(at::kInt) - ref.images.to(at::kInt)).abs().max().item<int>();
    EXPECT_LE(pixel, 1) << what;
    if (world_->rank() == 0)
      std::printf("%-52s latents rel %.2e, max pixel diff %d\n", what.c_str(), rel, pixel);
  }
  static std::shared_ptr<MpiCommunicator> world_;
};
std::shared_ptr<MpiCommunicator> ParallelDiT::world_;

TEST_P(ParallelDiT, EveryLayoutEqualsOneRank) {
  const std::string id = GetParam();
  const int world = world_->size();
  std::vector<Layout> layouts;
  for (int c = 1; c <= 2; ++c)
    for (int p = 1; p <= 2; ++p)
      for (int u = 1; u <= world; ++u)
        for (int r = 1; r <= world; ++r)
          if (c * p * u * r == world) layouts.push_back({c, p, u, r, 1, false});
  layouts.push_back({1, 1, 1, 1, world, false});  // tensor parallel over every rank
  layouts.push_back({1, 1, world, 1, 1, true});   // Ulysses + the patch-parallel VAE
  auto serial = load(id, nullptr);
  // 64x64 -> 4x4 = 16 tokens; 48x32 -> 3x2 = 6 tokens (uneven over 4 ranks). The text is 77 +
  // max_sequence_length tokens: 77 + 7 = 84 splits over 2 and 4 ranks; 77 + 8 is replicated.
  struct Case {
    int h, w, text;
  };
  for (const Case& k : {Case{64, 64, 7}, Case{48, 32, 8}}) {
    const int steps = 3;
    const auto req = [&] {
      auto r = request(k.h, k.w, k.text, steps);
      r.pipefusion_warmup_steps = steps;  // PipeFusion exact: every step synchronous
      return r;
    }();
    const auto ref = serial->generate(req);
    for (const Layout& l : layouts) {
      auto config = WorldConfig::from_degrees(world, 1, l.cfg, l.pp, l.ulysses, l.ring, l.tp);
      auto groups = std::make_shared<ProcessGroups>(config, world_);
      auto model = load(id, groups, l.parallel_vae);
      expect_same(model->generate(req), ref,
                  id + " " + l.name() + " " + std::to_string(k.h) + "x" + std::to_string(k.w) +
                      " text " + std::to_string(77 + k.text));
    }
  }
}

// FP8 weights are a per-element rounding of the weights (storage) and a per-token, per-channel
// quantization (FP8 GEMMs): both are the same on every rank's part of the sequence, the batch and
// the pipeline stages, so every layout equals one rank with the same weights. Tensor parallelism
// splits rows that FP8 GEMMs scale as a whole: it takes fp8 storage only.
TEST_P(ParallelDiT, Fp8WeightsUnderEveryLayoutEqualOneRank) {
  using xfuser::models::WeightFormat;
  const std::string id = GetParam();
  const int world = world_->size();
  std::vector<Layout> layouts = {{1, 1, world, 1, 1, false},
                                 {1, 1, 1, world, 1, false},
                                 {2, 1, world / 2, 1, 1, false},
                                 {1, 2, world / 2, 1, 1, false}};
  const int steps = 2;
  auto req = request(64, 64, 7, steps);
  req.pipefusion_warmup_steps = steps;
  const auto full = load(id, nullptr)->generate(req);
  for (const auto kind : {WeightFormat::Kind::kFp8Storage, WeightFormat::Kind::kFp8Scaled}) {
    WeightFormat weights;
    weights.kind = kind;
    const std::string what = kind == WeightFormat::Kind::kFp8Storage ? "fp8 storage" : "fp8 GEMMs";
    const auto ref = load(id, nullptr, false, weights)->generate(req);
    // The approximation itself, measured against the float32 weights.
    const double moved = xfuser::testing::max_rel_error(ref.latents, full.latents);
    if (world_->rank() == 0)
      std::printf("%s %s vs float32 weights: latents rel %.2e\n", id.c_str(), what.c_str(), moved);
    EXPECT_GT(moved, 0.0) << what;
    EXPECT_LT(moved, 0.2) << what;
    // FP8 GEMMs round each activation to 3 mantissa bits: a float32 difference of 1e-7 between
    // layouts (a matmul over 4 rows instead of 16 sums in another order) moves a value across a
    // rounding boundary now and then, and the run carries that on (measured: 2e-4 on 4 ranks,
    // the same for Ulysses, ring and CFG x Ulysses, against 1.6e-3 for FP8 itself). Their bound:
    // a layout moves the result less than half as far as FP8 GEMMs themselves do.
    const double bound = kind == WeightFormat::Kind::kFp8Scaled ? 0.5 * moved : 1e-5;
    auto all = layouts;
    if (kind == WeightFormat::Kind::kFp8Storage) all.push_back({1, 1, 1, 1, world, false});
    for (const Layout& l : all) {
      auto config = WorldConfig::from_degrees(world, 1, l.cfg, l.pp, l.ulysses, l.ring, l.tp);
      auto groups = std::make_shared<ProcessGroups>(config, world_);
      const auto out = load(id, groups, false, weights)->generate(req);
      if (kind == WeightFormat::Kind::kFp8Storage) {
        expect_same(out, ref, id + " " + what + " " + l.name());
      } else {
        const double rel = xfuser::testing::max_rel_error(out.latents, ref.latents);
        EXPECT_LE(rel, bound) << what << " " << l.name();
        if (world_->rank() == 0)
          std::printf("%-52s latents rel %.2e (bound %.2e)\n",
                      (id + " " + what + " " + l.name()).c_str(), rel, bound);
      }
    }
  }
  // FP8 GEMMs under tensor parallelism: a clear error naming both flags, on every rank.
  WeightFormat scaled;
  scaled.kind = WeightFormat::Kind::kFp8Scaled;
  auto groups = std::make_shared<ProcessGroups>(
      WorldConfig::from_degrees(world, 1, 1, 1, 1, 1, world), world_);
  xfuser::testing::expect_error_containing([&] { load(id, groups, false, scaled); },
                                           {"--use_fp8_gemms", "--tensor_parallel_degree"});
}

// CPU offload is each rank's own affair: it moves the parameters the rank holds (the whole
// model under sequence and CFG parallelism, tensor-parallel slices, a PipeFusion stage's blocks)
// and changes no value, so every layout with either offload equals one rank without it.
TEST_P(ParallelDiT, CpuOffloadUnderLayoutsEqualsOneRank) {
  using xfuser::models::OffloadMode;
  const std::string id = GetParam();
  const int world = world_->size();
  const std::vector<Layout> layouts = {{1, 1, world, 1, 1, false},
                                       {2, 1, world / 2, 1, 1, false},
                                       {1, 2, world / 2, 1, 1, false},
                                       {1, 1, 1, 1, world, false}};
  const int steps = 2;
  auto req = request(64, 64, 7, steps);
  req.pipefusion_warmup_steps = steps;
  const auto ref = load(id, nullptr)->generate(req);
  for (const auto mode : {OffloadMode::kModel, OffloadMode::kSequential}) {
    for (const Layout& l : layouts) {
      auto config = WorldConfig::from_degrees(world, 1, l.cfg, l.pp, l.ulysses, l.ring, l.tp);
      auto groups = std::make_shared<ProcessGroups>(config, world_);
      auto model = load(id, groups, false, {}, mode);
      expect_same(model->generate(req), ref,
                  id + " " + xfuser::models::offload_mode_name(mode) + " offload " + l.name());
      const auto s = model->offloader()->stats();
      EXPECT_GT(s.onloads, 0);
      EXPECT_LE(s.peak_resident_bytes, s.bound_bytes) << l.name();
      EXPECT_EQ(s.resident_bytes, 0) << l.name();
      if (mode == OffloadMode::kSequential) EXPECT_GT(s.blocks, 0) << l.name();
    }
  }
}

TEST_P(ParallelDiT, PipeFusionStalePatchesAreMeasured) {
  // Stale K/V (one warm-up step, patches after it) is an approximation: the PSNR against the
  // exact run is reported, and the first (warm-up) step alone is exact.
  const std::string id = GetParam();
  const int world = world_->size();
  auto config = WorldConfig::from_degrees(world, 1, 1, 2, world / 2, 1, 1);
  auto groups = std::make_shared<ProcessGroups>(config, world_);
  auto model = load(id, groups);
  auto serial = load(id, nullptr);
  auto req = request(64, 64, 7, 3);
  req.num_pipeline_patch = 2;
  req.pipefusion_warmup_steps = 1;
  const auto stale = model->generate(req);
  const auto exact = serial->generate(req);
  const double psnr = xfuser::models::dit::image_psnr(stale.images, exact.images);
  if (world_->rank() == 0)
    std::printf("%s PipeFusion 2 patches, 1 warm-up step of 3: PSNR %.2f dB vs exact\n", id.c_str(),
                psnr);
  EXPECT_GT(psnr, 20.0) << "stale patches should stay close to the exact image";
  req.num_inference_steps = 1;  // warm-up only: exact
  expect_same(model->generate(req), serial->generate(req), id + " PipeFusion warm-up only");
}

TEST_P(ParallelDiT, CfgParallelWithoutGuidanceIsAClearError) {
  if (world_->size() != 2) GTEST_SKIP() << "needs 2 ranks";
  auto groups =
      std::make_shared<ProcessGroups>(WorldConfig::from_degrees(2, 1, 2, 1, 1, 1, 1), world_);
  auto model = load(GetParam(), groups);
  auto req = request(64, 64, 7, 1);
  req.guidance_scale = 1.0;  // no classifier-free guidance
  try {
    model->generate(req);
    FAIL();
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--use_cfg_parallel needs classifier-free guidance"),
              std::string::npos)
        << e.what();
  }
}

// Step caching under every layout that runs one generation over several ranks equals one rank
// with the same cache: the same transformer calls skipped (in the same order) and the final
// latents within 1e-5. tiny-sd3 batches its guidance branches (one decision for both, summed
// over the cfg group under CFG parallelism); tiny-flux runs true CFG as two branches with their
// own cache state, and takes TeaCache too (FLUX.1's polynomial). Each threshold is set between
// two of the one-rank run's metrics so that it both skips and computes. Data parallelism is not
// here: its replicas run their own prompts and share no decision.
class ParallelStepCache : public ParallelDiT {
 protected:
  static std::string skips(const GenerationOutput& out) {
    std::string s;
    for (const auto& d : out.cache.decisions) s += d.computed ? 'C' : '.';
    return s;
  }
  static GenerationRequest cached_request(const std::string& id) {
    auto r = request(64, 64, 7, 8);
    if (id == "tiny-flux") r.true_cfg_scale = 2.0;  // true CFG: "cond" and "uncond" branches
    return r;
  }
  // A threshold between the two middle metrics of a run that computed every step.
  static double middle_threshold(const GenerationOutput& out) {
    std::vector<double> m;
    for (const auto& d : out.cache.decisions) {
      if (std::isfinite(d.metric)) m.push_back(d.metric);
    }
    EXPECT_GE(m.size(), 2u);
    std::sort(m.begin(), m.end());
    const size_t k = m.size() / 2;
    return 0.5 * (m[k - 1] + m[k]);
  }
};

TEST_F(ParallelStepCache, EveryLayoutEqualsOneRankWithTheSameSkips) {
  using xfuser::models::CacheMethod;
  using xfuser::models::StepCacheConfig;
  const int world = world_->size();
  const std::vector<Layout> layouts = {{1, 1, world, 1, 1, false},
                                       {1, 1, 1, world, 1, false},
                                       {2, 1, world / 2, 1, 1, false},
                                       // tiny-flux has 2 heads: tensor parallel 2 (x Ulysses).
                                       {1, 1, world / 2, 1, 2, false}};
  for (const std::string id : {"tiny-sd3", "tiny-flux"}) {
    const auto req = cached_request(id);
    StepCacheConfig probe;
    probe.method = CacheMethod::kFirstBlock;
    probe.threshold = 0.0;
    const double fb_threshold =
        middle_threshold(load(id, nullptr, false, {}, {}, probe)->generate(req));
    std::vector<StepCacheConfig> configs(3);
    configs[0].method = CacheMethod::kFirstBlock;
    configs[0].threshold = fb_threshold;
    configs[1].method = CacheMethod::kMagCache;
    configs[1].threshold = 0.25;
    configs[1].max_skip_steps = 2;
    configs[1].mag_ratios = xfuser::models::dit::flux_mag_ratios();
    configs[2].method = CacheMethod::kTaylorSeer;
    configs[2].cache_interval = 3;
    configs[2].disable_cache_before_step = 2;
    configs[2].max_order = 2;
    if (id == "tiny-flux") {
      // TeaCache (FLUX.1's published polynomial): the threshold between the middle values of a
      // run that skips nothing.
      StepCacheConfig tea;
      tea.method = CacheMethod::kTeaCache;
      tea.threshold = -std::numeric_limits<double>::infinity();
      tea.threshold = middle_threshold(load(id, nullptr, false, {}, {}, tea)->generate(req));
      configs.push_back(tea);
    }
    for (const auto& cache : configs) {
      const std::string method = xfuser::models::cache_method_name(cache.method);
      const auto ref = load(id, nullptr, false, {}, {}, cache)->generate(req);
      EXPECT_GT(ref.cache.skipped, 0) << id << " " << method;
      EXPECT_LT(ref.cache.skipped, static_cast<int>(ref.cache.decisions.size()))
          << id << " " << method;
      for (const Layout& l : layouts) {
        auto config = WorldConfig::from_degrees(world, 1, l.cfg, l.pp, l.ulysses, l.ring, l.tp);
        auto groups = std::make_shared<ProcessGroups>(config, world_);
        const auto out = load(id, groups, false, {}, {}, cache)->generate(req);
        const std::string what = id + " " + method + " " + l.name() + " " + skips(out);
        if (l.cfg == 2) {
          // Each cfg rank holds one branch's decisions: the one-rank run's for that branch.
          std::string mine;
          const bool batched = id == "tiny-sd3";
          for (const auto& d : ref.cache.decisions) {
            const bool neg_here = config.coords(world_->rank()).cfg == 0;
            if (batched || d.branch == (neg_here ? "uncond" : "cond")) {
              mine += d.computed ? 'C' : '.';
            }
          }
          EXPECT_EQ(skips(out), mine) << what;
        } else {
          EXPECT_EQ(skips(out), skips(ref)) << what;
        }
        expect_same(out, ref, what);
      }
    }
  }
}

// Under sequence parallelism each rank sees only its own tokens: the first block's metric over
// them differs from rank to rank. A threshold between two ranks' own metrics would split their
// decisions (and deadlock the next collective) if each rank decided alone; summed over the group
// they decide alike, and as one rank does.
TEST_F(ParallelStepCache, RanksWhoseOwnMetricsDisagreeDecideAlike) {
  using xfuser::models::CacheMethod;
  using xfuser::models::StepCacheConfig;
  const int world = world_->size();
  const std::string id = "tiny-flux";
  const auto req = cached_request(id);
  auto groups = [&] {
    return std::make_shared<ProcessGroups>(WorldConfig::from_degrees(world, 1, 1, 1, world, 1, 1),
                                           world_);
  };
  StepCacheConfig cache;
  cache.method = CacheMethod::kFirstBlock;
  cache.threshold = 0.0;  // every step computes: the metrics of the first comparison
  const auto probe = load(id, groups(), false, {}, {}, cache)->generate(req);
  // The first decision with a metric (step 1, "cond"): every rank's own metric.
  size_t first = 0;
  while (first < probe.cache.decisions.size() &&
         !std::isfinite(probe.cache.decisions[first].metric)) {
    ++first;
  }
  ASSERT_LT(first, probe.cache.decisions.size());
  at::Tensor own = at::full({1}, probe.cache.decisions[first].local_metric, at::kDouble);
  const at::Tensor all = world_->all_gather(own, 0);
  const double lo = all.min().item<double>(), hi = all.max().item<double>();
  ASSERT_LT(lo, hi) << "the ranks' own metrics are equal: no disagreement to test";
  cache.threshold = 0.5 * (lo + hi);
  const bool own_skip = !(probe.cache.decisions[first].local_metric > *cache.threshold);
  at::Tensor count = at::full({1}, own_skip ? 1.0 : 0.0, at::kDouble);
  world_->all_reduce(count);
  const int own_skips = static_cast<int>(count.item<double>());
  EXPECT_GT(own_skips, 0);
  EXPECT_LT(own_skips, world) << "some ranks alone would compute, others skip";
  const auto ref = load(id, nullptr, false, {}, {}, cache)->generate(req);
  const auto out = load(id, groups(), false, {}, {}, cache)->generate(req);
  EXPECT_EQ(skips(out), skips(ref));
  EXPECT_EQ(out.cache.decisions[first].computed, ref.cache.decisions[first].computed);
  EXPECT_NEAR(out.cache.decisions[first].metric, ref.cache.decisions[first].metric,
              1e-6 * std::fabs(ref.cache.decisions[first].metric));
  expect_same(out, ref, id + " fbcache threshold between the ranks' own metrics " + skips(out));
}

TEST_F(ParallelStepCache, PipeFusionRefusesStepCaching) {
  using xfuser::models::CacheMethod;
  xfuser::models::StepCacheConfig cache;
  cache.method = CacheMethod::kFirstBlock;
  auto groups = std::make_shared<ProcessGroups>(
      WorldConfig::from_degrees(world_->size(), 1, 1, 2, world_->size() / 2, 1, 1), world_);
  xfuser::testing::expect_error_containing([&] { load("tiny-sd3", groups, false, {}, {}, cache); },
                                           {"--cache fbcache", "--pipefusion_parallel_degree"});
}

// SD3.5-large has 38 heads, which 4 and 8 do not divide: Ulysses pads the heads (as for FLUX) and
// still equals one rank. Here 3 heads over Ulysses 2 and 4, and over Ulysses x ring.
TEST(ParallelDiTHeads, UlyssesPadsHeadsTheDegreeDoesNotDivide) {
  auto world = std::make_shared<MpiCommunicator>("world", std::chrono::seconds(60));
  xfuser::models::sd3::SD3Config c;
  c.sample_size = 16;
  c.patch_size = 2;
  c.in_channels = 4;
  c.num_layers = 2;
  c.attention_head_dim = 8;
  c.num_attention_heads = 3;
  c.joint_attention_dim = 16;
  c.caption_projection_dim = 24;
  c.pooled_projection_dim = 8;
  c.out_channels = 4;
  c.pos_embed_max_size = 16;
  c.dual_attention_layers = {0};
  c.qk_norm = "rms_norm";
  xfuser::models::sd3::SD3Transformer2DModel model(c);
  model.init_random(7, 0.05);
  at::manual_seed(3);  // every rank draws the same inputs
  xfuser::models::TensorMap inputs = {{"hidden_states", at::randn({2, 4, 12, 10})},
                                      {"encoder_hidden_states", at::randn({2, 9, 16})},
                                      {"pooled_projections", at::randn({2, 8})},
                                      {"timestep", at::tensor({500.0f, 250.0f})}};
  const auto in = model.parse_forward_inputs(inputs);
  const at::Tensor ref = model.forward(in);
  const int n = world->size();
  for (int r = 1; r <= n; r *= 2) {
    auto groups =
        std::make_shared<ProcessGroups>(WorldConfig::from_degrees(n, 1, 1, 1, n / r, r, 1), world);
    const at::Tensor out = xfuser::models::dit::sequence_parallel_forward(model, in, *groups);
    const double rel = xfuser::testing::max_rel_error(out, ref);
    EXPECT_LE(rel, 1e-5) << "ulysses " << n / r << " ring " << r;
    if (world->rank() == 0)
      std::printf("SD3 3 heads, ulysses %d ring %d: rel %.2e\n", n / r, r, rel);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ParallelDiT, ::testing::Values("tiny-sd3"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  xfuser::set_process_rank(rank);
  const int result = RUN_ALL_TESTS();
  MPI_Finalize();
  return result;
}
