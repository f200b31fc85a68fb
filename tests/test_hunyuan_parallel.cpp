// HunyuanVideoTransformer3DModel under the generic DiT drivers (mpiexec, NP 2): tensor parallel 2
// equals one rank and diffusers on both fixtures (the padded-text one included: the attention is
// local); Ulysses 2 and ring 2 equal one rank with the text whole on every rank (the drivers keep
// it whole for this family), masked text keys included; a text split by the caller is a clear
// error (no silently wrong output).
// PipeFusion over 2 stages (the [image, text] streams, then the joined sequence, between stages)
// equals the serial loop with warm-up through all steps.
#include <mpi.h>

#include <cstdio>
#include <fstream>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/dit/dit_parallel.h"
#include "models/dit/dit_pipefusion.h"
#include "models/hunyuan_video/hunyuan_video_transformer.h"
#include "models/weights/safetensors.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/world_config.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::hunyuan_video::HunyuanVideoConfig;
using xfuser::models::hunyuan_video::HunyuanVideoTransformer3DModel;
using xfuser::parallel::MpiCommunicator;
using xfuser::parallel::ProcessGroups;
using xfuser::parallel::WorldConfig;
using xfuser::testing::expect_error_containing;
using xfuser::testing::max_rel_error;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

fs::path fixture_case(const std::string& name) {
  return xfuser::testing::fixtures_dir() / "diffusers-v0.33.1" / name;
}

TensorMap fixture_inputs(const fs::path& dir) {
  SafetensorsFile file((dir / "inputs.safetensors").string());
  TensorMap named;
  for (const auto& n : file.names()) named[n] = file.get(n).clone();
  return named;
}

class HunyuanParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    world_ = std::make_shared<MpiCommunicator>("world", std::chrono::seconds(60));
  }
  static void TearDownTestSuite() { world_.reset(); }
  std::shared_ptr<ProcessGroups> groups(int ulysses, int ring, int tp) {
    return std::make_shared<ProcessGroups>(
        WorldConfig::from_degrees(world_->size(), 1, 1, 1, ulysses, ring, tp), world_);
  }
  c10::InferenceMode guard_;
  static std::shared_ptr<MpiCommunicator> world_;
};
std::shared_ptr<MpiCommunicator> HunyuanParallel::world_;

TEST_F(HunyuanParallel, TensorParallelTwoEqualsOneRankAndDiffusers) {
  for (const std::string name : {"hunyuan_video-tiny-s1", "hunyuan_video-masked-s1"}) {
    SCOPED_TRACE(name);
    const fs::path dir = fixture_case(name);
    XF_REQUIRE_FIXTURE(dir);
    auto one = xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, nullptr);
    auto named = fixture_inputs(dir);
    const auto in = one->parse_forward_inputs(named);
    const auto want = one->forward(in);
    const auto diffusers = SafetensorsFile((dir / "output.safetensors").string()).get("sample");
    auto g = groups(1, 1, 2);
    auto tp = xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, g.get());
    EXPECT_EQ(tp->tensor_parallel().size, 2);
    EXPECT_LT(tp->num_parameters(), one->num_parameters());
    auto got = xfuser::models::dit::sequence_parallel_forward(*tp, in, *g);
    const double rel = max_rel_error(got, want);
    const double rel_diffusers =
        max_rel_error(tp->forward_outputs(got, named).at("sample"), diffusers);
    if (world_rank() == 0) {
      std::printf("[hunyuan tp] %-24s tp 2: vs one rank %.2e, vs diffusers %.2e\n", name.c_str(),
                  rel, rel_diffusers);
    }
    EXPECT_LE(rel, 1e-5);
    EXPECT_LE(rel_diffusers, 1e-4);
  }
}

