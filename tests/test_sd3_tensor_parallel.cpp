// SD3Transformer2DModel under tensor parallelism (mpiexec, NP 2), fp32, against one rank:
// - a random SD3.5-style model (dual attention, RMS QK norms, patch 2) built for tp rank r with
//   the same seed holds exactly the slices of the serial model, and its forward equals the
//   serial forward;
// - the diffusers SD3.5 fixture loaded by every rank as its slices equals diffusers' output;
// - a model part (PipeFusion stage) under tp equals the serial part.
#include <mpi.h>

#include <cstdio>
#include <fstream>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/sd3/sd3_transformer.h"
#include "models/weights/safetensors.h"
#include "parallel/mpi_communicator.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::SafetensorsFile;
using xfuser::models::TensorMap;
using xfuser::models::TensorParallel;
using xfuser::models::TensorParallelOps;
using xfuser::models::dit::DiTPart;
using xfuser::models::sd3::SD3Config;
using xfuser::models::sd3::SD3Transformer2DModel;
using xfuser::parallel::MpiCommunicator;
using xfuser::testing::max_rel_error;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

void report(const std::string& what, double rel) {
  if (world_rank() == 0) std::printf("[sd3 tp] %-44s max rel error %.2e\n", what.c_str(), rel);
}

SD3Config small_config() {
  SD3Config c;
  c.sample_size = 16;
  c.patch_size = 2;
  c.in_channels = 4;
  c.num_layers = 3;
  c.attention_head_dim = 8;
  c.num_attention_heads = 4;
  c.joint_attention_dim = 24;
  c.caption_projection_dim = 32;
  c.pooled_projection_dim = 12;
  c.pos_embed_max_size = 12;
  c.dual_attention_layers = {1};
  c.qk_norm = "rms_norm";
  return c;
}

TensorMap random_inputs(const SD3Config& c) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  TensorMap in;
  in["hidden_states"] = at::empty({2, c.in_channels, 8, 10}).normal_(0, 1, gen);
  in["encoder_hidden_states"] = at::empty({2, 6, c.joint_attention_dim}).normal_(0, 1, gen);
  in["pooled_projections"] = at::empty({2, c.pooled_projection_dim}).normal_(0, 1, gen);
  in["timestep"] = at::tensor({250.0f, 900.0f});
  return in;
}

class SD3TensorParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    world_ = std::make_shared<MpiCommunicator>("world", std::chrono::seconds(60));
  }
  static void TearDownTestSuite() { world_.reset(); }
  static TensorParallelOps ops() {
    TensorParallelOps o;
    auto* w = world_.get();
    o.all_reduce = [w](at::Tensor& t) { w->all_reduce(t); };
    o.all_gather_last = [w](const at::Tensor& t) { return w->all_gather(t, t.dim() - 1); };
    return o;
  }
  TensorParallel tp() const { return {world_->rank(), world_->size()}; }
  c10::InferenceMode guard_;
  static std::shared_ptr<MpiCommunicator> world_;
};
std::shared_ptr<MpiCommunicator> SD3TensorParallel::world_;

TEST_F(SD3TensorParallel, RandomModelEqualsSerialForward) {
  const auto cfg = small_config();
  SD3Transformer2DModel serial(cfg);
  serial.init_random(5, 0.2);
  SD3Transformer2DModel sharded(cfg, DiTPart{}, tp());
  sharded.init_random(5, 0.2);
  sharded.set_tensor_parallel_ops(ops());
  // Every block's linear layers are split; the embedders, the conditioning, the head, the QK norm
  // weights and the row-parallel biases are replicated.
  EXPECT_LT(sharded.num_parameters(), serial.num_parameters());
  auto in = random_inputs(cfg);
  auto want = serial.call("forward", in).at("sample");
  auto got = sharded.call("forward", in).at("sample");
  const double rel = max_rel_error(got, want);
  report("random SD3.5-style model, tp " + std::to_string(world_->size()), rel);
  EXPECT_LE(rel, 1e-5);

  // Without the collectives the forward is a clear error, not a wrong result.
  SD3Transformer2DModel no_ops(cfg, DiTPart{}, tp());
  no_ops.init_random(5, 0.2);
  EXPECT_THROW(no_ops.call("forward", in), xfuser::Error);
}

TEST_F(SD3TensorParallel, FixtureSlicesEqualDiffusers) {
  const fs::path dir = xfuser::testing::fixtures_dir() / "diffusers-v0.33.1" / "sd3-tiny_sd35-s1";
  XF_REQUIRE_FIXTURE(dir);
  std::ifstream f(dir / "config.json");
  auto cfg = SD3Config::from_json(nlohmann::json::parse(f), (dir / "config.json").string());
  SD3Transformer2DModel model(cfg, DiTPart{}, tp());
  SafetensorsFile weights((dir / "diffusion_pytorch_model.safetensors").string());
  model.load(weights, at::kFloat);
  model.set_tensor_parallel_ops(ops());
  SafetensorsFile inputs_file((dir / "inputs.safetensors").string());
  TensorMap in;
  for (const auto& n : inputs_file.names()) in[n] = inputs_file.get(n).clone();
  auto got = model.call("forward", in).at("sample");
  auto want = SafetensorsFile((dir / "output.safetensors").string()).get("sample");
  const double rel = max_rel_error(got, want);
  report("sd3-tiny_sd35-s1 fixture, tp " + std::to_string(world_->size()), rel);
  EXPECT_LE(rel, 1e-4);
}

TEST_F(SD3TensorParallel, PartUnderTensorParallelEqualsSerialPart) {
  const auto cfg = small_config();
  const DiTPart part{1, 3, false, true};
  SD3Transformer2DModel serial(cfg, part);
  serial.init_random(9, 0.2);
  SD3Transformer2DModel sharded(cfg, part, tp());
  sharded.init_random(9, 0.2);
  sharded.set_tensor_parallel_ops(ops());
  auto tokens = serial.parse_forward_inputs(random_inputs(cfg));
  auto a = serial.embed(tokens);
  auto b = sharded.embed(tokens);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(13);
  a.hidden = at::empty({2, 20, cfg.inner_dim()}).normal_(0, 1, gen);
  a.context = at::empty({2, 6, cfg.inner_dim()}).normal_(0, 1, gen);
  b.hidden = a.hidden.clone();
  b.context = a.context.clone();
  serial.run_blocks(a, 1, 3);
  sharded.run_blocks(b, 1, 3);
  const double rel = max_rel_error(sharded.finalize(b), serial.finalize(a));
  report("part [1, 3) + head, tp " + std::to_string(world_->size()), rel);
  EXPECT_LE(rel, 1e-5);
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
