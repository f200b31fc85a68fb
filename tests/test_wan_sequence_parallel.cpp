// WanTransformer3DModel under the generic DiT sequence-parallel driver (mpiexec, NP 2): Ulysses 2
// and ring 2 over the self-attention, with the cross-attention to the text (and, I2V, to the
// image embeddings) run locally on the whole text, equal the one-rank forward and diffusers, on
// the T2V and I2V fixtures; an odd token count (padded chunks) too. Tensor parallel 2 (heads
// split, the QK norm across all heads all-reduced) equals one rank and diffusers. PipeFusion over
// 2 stages (only the image stream between stages) equals the serial loop.
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
#include "models/wan/wan_transformer.h"
#include "models/weights/safetensors.h"
#include "parallel/mpi_communicator.h"
#include "parallel/process_groups.h"
#include "parallel/world_config.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::wan::WanConfig;
using xfuser::models::wan::WanTransformer3DModel;
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
  return xfuser::testing::fixtures_dir() / "diffusers-v0.33.1" / name;
}

class WanSequenceParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    world_ = std::make_shared<MpiCommunicator>("world", std::chrono::seconds(60));
  }
  static void TearDownTestSuite() { world_.reset(); }
  c10::InferenceMode guard_;
  static std::shared_ptr<MpiCommunicator> world_;
};
std::shared_ptr<MpiCommunicator> WanSequenceParallel::world_;

TEST_F(WanSequenceParallel, UlyssesAndRingEqualOneRank) {
  for (const std::string name : {"wan-tiny-s1", "wan-i2v-tiny-s1"}) {
    SCOPED_TRACE(name);
    const fs::path dir = fixture_case(name);
    XF_REQUIRE_FIXTURE(dir);
    std::ifstream f(dir / "config.json");
    auto cfg = WanConfig::from_json(nlohmann::json::parse(f), (dir / "config.json").string());
    WanTransformer3DModel model(cfg);
    SafetensorsFile weights((dir / "diffusion_pytorch_model.safetensors").string());
    model.load(weights, at::kFloat);
    SafetensorsFile inputs_file((dir / "inputs.safetensors").string());
    TensorMap named;
    for (const auto& n : inputs_file.names()) named[n] = inputs_file.get(n).clone();
    const auto in = model.parse_forward_inputs(named);
    const auto want = model.forward(in);
    const auto diffusers = SafetensorsFile((dir / "output.safetensors").string()).get("sample");
    for (auto [ulysses, ring] : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}}) {
      auto groups = std::make_shared<ProcessGroups>(
          WorldConfig::from_degrees(world_->size(), 1, 1, 1, ulysses, ring, 1), world_);
      auto got = xfuser::models::dit::sequence_parallel_forward(model, in, *groups);
      const double rel = max_rel_error(got, want);
      auto sample = model.forward_outputs(got, named).at("sample");
      const double rel_diffusers = max_rel_error(sample, diffusers);
      if (world_rank() == 0) {
        std::printf("[wan sp] %-16s ulysses %d ring %d: vs one rank %.2e, vs diffusers %.2e\n",
                    name.c_str(), ulysses, ring, rel, rel_diffusers);
      }
      EXPECT_LE(rel, 1e-5) << "ulysses " << ulysses << " ring " << ring;
      EXPECT_LE(rel_diffusers, 1e-4) << "ulysses " << ulysses << " ring " << ring;
    }
    // An odd token count (a 1 x 3 x 5 grid: 15 tokens): the chunks are padded.
    auto odd = in;
    odd.tokens = in.tokens.narrow(1, 0, 15);
    odd.token_ids = WanTransformer3DModel::token_ids(1, 3, 5, in.tokens.options());
    const auto odd_want = model.forward(odd);
    for (auto [ulysses, ring] : std::vector<std::pair<int, int>>{{2, 1}, {1, 2}}) {
      auto groups = std::make_shared<ProcessGroups>(
          WorldConfig::from_degrees(world_->size(), 1, 1, 1, ulysses, ring, 1), world_);
      auto got = xfuser::models::dit::sequence_parallel_forward(model, odd, *groups);
      const double rel = max_rel_error(got, odd_want);
      if (world_rank() == 0) {
        std::printf("[wan sp] %-16s 15 tokens, ulysses %d ring %d: vs one rank %.2e\n",
                    name.c_str(), ulysses, ring, rel);
      }
      EXPECT_LE(rel, 1e-5) << "ulysses " << ulysses << " ring " << ring;
    }
  }
}

