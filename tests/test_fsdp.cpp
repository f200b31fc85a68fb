// FSDP (models/common/fsdp.h) under mpiexec (NP 1, 2 and 3): what each rank reads of a
// checkpoint, what a gathered parameter holds, which groups are whole when, the bookkeeping of
// the run report, and a rank that gathers another group than its peers named as an error on
// every rank (no hang). Uneven row counts (5 rows over 2 or 3 ranks, fewer rows than ranks) and
// fp8 weights with per-row scales are covered.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "backends/fp8.h"
#include "models/common/fsdp.h"
#include "models/common/module.h"
#include "models/weights/tensor_source.h"
#include "parallel/two_plane_communicator.h"
#include "tests/checked_device.h"
#include "tests/mpi_test_main.h"
#include "tests/test_util.h"

namespace {

using xfuser::models::FsdpSharder;
using xfuser::models::LayerKind;
using xfuser::models::LoadOptions;
using xfuser::models::Module;
using xfuser::models::ParamSlot;
using xfuser::models::TensorMapSource;
using xfuser::models::WeightFormat;
using xfuser::testing::g_world;

// An embedding [5, 4], three blocks (a [6, 4] weight and a [6] bias each), a [1, 4] table and a
// [5] projection bias: row counts that split unevenly, and tensors with fewer rows than ranks.
class Toy : public Module {
 public:
  Toy() {
    embed = &param("embed.weight", {5, 4});
    for (int i = 0; i < 3; ++i) {
      blocks.push_back(&param("blocks." + std::to_string(i) + ".linear.weight", {6, 4}));
      blocks.back()->layer = LayerKind::kLinear;
      param("blocks." + std::to_string(i) + ".linear.bias", {6});
    }
    table = &param("table", {1, 4});
    bias = &param("proj.bias", {5});
  }
  ParamSlot* embed = nullptr;
  ParamSlot* table = nullptr;
  ParamSlot* bias = nullptr;
  std::vector<ParamSlot*> blocks;
};

// The checkpoint every rank reads: the same values everywhere.
std::map<std::string, at::Tensor> checkpoint() {
  Toy shape_only;
  std::map<std::string, at::Tensor> out;
  int64_t k = 0;
  for (auto& [name, slot] : shape_only.named_parameters()) {
    out[name] = at::randn(slot->shape, at::make_generator<at::CPUGeneratorImpl>(100 + k++));
  }
  return out;
}

std::shared_ptr<Toy> load_sharded(const TensorMapSource& source, FsdpSharder& sharder,
                                  const WeightFormat& format = {}) {
  auto toy = std::make_shared<Toy>();
  LoadOptions options;
  sharder.configure(options);
  options.weight_format = format;
  toy->load(source, at::kFloat, "", options);
  return toy;
}

TEST(Fsdp, FindsTheOutermostBlockLists) {
  EXPECT_EQ(FsdpSharder::find_block_prefixes(
                {"shared.weight", "encoder.block.0.layer.0.SelfAttention.q.weight",
                 "encoder.block.0.layer.1.DenseReluDense.wi.weight",
                 "encoder.block.1.layer.0.SelfAttention.q.weight", "encoder.final_layer_norm"}),
            std::vector<std::string>{"encoder.block."});
  EXPECT_EQ(FsdpSharder::find_block_prefixes({"text_model.encoder.layers.0.mlp.fc1.weight",
                                              "text_model.encoder.layers.1.mlp.fc1.weight",
                                              "text_model.final_layer_norm.weight"}),
            std::vector<std::string>{"text_model.encoder.layers."});
  // One numbered entry is not a list.
  EXPECT_TRUE(FsdpSharder::find_block_prefixes({"proj.0.weight", "norm.weight"}).empty());
}

TEST(Fsdp, EachRankReadsItsRowsAndGathersTheWholeParameters) {
  const int P = g_world->size(), me = g_world->rank();
  const TensorMapSource source(checkpoint(), "toy");
  FsdpSharder sharder(*g_world, c10::Device(c10::kCPU));
  auto toy = load_sharded(source, sharder);
  // Loaded: a parameter with at least P rows holds chunk `me` of ceil(rows / P) rows,
  // zero-padded; one with fewer rows is whole.
  for (auto& [name, slot] : toy->named_parameters()) {
    SCOPED_TRACE(name);
    const at::Tensor whole = source.get(name);
    if (whole.size(0) < P || P == 1) {
      EXPECT_FALSE(slot->rows.has_value());
      EXPECT_TRUE(slot->tensor.equal(whole));
      continue;
    }
    ASSERT_TRUE(slot->rows.has_value());
    const int64_t chunk = (whole.size(0) + P - 1) / P;
    const int64_t begin = std::min<int64_t>(whole.size(0), me * chunk);
    const int64_t len = std::min<int64_t>(whole.size(0), begin + chunk) - begin;
    ASSERT_EQ(slot->tensor.size(0), chunk);
    EXPECT_TRUE(slot->tensor.narrow(0, 0, len).equal(whole.narrow(0, begin, len)));
    EXPECT_EQ(slot->tensor.narrow(0, len, chunk - len).abs().sum().item<float>(), 0.0f);
  }
  sharder.add_component("toy", toy, {"blocks."});
  const auto s0 = sharder.stats();
  EXPECT_EQ(s0.group_size, P);
  EXPECT_EQ(s0.blocks, P == 1 ? 0 : 3);
  int64_t model = 0;
  for (const auto& [name, t] : checkpoint()) model += t.numel() * 4;
  EXPECT_EQ(s0.model_bytes, model);
  EXPECT_EQ(s0.gathered_bytes, 0);
  // Every value read through value() is the whole checkpoint tensor.
  for (auto& [name, slot] : toy->named_parameters()) {
    EXPECT_TRUE(slot->value().equal(source.get(name))) << name;
  }
  // This rank holds the chunks (with their padding) and the parameters too small to shard.
  int64_t shards = 0, replicated = 0;
  for (const auto& [name, t] : checkpoint()) {
    const int64_t row_bytes = t.numel() / t.size(0) * 4;
    if (P > 1 && t.size(0) >= P) {
      shards += (t.size(0) + P - 1) / P * row_bytes;
    } else {
      replicated += t.numel() * 4;
    }
  }
  const auto s = sharder.stats();
  EXPECT_EQ(s.shard_bytes, shards);
  EXPECT_EQ(s.replicated_bytes, replicated);
  EXPECT_LE(s.peak_resident_bytes, s.bound_bytes);
  sharder.release_all();
  EXPECT_EQ(sharder.stats().gathered_bytes, 0);
  EXPECT_EQ(toy->blocks[0]->tensor.size(0), (6 + P - 1) / P);
}

TEST(Fsdp, BlocksStreamInForwardOrderWithTheNextOnePrefetched) {
  const int P = g_world->size();
  if (P == 1) GTEST_SKIP() << "nothing is sharded on one rank";
  const TensorMapSource source(checkpoint(), "toy");
  FsdpSharder sharder(*g_world, c10::Device(c10::kCPU));
  auto toy = load_sharded(source, sharder);
  sharder.add_component("toy", toy, {"blocks."});
  const auto s0 = sharder.stats();
  const int64_t block = (6 * 4 + 6) * 4;  // weight and bias of a block, whole
  EXPECT_EQ(s0.largest_block_bytes, block);
  const int64_t rest = s0.largest_rest_bytes;  // embed [5, 4] and proj.bias [5], whole
  toy->embed->value();                         // the rest of the component, read before the blocks
  EXPECT_EQ(sharder.stats().gathered_bytes, rest);
  EXPECT_EQ(sharder.stats().gathers, 1);
  toy->blocks[0]->value();
  EXPECT_EQ(sharder.stats().gathers, 3) << "block 0, and block 1 prefetched";
  EXPECT_EQ(sharder.stats().gathered_bytes, 2 * block) << "the rest goes while blocks run";
  toy->blocks[1]->value();
  EXPECT_EQ(sharder.stats().gathers, 4) << "block 0 freed, block 2 prefetched";
  EXPECT_EQ(sharder.stats().gathered_bytes, 2 * block);
  toy->blocks[2]->value();
  EXPECT_EQ(sharder.stats().gathers, 5) << "cyclic: block 0 on its way for the next step";
  toy->bias->value();  // the rest again, after the blocks: block 2 is done and goes
  EXPECT_EQ(sharder.stats().gathers, 6);
  EXPECT_EQ(sharder.stats().gathered_bytes, rest + block) << "the rest and block 0";
  toy->embed->value();  // the next step: the rest is still there, block 0 too
  toy->blocks[0]->value();
  EXPECT_EQ(sharder.stats().gathers, 7) << "only block 1's prefetch";
  const auto s = sharder.stats();
  EXPECT_EQ(s.peak_gathered_bytes, std::max(2 * block, rest + block));
  EXPECT_EQ(s.bound_bytes, s.shard_bytes + s.replicated_bytes + std::max(2 * block, rest + block));
  EXPECT_LE(s.peak_resident_bytes, s.bound_bytes);
  EXPECT_TRUE(toy->blocks[2]->value().equal(source.get("blocks.2.linear.weight")));
  sharder.release_all();
  EXPECT_EQ(sharder.stats().gathered_bytes, 0);
  // After release the slots hold their chunks again, and a second pass gathers again.
  EXPECT_EQ(toy->blocks[0]->tensor.size(0), (6 + P - 1) / P);
  EXPECT_TRUE(toy->blocks[0]->value().equal(source.get("blocks.0.linear.weight")));
}

TEST(Fsdp, Fp8WeightsGatherTheirValuesAndScales) {
  const TensorMapSource source(checkpoint(), "toy");
  WeightFormat format;
  format.kind = WeightFormat::Kind::kFp8Scaled;
  // The unsharded model in the same format: the gathered values and scales equal it exactly
  // (scales are per row, so a row's quantization does not depend on the sharding).
  Toy whole;
  LoadOptions plain;
  plain.weight_format = format;
  whole.load(source, at::kFloat, "", plain);
  FsdpSharder sharder(*g_world, c10::Device(c10::kCPU));
  auto toy = load_sharded(source, sharder, format);
  sharder.add_component("toy", toy, {"blocks."});
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(whole.blocks[i]->fp8.has_value());
    EXPECT_TRUE(toy->blocks[i]->value().equal(whole.blocks[i]->value())) << i;
  }
  sharder.release_all();
}

