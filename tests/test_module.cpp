#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "backends/error.h"
#include "models/common/module.h"
#include "models/weights/tensor_source.h"

namespace {

using xfuser::models::Module;
using xfuser::models::TensorMapSource;

struct Leaf : Module {
  Leaf() {
    w = &param("weight", {4, 3});
    b = &param("bias", {4});
  }
  xfuser::models::ParamSlot* w;
  xfuser::models::ParamSlot* b;
};

struct Tree : Module {
  Tree() {
    a = child("a", std::make_shared<Leaf>());
    blocks0 = child("blocks.0", std::make_shared<Leaf>());
  }
  std::shared_ptr<Leaf> a, blocks0;
};

std::map<std::string, at::Tensor> full_state() {
  return {{"a.weight", at::randn({4, 3})},
          {"a.bias", at::randn({4})},
          {"blocks.0.weight", at::randn({4, 3})},
          {"blocks.0.bias", at::randn({4})}};
}

TEST(Module, NamesFollowTheTree) {
  Tree t;
  auto params = t.named_parameters();
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params[0].first, "a.weight");
  EXPECT_EQ(params[3].first, "blocks.0.bias");
  EXPECT_EQ(t.num_parameters(), 2 * (12 + 4));
}

TEST(Module, LoadsAndCastsDtype) {
  auto state = full_state();
  Tree t;
  t.load(TensorMapSource(state), at::kBFloat16);
  EXPECT_EQ(t.a->w->tensor.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::allclose(t.a->w->tensor.to(at::kFloat), state["a.weight"], 1e-2, 1e-2));
  Tree f;
  f.load(TensorMapSource(state), at::kFloat);
  // Same dtype: no copy.
  EXPECT_EQ(f.a->w->tensor.data_ptr(), state["a.weight"].data_ptr());
}

TEST(Module, StrictLoadListsEveryProblemInOneError) {
  auto state = full_state();
  state.erase("a.bias");
  state["blocks.0.weight"] = at::randn({4, 5});
  state["extra.tensor"] = at::randn({1});
  Tree t;
  try {
    t.load(TensorMapSource(state, "ckpt.safetensors"), at::kFloat);
    FAIL() << "expected an error";
  } catch (const xfuser::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("1 missing, 1 shape mismatches, 1 unexpected"), std::string::npos) << msg;
    EXPECT_NE(msg.find("a.bias [4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("blocks.0.weight: checkpoint [4, 5], model expects [4, 3]"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("extra.tensor"), std::string::npos) << msg;
    EXPECT_NE(msg.find("ckpt.safetensors"), std::string::npos) << msg;
  }
}

TEST(Module, PrefixAndIgnoredPrefixes) {
  std::map<std::string, at::Tensor> state;
  for (auto& [k, v] : full_state()) state["transformer." + k] = v;
  state["transformer.rope.cache"] = at::zeros({1});
  state["vae.x"] = at::zeros({1});
  Tree t;
  xfuser::models::LoadOptions opts;
  opts.ignore_unexpected_prefixes = {"rope."};
  t.load(TensorMapSource(state), at::kFloat, "transformer.", opts);
  EXPECT_TRUE(t.blocks0->b->tensor.defined());
  Tree strict;
  EXPECT_THROW(strict.load(TensorMapSource(state), at::kFloat, "transformer."), xfuser::Error);
}

TEST(Module, InitRandomIsSeeded) {
  Tree a, b, c;
  a.init_random(7);
  b.init_random(7);
  c.init_random(8);
  EXPECT_TRUE(at::equal(a.a->w->tensor, b.a->w->tensor));
  EXPECT_FALSE(at::equal(a.a->w->tensor, c.a->w->tensor));
}

}  // namespace
