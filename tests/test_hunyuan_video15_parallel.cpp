// HunyuanVideo15Transformer3DModel under the generic DiT drivers (mpiexec, NP 2 and 4): every
// layout of the world size among tensor parallel 2, Ulysses 2, ring 2 (NP 2) and Ulysses 2 x
// ring 2, ring 2 x tensor parallel 2, ring 4 (NP 4) equals the one-rank forward on the three
// diffusers 0.36.0 fixtures (t2v: the image tokens and padded text keys masked; i2v; meanflow
// with patch 2), with every mask all-valid (no key mask), and with an odd image token count (the
// sequence chunks padded). The text stream is whole on every rank (text_whole()). CFG: batched
// and CFG parallel (alone, or with Ulysses / ring at NP 4) equal two passes. PipeFusion over 2
// stages (with Ulysses 2 at NP 4) equals the serial loop on one prompt.
#include <mpi.h>

#include <cstdio>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "backends/error.h"
#include "models/dit/dit_parallel.h"
#include "models/dit/dit_pipefusion.h"
#include "models/hunyuan_video/hunyuan_video_transformer.h"
#include "models/hunyuan_video15/hunyuan_video15_transformer.h"
#include "models/weights/safetensors.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/world_config.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::hunyuan_video::HunyuanVideoTransformer3DModel;
using xfuser::parallel::MpiCommunicator;
using xfuser::parallel::ProcessGroups;
using xfuser::parallel::WorldConfig;
using xfuser::testing::max_rel_error;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

fs::path fixture_case(const std::string& name) {
  return xfuser::testing::fixtures_dir() / "diffusers-v0.36.0" / name;
}

TensorMap fixture_inputs(const fs::path& dir) {
  SafetensorsFile file((dir / "inputs.safetensors").string());
  TensorMap named;
  for (const auto& n : file.names()) named[n] = file.get(n).clone();
  return named;
}

struct Layout {
  int ulysses, ring, tp;
};

class HunyuanVideo15Parallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    world_ = std::make_shared<MpiCommunicator>("world", std::chrono::seconds(60));
  }
  static void TearDownTestSuite() { world_.reset(); }
  std::shared_ptr<ProcessGroups> groups(const Layout& l) {
    return std::make_shared<ProcessGroups>(
        WorldConfig::from_degrees(world_->size(), 1, 1, 1, l.ulysses, l.ring, l.tp), world_);
  }
  // The layouts of this world size (the fixtures have 2 heads: Ulysses x tensor parallel <= 2).
  std::vector<Layout> layouts() const {
    if (world_->size() == 2) return {{2, 1, 1}, {1, 2, 1}, {1, 1, 2}};
    if (world_->size() == 4) return {{2, 2, 1}, {1, 2, 2}, {1, 4, 1}};
    return {};
  }
  c10::InferenceMode guard_;
  static std::shared_ptr<MpiCommunicator> world_;
};
std::shared_ptr<MpiCommunicator> HunyuanVideo15Parallel::world_;

