// CPU offload (models/common/offload.h): which parameters are on the device when, what they
// hold, and the bookkeeping the run report shows. On the checked device (tests/checked_device.h,
// libtorch >= 2.4) the parameters really move between host and device memory.
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "models/common/layers.h"
#include "models/common/module.h"
#include "models/common/offload.h"
#include "tests/checked_device.h"
#include "tests/test_util.h"

namespace {

using xfuser::models::LayerKind;
using xfuser::models::Module;
using xfuser::models::Offloader;
using xfuser::models::OffloadMode;
using xfuser::models::ParamSlot;

// An embedding, three blocks and a projection, each [4, 4] float32 (64 bytes).
class Toy : public Module {
 public:
  explicit Toy(uint64_t seed) {
    embed = &param("embed.weight", {4, 4});
    for (int i = 0; i < 3; ++i) {
      blocks.push_back(&param("blocks." + std::to_string(i) + ".weight", {4, 4}));
      blocks.back()->layer = LayerKind::kLinear;
    }
    proj = &param("proj.weight", {4, 4});
    init_random(seed, 1.0);
    for (auto& [name, slot] : named_parameters()) expected.push_back(slot->value().clone());
  }
  // Every parameter's value equals its value before the offloader took it.
  void expect_values() const {
    const auto params = named_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(at::equal(params[i].second->value().cpu(), expected[i])) << params[i].first;
    }
  }
  ParamSlot* embed = nullptr;
  ParamSlot* proj = nullptr;
  std::vector<ParamSlot*> blocks;
  std::vector<at::Tensor> expected;
};

constexpr int64_t kParam = 64;  // bytes of one [4, 4] float32 parameter

TEST(Offload, ModelOffloadHoldsOneComponentAtATime) {
  auto a = std::make_shared<Toy>(1), b = std::make_shared<Toy>(2);
  Offloader off(OffloadMode::kModel, c10::Device(c10::kCPU));
  off.add_component("a", a, {"blocks."});  // block lists are for sequential offload only
  off.add_component("b", b);
  auto s = off.stats();
  EXPECT_EQ(s.components, 2);
  EXPECT_EQ(s.blocks, 0);
  EXPECT_EQ(s.largest_component_bytes, 5 * kParam);
  EXPECT_EQ(s.bound_bytes, 5 * kParam);
  EXPECT_EQ(s.resident_bytes, 0);

  a->blocks[1]->value();
  EXPECT_EQ(off.stats().resident_bytes, 5 * kParam) << "a whole component comes at once";
  a->proj->value();
  EXPECT_EQ(off.stats().onloads, 1) << "a component in use is not copied again";
  b->embed->value();
  s = off.stats();
  EXPECT_EQ(s.resident_bytes, 5 * kParam) << "a leaves when b arrives";
  EXPECT_EQ(s.onloads, 2);
  EXPECT_EQ(s.onload_bytes, 10 * kParam);
  EXPECT_EQ(s.peak_resident_bytes, 5 * kParam);
  a->expect_values();
  b->expect_values();
  off.offload_all();
  EXPECT_EQ(off.stats().resident_bytes, 0);
  xfuser::testing::expect_error_containing([&] { off.add_component("again", a); },
                                           {"offload", "again", "already offloaded as a"});
}

TEST(Offload, SequentialOffloadStreamsBlocksInForwardOrder) {
  auto t = std::make_shared<Toy>(3);
  Offloader off(OffloadMode::kSequential, c10::Device(c10::kCPU));
  off.add_component("transformer", t, {"blocks."});
  auto s = off.stats();
  EXPECT_EQ(s.blocks, 3);
  EXPECT_EQ(s.largest_block_bytes, kParam);
  EXPECT_EQ(s.largest_resident_part_bytes, 2 * kParam);  // embed + proj
  EXPECT_EQ(s.bound_bytes, 4 * kParam);                  // resident part + two blocks

  t->embed->value();
  EXPECT_EQ(off.stats().resident_bytes, 2 * kParam) << "the parts outside the blocks come first";
  t->blocks[0]->value();
  EXPECT_EQ(off.stats().resident_bytes, 4 * kParam) << "block 0, and block 1 copied ahead";
  t->blocks[1]->value();
  EXPECT_EQ(off.stats().resident_bytes, 4 * kParam) << "block 0 left, block 2 copied ahead";
  t->blocks[2]->value();  // block 1 leaves; block 0 is copied ahead for the next forward
  t->proj->value();
  s = off.stats();
  EXPECT_EQ(s.resident_bytes, 4 * kParam);
  EXPECT_EQ(s.onloads, 5);  // the resident part, blocks 0, 1, 2, and 0 again
  t->blocks[0]->value();    // the next forward finds block 0 ready
  EXPECT_EQ(off.stats().onloads, 6) << "block 1 is copied ahead, nothing else";
  // Out of order (block 2 while block 1 is ahead): the stale copy leaves, the bound holds.
  t->blocks[2]->value();
  s = off.stats();
  EXPECT_EQ(s.resident_bytes, 4 * kParam);
  EXPECT_EQ(s.peak_resident_bytes, 4 * kParam);
  EXPECT_LE(s.peak_resident_bytes, s.bound_bytes);
  EXPECT_EQ(s.peak_streamed_bytes, 4 * kParam);
  EXPECT_EQ(s.streamed_bound_bytes, 4 * kParam);
  t->expect_values();
  off.offload_all();
  EXPECT_EQ(off.stats().resident_bytes, 0);
}

