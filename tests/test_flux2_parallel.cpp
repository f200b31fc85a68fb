// Flux2Transformer2DModel under the generic DiT drivers (mpiexec, NP 2): tensor parallel 2 equals
// one rank and diffusers on both fixtures (the fused single-block projection and the modulation
// sharded); Ulysses 2 and ring 2 equal one rank with the text split (an even text length) or
// replicated (odd), the 4-axis RoPE tables sharded with the image tokens (a reference image's
// t = 10 rows included), odd image token counts padded; PipeFusion over 2 stages (the text and
// image streams, then the joined sequence, between stages) equals the serial loop with warm-up
// through all steps.
#include <mpi.h>

#include <cstdio>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "backends/error.h"
#include "models/dit/dit_parallel.h"
#include "models/dit/dit_pipefusion.h"
#include "models/flux2/flux2_transformer.h"
#include "models/weights/safetensors.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/world_config.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::dit::DiTInputs;
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

class Flux2Parallel : public ::testing::Test {
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
std::shared_ptr<MpiCommunicator> Flux2Parallel::world_;

TEST_F(Flux2Parallel, TensorParallelTwoEqualsOneRankAndDiffusers) {
  for (const std::string name : {"flux2-tiny-s1", "flux2-other-s1"}) {
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
    const double rel_diffusers = max_rel_error(got, diffusers);
    if (world_rank() == 0) {
      std::printf("[flux2 tp] %-16s tp 2: vs one rank %.2e, vs diffusers %.2e\n", name.c_str(), rel,
                  rel_diffusers);
    }
    EXPECT_LE(rel, 1e-5);
    EXPECT_LE(rel_diffusers, 1e-4);
  }
}

TEST_F(Flux2Parallel, UlyssesAndRingEqualOneRank) {
  // flux2-tiny-s1: 5 text tokens (replicated on both ranks) and 4 of them (split), 30 image
  // tokens whose last 6 are the reference image's (t = 10), and 29 of them (padded chunks);
  // flux2-other-s1: 7 text tokens, 12 image tokens with fractional ids, 2 + 2 blocks.
  struct Case {
    std::string name;
    int64_t text;    // text tokens kept (0: all)
    int64_t tokens;  // image tokens kept (0: all)
  };
  for (const Case& c : std::vector<Case>{{"flux2-tiny-s1", 0, 0},
                                         {"flux2-tiny-s1", 4, 0},
                                         {"flux2-tiny-s1", 4, 29},
                                         {"flux2-other-s1", 0, 0},
                                         {"flux2-other-s1", 6, 11}}) {
    SCOPED_TRACE(c.name + " text " + std::to_string(c.text) + " tokens " +
                 std::to_string(c.tokens));
    const fs::path dir = fixture_case(c.name);
    XF_REQUIRE_FIXTURE(dir);
    auto model = xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, nullptr);
    DiTInputs in = model->parse_forward_inputs(fixture_inputs(dir));
    if (c.text > 0) {
      in.text = in.text.narrow(1, 0, c.text);
      in.text_ids = in.text_ids.narrow(0, 0, c.text);
    }
    if (c.tokens > 0) {
      in.tokens = in.tokens.narrow(1, 0, c.tokens);
      in.token_ids = in.token_ids.narrow(0, 0, c.tokens);
    }
    const auto want = model->forward(in);
    for (auto [ulysses, ring] : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}}) {
      auto got =
          xfuser::models::dit::sequence_parallel_forward(*model, in, *groups(ulysses, ring, 1));
      const double rel = max_rel_error(got, want);
      if (world_rank() == 0) {
        std::printf("[flux2 sp] %-16s %lld text, %lld tokens, ulysses %d ring %d: %.2e\n",
                    c.name.c_str(), static_cast<long long>(in.text.size(1)),
                    static_cast<long long>(in.tokens.size(1)), ulysses, ring, rel);
      }
      EXPECT_LE(rel, 1e-5) << "ulysses " << ulysses << " ring " << ring;
    }
  }
}

TEST_F(Flux2Parallel, PipeFusionTwoStagesEqualsSerial) {
  // flux2-other-s1 (2 + 2 blocks: stage 0 holds the double blocks, stage 1 the single ones) on
  // its 12 tokens as a 3 x 4 grid; flux2-tiny-s1 (1 + 1) on row 0 of its batch, 30 tokens as
  // 5 x 6 rows (the reference image's tokens are the last row).
  for (const std::string name : {"flux2-other-s1", "flux2-tiny-s1"}) {
    SCOPED_TRACE(name);
    const fs::path dir = fixture_case(name);
    XF_REQUIRE_FIXTURE(dir);
    auto whole = xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, nullptr);
    auto named = fixture_inputs(dir);
    for (const auto* k : {"hidden_states", "encoder_hidden_states", "timestep", "guidance"}) {
      named[k] = named[k].narrow(0, 0, 1);
    }
    const auto in = whole->parse_forward_inputs(named);
    const int64_t cols = name == "flux2-other-s1" ? 4 : 6;
    const int64_t rows = in.tokens.size(1) / cols;
    const int steps = 3;
    auto inputs_at = [&](int i) {
      auto x = in;
      x.timestep = at::full({1}, 0.9 - 0.3 * i, in.timestep.options());
      return x;
    };
    // Any fixed function of (noise, latents) serves the comparison; patch 2's output has twice
    // the input's channels.
    auto step_fn = [](const at::Tensor& noise, const at::Tensor& latents,
                      const xfuser::models::dit::TokenRange&) {
      return latents - 0.25 * noise.narrow(2, 0, latents.size(2));
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
            "[flux2 pipefusion] %-16s 2 stages, 2 patches, warm-up %d of %d: vs serial "
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