TEST_F(HunyuanVideo15Parallel, EveryLayoutEqualsOneRank) {
  ASSERT_FALSE(layouts().empty()) << "run with 2 or 4 ranks, got " << world_->size();
  struct Case {
    std::string name;
    bool all_valid;    // every mask all ones and i2v image embeds: no key mask
    int64_t text = 0;  // Qwen text tokens kept (0: all 7)
  };
  // 4 Qwen tokens: a length both degrees divide, which the drivers would split over the ranks
  // for a family without text_whole() (the token refiner and the reordering need it whole).
  for (const Case& c : std::vector<Case>{{"hunyuan_video15-t2v-s1", false},
                                         {"hunyuan_video15-t2v-s1", false, 4},
                                         {"hunyuan_video15-i2v-s1", false},
                                         {"hunyuan_video15-i2v-s1", true},
                                         {"hunyuan_video15-i2v-s1", true, 4},
                                         {"hunyuan_video15-meanflow-s1", false}}) {
    SCOPED_TRACE(c.name + (c.all_valid ? " all valid" : "") + " text " + std::to_string(c.text));
    const fs::path dir = fixture_case(c.name);
    XF_REQUIRE_FIXTURE(dir);
    auto one = xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, nullptr);
    auto named = fixture_inputs(dir);
    if (c.all_valid) {
      for (const char* m : {"encoder_attention_mask", "encoder_attention_mask_2"}) {
        named[m] = at::ones_like(named[m]);
      }
    }
    if (c.text > 0) {
      for (const char* k : {"encoder_hidden_states", "encoder_attention_mask"}) {
        named[k] = named[k].narrow(1, 0, c.text);
      }
    }
    const auto in = one->parse_forward_inputs(named);
    EXPECT_EQ(one->embed(in).extra.count("text_key_mask"), c.all_valid ? 0u : 1u);
    // And an odd image token count: the first 15 tokens as a 1 x 3 x 5 grid (t2v and i2v only:
    // their patch is 1).
    std::vector<xfuser::models::dit::DiTInputs> inputs = {in};
    if (c.name != "hunyuan_video15-meanflow-s1") {
      auto odd = in;
      odd.tokens = in.tokens.narrow(1, 0, 15);
      odd.token_ids = HunyuanVideoTransformer3DModel::token_ids(1, 3, 5, in.tokens.options());
      inputs.push_back(odd);
    }
    for (const auto& x : inputs) {
      const auto want = one->forward(x);
      for (const Layout& l : layouts()) {
        auto g = groups(l);
        auto model =
            l.tp > 1 ? xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, g.get())
                     : one;
        if (l.tp > 1) EXPECT_LT(model->num_parameters(), one->num_parameters());
        const auto got = xfuser::models::dit::sequence_parallel_forward(*model, x, *g);
        const double rel = max_rel_error(got, want);
        if (world_rank() == 0) {
          std::printf(
              "[hunyuan_video15 parallel] %-28s %s %lld text, %2lld tokens, ulysses %d ring %d "
              "tp %d: vs one rank %.2e\n",
              c.name.c_str(), c.all_valid ? "all-valid" : "padded   ",
              static_cast<long long>(x.text.size(1)), static_cast<long long>(x.tokens.size(1)),
              l.ulysses, l.ring, l.tp, rel);
        }
        EXPECT_LE(rel, 1e-5) << "ulysses " << l.ulysses << " ring " << l.ring << " tp " << l.tp;
      }
    }
  }
}

// Classifier-free guidance (HunyuanVideo-1.5 runs true CFG): the negative branch has other Qwen
// text and glyphs with other padding. The batched [neg; pos] forward (every extra input
// concatenated, timestep_r [1] repeated) and CFG parallel 2 (NP 2), or CFG 2 x Ulysses 2 and
// CFG 2 x ring 2 (NP 4), equal the two branches run one after the other on one rank.
TEST_F(HunyuanVideo15Parallel, GuidanceBatchedAndCfgParallelEqualTwoPasses) {
  for (const std::string name : {"hunyuan_video15-t2v-s1", "hunyuan_video15-meanflow-s1"}) {
    SCOPED_TRACE(name);
    const fs::path dir = fixture_case(name);
    XF_REQUIRE_FIXTURE(dir);
    auto model = xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, nullptr);
    auto named = fixture_inputs(dir);
    const auto positive = model->parse_forward_inputs(named);
    named["encoder_hidden_states"] = named["encoder_hidden_states"].flip({1}) * 0.5;
    named["encoder_attention_mask"] = at::ones_like(named["encoder_attention_mask"]);
    named["encoder_attention_mask"][0].narrow(0, 2, 5).zero_();
    named["encoder_hidden_states_2"] = -named["encoder_hidden_states_2"];
    named["encoder_attention_mask_2"] = named["encoder_attention_mask_2"].flip({0});
    const auto negative = model->parse_forward_inputs(named);
    const double scale = 5.0;
    const auto want = xfuser::models::dit::guided_noise(*model, positive, negative, scale, nullptr,
                                                        /*batched=*/false);
    const auto pos = model->forward(positive);
    EXPECT_GT(max_rel_error(want, pos), 1e-3);  // the negative branch differs
    const auto batched = xfuser::models::dit::guided_noise(*model, positive, negative, scale,
                                                           nullptr, /*batched=*/true);
    const double rel_batched = max_rel_error(batched, want);
    EXPECT_LE(rel_batched, 1e-5);
    std::vector<std::pair<int, int>> sp = {{1, 1}};
    if (world_->size() == 4) sp = {{2, 1}, {1, 2}};
    for (auto [ulysses, ring] : sp) {
      auto g = std::make_shared<ProcessGroups>(
          WorldConfig::from_degrees(world_->size(), 1, 2, 1, ulysses, ring, 1), world_);
      const auto got =
          xfuser::models::dit::guided_noise(*model, positive, negative, scale, g.get(), false);
      const double rel = max_rel_error(got, want);
      if (world_rank() == 0) {
        std::printf(
            "[hunyuan_video15 cfg] %-28s batched %.2e; cfg 2 x ulysses %d x ring %d: %.2e\n",
            name.c_str(), rel_batched, ulysses, ring, rel);
      }
      EXPECT_LE(rel, 1e-5) << "cfg 2 ulysses " << ulysses << " ring " << ring;
    }
  }
}