// On a device with its own memory (the checked device, libtorch >= 2.4) behind a two-plane world
// without a device plane (a GPU run with --comm_backend mpi): the chunks live on the device, the
// gathers are staged through host memory, and every value read is the checkpoint's, on the
// device.
TEST(Fsdp, DeviceChunksGatherThroughTheHostPlane) {
  if (!xfuser::testing::checked_device_available()) GTEST_SKIP() << "needs libtorch >= 2.4";
  const c10::Device device = xfuser::testing::checked_device();
  auto host =
      std::shared_ptr<xfuser::parallel::Communicator>(g_world->split(0, g_world->rank(), "world"));
  xfuser::parallel::TwoPlaneCommunicator two(host, nullptr);
  const TensorMapSource source(checkpoint(), "toy");
  FsdpSharder sharder(two, device);
  auto toy = std::make_shared<Toy>();
  LoadOptions options;
  sharder.configure(options);
  options.device = device;
  toy->load(source, at::kFloat, "", options);
  sharder.add_component("toy", toy, {"blocks."});
  for (auto& [name, slot] : toy->named_parameters()) {
    const at::Tensor v = slot->value();
    EXPECT_EQ(v.device(), device) << name;
    EXPECT_TRUE(v.cpu().equal(source.get(name))) << name;
  }
  sharder.release_all();
  EXPECT_EQ(sharder.stats().gathered_bytes, 0);
  if (g_world->size() > 1) {
    EXPECT_GT(two.stats().at("all_gather").calls, 0);
  }
}

// Rank 0 reads block 1 while the others read block 0: the gathers carry the groups' identities,
// and every rank fails naming both instead of computing with another block's weights.
TEST(Fsdp, RanksThatGatherDifferentGroupsFailNamingBoth) {
  const int P = g_world->size(), me = g_world->rank();
  if (P == 1) GTEST_SKIP() << "one rank cannot disagree with itself";
  const TensorMapSource source(checkpoint(), "toy");
  FsdpSharder sharder(*g_world, c10::Device(c10::kCPU));
  auto toy = load_sharded(source, sharder);
  sharder.add_component("toy", toy, {"blocks."});
  xfuser::testing::expect_error_containing(
      [&] { toy->blocks[me == 0 ? 1 : 0]->value(); },
      {"fsdp: ranks of group 'world' gathered different parameters",
       me == 0 ? "toy: blocks.1" : "toy: blocks.0", me == 0 ? "toy: blocks.0" : "toy: blocks.1",
       "must run the same forwards in the same order"});
}

}  // namespace