TEST_F(HunyuanParallel, UlyssesAndRingKeepTheTextWholeAndEqualOneRank) {
  // The tiny fixture's 12 text tokens (a length the degree divides: the drivers still keep it
  // whole, text_whole()), 11 of them, and the masked fixture's padded text (7 tokens, row 1 with 3
  // masked keys: the key mask on the replicated text under Ulysses and ring).
  struct Case {
    std::string name;
    int64_t text;  // text tokens kept (0: all)
  };
  for (const Case& c : std::vector<Case>{{"hunyuan_video-tiny-s1", 0},
                                         {"hunyuan_video-tiny-s1", 11},
                                         {"hunyuan_video-masked-s1", 0}}) {
    SCOPED_TRACE(c.name + " text " + std::to_string(c.text));
    const fs::path dir = fixture_case(c.name);
    XF_REQUIRE_FIXTURE(dir);
    auto model = xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, nullptr);
    auto named = fixture_inputs(dir);
    if (c.text > 0) {
      named["encoder_hidden_states"] = named["encoder_hidden_states"].narrow(1, 0, c.text);
      named["encoder_attention_mask"] = named["encoder_attention_mask"].narrow(1, 0, c.text);
    }
    auto in = model->parse_forward_inputs(named);
    // And an odd image token count (a 1 x 3 x 5 grid: the chunks are padded).
    auto odd = in;
    odd.tokens = in.tokens.narrow(1, 0, 15);
    odd.token_ids = HunyuanVideoTransformer3DModel::token_ids(1, 3, 5, in.tokens.options());
    for (const auto* inputs : {&in, &odd}) {
      const auto want = model->forward(*inputs);
      for (auto [ulysses, ring] : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}}) {
        auto got = xfuser::models::dit::sequence_parallel_forward(*model, *inputs,
                                                                  *groups(ulysses, ring, 1));
        const double rel = max_rel_error(got, want);
        if (world_rank() == 0) {
          std::printf("[hunyuan sp] %-24s %2lld text, %3lld tokens, ulysses %d ring %d: %.2e\n",
                      c.name.c_str(), static_cast<long long>(inputs->text.size(1)),
                      static_cast<long long>(inputs->tokens.size(1)), ulysses, ring, rel);
        }
        EXPECT_LE(rel, 1e-5) << "ulysses " << ulysses << " ring " << ring;
      }
    }
  }
}

TEST_F(HunyuanParallel, ASplitTextIsAClearError) {
  // A caller that shards the text itself (6 of the 12 tokens): the token refiner refuses it.
  const fs::path tiny = fixture_case("hunyuan_video-tiny-s1");
  XF_REQUIRE_FIXTURE(tiny);
  auto model = xfuser::models::dit::load_dit_transformer(tiny.string(), at::kFloat, nullptr);
  auto in = model->parse_forward_inputs(fixture_inputs(tiny));
  in.text = in.text.narrow(1, 0, 6);
  if (in.text_mask.defined()) in.text_mask = in.text_mask.narrow(1, 0, 6);  // all ones: dropped
  expect_error_containing([&] { model->forward(in); },
                          {"holds 6 of the prompt's 12 text tokens", "whole text"});
}

TEST_F(HunyuanParallel, PipeFusionTwoStagesEqualsSerial) {
  // The tiny model (stage 0: the double block, stage 1: the single block) and the masked one's
  // batch row 0 with its text cut to the 5 valid tokens (no mask; 2 + 2 blocks).
  for (const std::string name : {"hunyuan_video-tiny-s1", "hunyuan_video-masked-s1"}) {
    SCOPED_TRACE(name);
    const fs::path dir = fixture_case(name);
    XF_REQUIRE_FIXTURE(dir);
    auto whole = xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, nullptr);
    auto named = fixture_inputs(dir);
    if (name == "hunyuan_video-masked-s1") {
      for (auto& [k, v] : named) v = v.narrow(0, 0, 1);
      named["encoder_hidden_states"] = named["encoder_hidden_states"].narrow(1, 0, 5);
      named["encoder_attention_mask"] = named["encoder_attention_mask"].narrow(1, 0, 5);
    }
    const auto in = whole->parse_forward_inputs(named);
    const auto& hs = named.at("hidden_states");
    const auto& c = std::dynamic_pointer_cast<HunyuanVideoTransformer3DModel>(whole)->config();
    const int64_t rows = hs.size(2) / c.patch_size_t * (hs.size(3) / c.patch_size);
    const int64_t cols = hs.size(4) / c.patch_size;  // (F' H') x W'
    const int steps = 3;
    auto inputs_at = [&](int i) {
      auto x = in;
      x.timestep = at::full({1}, 900 - 300 * i, in.timestep.options());
      return x;
    };
    // Any fixed function of (noise, latents) serves the comparison; latent_concat's tokens have
    // twice the output's channels.
    auto step_fn = [](const at::Tensor& noise, const at::Tensor& latents,
                      const xfuser::models::dit::TokenRange&) {
      return latents - 0.25 * noise.repeat({1, 1, latents.size(2) / noise.size(2)});
    };
    at::Tensor serial = in.tokens.clone();
    for (int i = 0; i < steps; ++i) {
      auto x = inputs_at(i);
      x.tokens = serial;
      serial = step_fn(whole->forward(x), serial, {});
    }
    auto g = std::make_shared<ProcessGroups>(
        WorldConfig::from_degrees(world_->size(), 1, 1, 2, 1, 1, 1), world_);
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
            "[hunyuan pipefusion] %-24s 2 stages, 2 patches, warm-up %d of %d: vs serial "
            "%.2e\n",
            name.c_str(), warmup, steps, rel);
      }
      if (warmup == steps) {
        EXPECT_LE(rel, 1e-5);
      } else {
        EXPECT_GT(rel, 0.0);  // the stale path ran
        EXPECT_LE(rel, 0.1);  // and stays an approximation of the serial result
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