// PipeFusion over 2 stages (one block each; NP 4: with Ulysses 2 in each stage) on one batch
// row of the t2v and i2v fixtures (one prompt: no key mask; the text stream text_tokens(in) =
// 10 and 13 of 15 rows) equals the serial loop with warm-up through all steps, and stays close
// with 1 warm-up step.
TEST_F(HunyuanVideo15Parallel, PipeFusionTwoStagesEqualsSerial) {
  for (const std::string name : {"hunyuan_video15-t2v-s1", "hunyuan_video15-i2v-s1"}) {
    SCOPED_TRACE(name);
    const fs::path dir = fixture_case(name);
    XF_REQUIRE_FIXTURE(dir);
    auto whole = xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, nullptr);
    auto named = fixture_inputs(dir);
    for (auto& [k, v] : named) v = v.narrow(0, 0, 1);
    const auto in = whole->parse_forward_inputs(named);
    EXPECT_EQ(whole->text_tokens(in), name == "hunyuan_video15-t2v-s1" ? 10 : 13);
    EXPECT_EQ(whole->embed(in).extra.count("text_key_mask"), 0u);
    const auto& hs = named.at("hidden_states");  // patch 1: F' H' rows of W' tokens
    const int64_t rows = hs.size(2) * hs.size(3), cols = hs.size(4);
    const int steps = 3;
    auto inputs_at = [&](int i) {
      auto x = in;
      x.timestep = at::full({1}, 900 - 300 * i, in.timestep.options());
      return x;
    };
    // Any fixed function of (noise, latents) serves the comparison: the 4 output channels step
    // the first 4 of the 9 input ones (the condition channels stay).
    auto step_fn = [](const at::Tensor& noise, const at::Tensor& latents,
                      const xfuser::models::dit::PipeFusion::TokenRange&) {
      auto next = latents.clone();
      next.narrow(2, 0, noise.size(2)).sub_(0.25 * noise);
      return next;
    };
    at::Tensor serial = in.tokens.clone();
    for (int i = 0; i < steps; ++i) {
      auto x = inputs_at(i);
      x.tokens = serial;
      serial = step_fn(whole->forward(x), serial, {});
    }
    const int ulysses = world_->size() / 2;
    auto g = std::make_shared<ProcessGroups>(
        WorldConfig::from_degrees(world_->size(), 1, 1, 2, ulysses, 1, 1), world_);
    const auto layers = xfuser::models::dit::pipefusion_stage_layers(*whole, 2, {});
    auto stage = xfuser::models::dit::load_dit_transformer(
        dir.string(), at::kFloat, g.get(),
        xfuser::models::dit::pipefusion_stage_part(layers, g->coords().pp));
    for (int warmup : {steps, 1}) {
      xfuser::models::dit::PipeFusion pf(*stage, *g, rows, cols, 2, warmup, steps);
      at::Tensor latents = in.tokens.clone();
      for (int i = 0; i < steps; ++i) {
        pf.step(
            i, inputs_at(i), 1, [](const at::Tensor& out) { return out; }, step_fn, latents);
      }
      const double rel = max_rel_error(latents, serial);
      if (world_rank() == 0) {
        std::printf(
            "[hunyuan_video15 pipefusion] %-24s 2 stages x ulysses %d, 2 patches, warm-up %d of "
            "%d: vs serial %.2e\n",
            name.c_str(), ulysses, warmup, steps, rel);
      }
      if (warmup == steps) {
        EXPECT_LE(rel, 1e-5);
      } else {
        EXPECT_GT(rel, 0.0);  // the stale path ran
        EXPECT_LE(rel, 0.1);
      }
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