TEST_F(WanSequenceParallel, TensorParallelTwoEqualsOneRank) {
  for (const std::string name : {"wan-tiny-s1", "wan-i2v-tiny-s1"}) {
    SCOPED_TRACE(name);
    const fs::path dir = fixture_case(name);
    XF_REQUIRE_FIXTURE(dir);
    auto one = xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, nullptr);
    SafetensorsFile inputs_file((dir / "inputs.safetensors").string());
    TensorMap named;
    for (const auto& n : inputs_file.names()) named[n] = inputs_file.get(n).clone();
    const auto in = one->parse_forward_inputs(named);
    const auto want = one->forward(in);
    const auto diffusers = SafetensorsFile((dir / "output.safetensors").string()).get("sample");
    auto groups = std::make_shared<ProcessGroups>(
        WorldConfig::from_degrees(world_->size(), 1, 1, 1, 1, 1, 2), world_);
    auto tp = xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, groups.get());
    EXPECT_EQ(tp->tensor_parallel().size, 2);
    EXPECT_LT(tp->num_parameters(), one->num_parameters());
    auto got = xfuser::models::dit::sequence_parallel_forward(*tp, in, *groups);
    const double rel = max_rel_error(got, want);
    const double rel_diffusers =
        max_rel_error(tp->forward_outputs(got, named).at("sample"), diffusers);
    if (world_rank() == 0) {
      std::printf("[wan tp] %-16s tp 2: vs one rank %.2e, vs diffusers %.2e\n", name.c_str(), rel,
                  rel_diffusers);
    }
    EXPECT_LE(rel, 1e-5);
    EXPECT_LE(rel_diffusers, 1e-4);
  }
}

// PipeFusion over 2 stages (kCross: only the image stream travels; every stage embeds the text
// itself): with warm-up through all steps the result equals the serial loop; with one warm-up
// step the later steps attend stale K/V of the other patches (an approximation), still close.
TEST_F(WanSequenceParallel, PipeFusionTwoStagesEqualsSerial) {
  for (const std::string name : {"wan-tiny-s1", "wan-i2v-tiny-s1"}) {
    SCOPED_TRACE(name);
    const fs::path dir = fixture_case(name);
    XF_REQUIRE_FIXTURE(dir);
    auto whole = xfuser::models::dit::load_dit_transformer(dir.string(), at::kFloat, nullptr);
    SafetensorsFile inputs_file((dir / "inputs.safetensors").string());
    TensorMap named;
    for (const auto& n : inputs_file.names()) named[n] = inputs_file.get(n).clone();
    const auto in = whole->parse_forward_inputs(named);
    const auto& hs = named.at("hidden_states");
    const int64_t rows = hs.size(2) * hs.size(3) / 2, cols = hs.size(4) / 2;  // (F' H') x W'
    const int steps = 3;
    auto inputs_at = [&](int i) {
      auto x = in;
      x.timestep = at::full({1}, 900 - 300 * i, in.timestep.options());
      return x;
    };
    // The "scheduler": any fixed function of (noise, latents) serves the comparison.
    auto step_fn = [](const at::Tensor& noise, const at::Tensor& latents,
                      const xfuser::models::dit::TokenRange&) { return latents - 0.25 * noise; };
    at::Tensor serial = in.tokens.clone();
    for (int i = 0; i < steps; ++i) {
      auto x = inputs_at(i);
      x.tokens = serial;
      serial = step_fn(whole->forward(x), serial, {});
    }
    auto groups = std::make_shared<ProcessGroups>(
        WorldConfig::from_degrees(world_->size(), 1, 1, 2, 1, 1, 1), world_);
    const auto layers = xfuser::models::dit::pipefusion_stage_layers(*whole, 2, {});
    auto stage = xfuser::models::dit::load_dit_transformer(
        dir.string(), at::kFloat, groups.get(),
        xfuser::models::dit::pipefusion_stage_part(layers, groups->coords().pp));
    EXPECT_EQ(stage->part().block_end - stage->part().block_begin, 1);
    for (int warmup : {steps, 1}) {
      xfuser::models::dit::PipeFusion pf(*stage, *groups, rows, cols, 2, warmup, steps);
      at::Tensor latents = in.tokens.clone();
      for (int i = 0; i < steps; ++i) {
        pf.step(
            i, inputs_at(i), 1, [](const at::Tensor& out) { return out; }, step_fn, latents);
      }
      const double rel = max_rel_error(latents, serial);
      if (world_rank() == 0) {
        std::printf(
            "[wan pipefusion] %-16s 2 stages, 2 patches, warm-up %d of %d: vs serial "
            "%.2e\n",
            name.c_str(), warmup, steps, rel);
      }
      if (warmup == steps) {
        EXPECT_LE(rel, 1e-5);
      } else {
        EXPECT_GT(rel, 0.0);  // the stale path ran
        // and stays an approximation of the serial result (measured 5e-3; a stage without the
        // text conditioning or a misplaced patch changes the latents at full scale)
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