TEST(Offload, Fp8WeightsMoveWithTheirScales) {
  auto t = std::make_shared<Toy>(4);
  xfuser::models::WeightFormat fp8;
  fp8.kind = xfuser::models::WeightFormat::Kind::kFp8Scaled;
  EXPECT_EQ(t->apply_weight_format(fp8), 3);  // the three Linear blocks
  std::vector<at::Tensor> before;
  for (auto* b : t->blocks) before.push_back(b->value());
  const int64_t block_bytes = t->blocks[0]->bytes();
  EXPECT_EQ(block_bytes, 16 + 4 * 4);  // fp8 values and one float32 scale per row
  Offloader off(OffloadMode::kSequential, c10::Device(c10::kCPU));
  off.add_component("transformer", t, {"blocks."});
  EXPECT_EQ(off.stats().largest_block_bytes, block_bytes);
  for (size_t i = 0; i < t->blocks.size(); ++i) {
    EXPECT_TRUE(at::equal(t->blocks[i]->value(), before[i])) << "block " << i;
  }
  // models::linear reads the fp8 values and scales through the slot, resident first.
  off.offload_all();
  const at::Tensor x = at::randn({2, 4});
  const at::Tensor y = xfuser::models::linear(x, *t->blocks[1], nullptr);
  EXPECT_EQ(off.stats().resident_bytes, 2 * block_bytes);  // block 1 and block 2 ahead
  EXPECT_TRUE(y.defined());
}

TEST(Offload, DestroyingTheOffloaderLeavesPlainHostParameters) {
  auto t = std::make_shared<Toy>(5);
  {
    Offloader off(OffloadMode::kSequential, c10::Device(c10::kCPU));
    off.add_component("transformer", t, {"blocks."});
    t->blocks[0]->value();
  }
  for (auto& [name, slot] : t->named_parameters()) {
    EXPECT_EQ(slot->group, nullptr) << name;
    EXPECT_TRUE(slot->tensor.device().is_cpu()) << name;
  }
  t->expect_values();
}

// On a device of its own, the host and device copies are distinct tensors: a parameter is on
// the device exactly while its group is resident, and on the host otherwise.
TEST(Offload, ParametersMoveBetweenHostAndCheckedDevice) {
  if (!xfuser::testing::checked_device_available()) GTEST_SKIP() << "needs libtorch >= 2.4";
  const c10::Device device = xfuser::testing::checked_device();
  auto t = std::make_shared<Toy>(6), enc = std::make_shared<Toy>(7);
  Offloader off(OffloadMode::kSequential, device);
  off.add_component("transformer", t, {"blocks."});
  off.add_component("text_encoder", enc);
  for (auto& [name, slot] : t->named_parameters()) {
    EXPECT_TRUE(slot->tensor.device().is_cpu()) << name << " before use";
  }
  EXPECT_EQ(t->embed->value().device(), device);
  EXPECT_EQ(t->blocks[0]->value().device(), device);
  EXPECT_EQ(t->blocks[1]->tensor.device(), device) << "block 1 is copied ahead";
  EXPECT_TRUE(t->blocks[2]->tensor.device().is_cpu());
  t->blocks[1]->value();
  EXPECT_TRUE(t->blocks[0]->tensor.device().is_cpu()) << "block 0 left the device";
  EXPECT_EQ(t->proj->tensor.device(), device);
  // A model on the device: its compute sees device weights only.
  const at::Tensor x = at::randn({2, 4}).to(device);
  const at::Tensor y = xfuser::models::linear(x, *t->blocks[2], nullptr);
  EXPECT_EQ(y.device(), device);
  EXPECT_TRUE(at::allclose(y.cpu(), at::linear(x.cpu(), t->expected[3])));
  enc->embed->value();  // another component: the transformer leaves entirely
  for (auto& [name, slot] : t->named_parameters()) {
    EXPECT_TRUE(slot->tensor.device().is_cpu()) << name << " after the text encoder came";
  }
  EXPECT_EQ(enc->proj->tensor.device(), device);
  t->expect_values();
  enc->expect_values();
  off.offload_all();
  for (auto& [name, slot] : enc->named_parameters()) {
    EXPECT_TRUE(slot->tensor.device().is_cpu()) << name << " after offload_all";
  }
}

}  // namespace
