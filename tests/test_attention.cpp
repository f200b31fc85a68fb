// backends::attention and merge_attention against a naive float64 softmax(QK^T)V reference.
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "backends/attention.h"
#include "backends/error.h"
#include "tests/test_util.h"

namespace {

using xfuser::backends::attention;
using xfuser::backends::AttentionOptions;
using xfuser::backends::AttentionOutput;
using xfuser::backends::merge_attention;
using xfuser::testing::max_rel_error;

struct Reference {
  at::Tensor out;  // [B, Sq, H, Dv] float64
  at::Tensor lse;  // [B, H, Sq] float64
};

// Naive float64 reference; `mask` broadcastable to [B, H, Sq, Sk] (True = attend), `bias`
// additive and broadcastable to the same.
Reference naive(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                const at::Tensor& mask = {}, const at::Tensor& bias = {}) {
  auto qd = q.to(at::kDouble).permute({0, 2, 1, 3});  // [B, H, Sq, D]
  auto kd = k.to(at::kDouble).permute({0, 2, 1, 3});
  auto vd = v.to(at::kDouble).permute({0, 2, 1, 3});
  auto s = at::matmul(qd, kd.transpose(-1, -2)) * scale;  // [B, H, Sq, Sk]
  if (bias.defined()) s = s + bias.to(at::kDouble);
  if (mask.defined()) {
    s = s.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  }
  auto lse = at::logsumexp(s, -1);  // -inf for fully masked rows
  auto p = at::exp(s - lse.unsqueeze(-1));
  p = at::nan_to_num(p, 0.0);  // fully masked rows: exp(-inf - -inf) = nan -> 0
  auto out = at::matmul(p, vd).permute({0, 2, 1, 3});  // [B, Sq, H, Dv]
  return {out, lse};
}

// Compares finite lse entries and checks -inf entries coincide.
void expect_lse_equal(const at::Tensor& got, const at::Tensor& want, double tol) {
  ASSERT_EQ(got.scalar_type(), at::kFloat);
  ASSERT_EQ(got.sizes(), want.sizes());
  auto g = got.to(at::kDouble);
  auto finite = at::isfinite(want);
  EXPECT_TRUE(at::equal(at::isfinite(g), finite)) << "lse -inf pattern differs";
  EXPECT_FALSE(at::isnan(g).any().item<bool>());
  if (finite.any().item<bool>()) {
    double err = (g.masked_select(finite) - want.masked_select(finite)).abs().max().item<double>();
    EXPECT_LE(err, tol);
  }
}

struct Shape {
  int64_t b, sq, sk, h, d, dv;
};

class AttentionShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(AttentionShapes, MatchesNaiveForEveryChunkSize) {
  const auto s = GetParam();
  at::manual_seed(1);
  auto q = at::randn({s.b, s.sq, s.h, s.d});
  auto k = at::randn({s.b, s.sk, s.h, s.d});
  auto v = at::randn({s.b, s.sk, s.h, s.dv});
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  auto ref = naive(q, k, v, scale);
  for (int64_t chunk : {int64_t{0}, int64_t{1}, int64_t{3}, s.sq, s.sq + 5}) {
    AttentionOptions opts;
    opts.query_chunk_size = chunk;
    auto r = attention(q, k, v, opts);
    ASSERT_EQ(r.out.sizes(), (std::vector<int64_t>{s.b, s.sq, s.h, s.dv}));
    ASSERT_EQ(r.lse.sizes(), (std::vector<int64_t>{s.b, s.h, s.sq}));
    EXPECT_EQ(r.out.scalar_type(), at::kFloat);
    EXPECT_LE(max_rel_error(r.out, ref.out), 1e-5) << "chunk " << chunk;
    expect_lse_equal(r.lse, ref.lse, 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionShapes,
                         ::testing::Values(Shape{1, 7, 7, 2, 8, 8}, Shape{2, 13, 5, 3, 16, 16},
                                           Shape{1, 64, 130, 1, 4, 4}, Shape{2, 9, 11, 2, 8, 6},
                                           Shape{1, 1, 1, 1, 2, 2}));

TEST(Attention, DefaultScaleIsInverseSqrtHeadDimAndCustomScaleApplies) {
  at::manual_seed(2);
  auto q = at::randn({1, 5, 2, 16}), k = at::randn({1, 6, 2, 16}), v = at::randn({1, 6, 2, 16});
  auto r = attention(q, k, v);
  EXPECT_LE(max_rel_error(r.out, naive(q, k, v, 0.25).out), 1e-5);
  AttentionOptions opts;
  opts.scale = 0.7;
  auto c = attention(q, k, v, opts);
  auto ref = naive(q, k, v, 0.7);
  EXPECT_LE(max_rel_error(c.out, ref.out), 1e-5);
  expect_lse_equal(c.lse, ref.lse, 1e-4);
  EXPECT_GT(max_rel_error(r.out, c.out), 1e-3);  // the scale matters
}

TEST(Attention, AcceptsStridedViews) {
  at::manual_seed(3);
  // q/k/v as [B, S, H, D] views of one [B, S, 3*H*D] projection, and a permuted tensor.
  auto qkv = at::randn({2, 10, 3 * 2 * 8});
  auto parts = qkv.chunk(3, -1);
  auto q = parts[0].view({2, 10, 2, 8}), k = parts[1].view({2, 10, 2, 8});
  auto v = at::randn({2, 2, 10, 8}).permute({0, 2, 1, 3});
  ASSERT_FALSE(q.is_contiguous());
  ASSERT_FALSE(v.is_contiguous());
  AttentionOptions opts;
  opts.query_chunk_size = 4;
  auto r = attention(q, k, v, opts);
  EXPECT_LE(max_rel_error(r.out, naive(q, k, v, 1.0 / std::sqrt(8.0)).out), 1e-5);
}

TEST(Attention, KeyMaskAndFullyMaskedBatch) {
  at::manual_seed(4);
  const int64_t b = 3, sq = 6, sk = 9, h = 2, d = 8;
  auto q = at::randn({b, sq, h, d}), k = at::randn({b, sk, h, d}), v = at::randn({b, sk, h, d});
  auto mask = at::rand({b, sk}) > 0.4;
  mask[0][0] = true;
  mask[1].fill_(false);  // batch 1: every key masked -> zero output, -inf lse
  mask[2].fill_(true);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto ref = naive(q, k, v, scale, mask.view({b, 1, 1, sk}));
  for (int64_t chunk : {int64_t{0}, int64_t{2}, sq, sq + 1}) {
    AttentionOptions opts;
    opts.mask = mask;
    opts.query_chunk_size = chunk;
    auto r = attention(q, k, v, opts);
    EXPECT_FALSE(at::isnan(r.out).any().item<bool>());
    EXPECT_LE(max_rel_error(r.out, ref.out), 1e-5);
    expect_lse_equal(r.lse, ref.lse, 1e-4);
    EXPECT_EQ(r.out[1].abs().max().item<float>(), 0.0f);
    EXPECT_TRUE(at::all(r.lse[1] == -std::numeric_limits<float>::infinity()).item<bool>());
  }
  // A 4-D [B, 1, 1, Sk] mask is the same mask.
  AttentionOptions opts4;
  opts4.mask = mask.view({b, 1, 1, sk});
  EXPECT_LE(max_rel_error(attention(q, k, v, opts4).out, ref.out), 1e-5);
}

TEST(Attention, PairwiseMaskWithFullyMaskedRows) {
  at::manual_seed(5);
  const int64_t b = 2, sq = 7, sk = 5, h = 3, d = 4;
  auto q = at::randn({b, sq, h, d}), k = at::randn({b, sk, h, d}), v = at::randn({b, sk, h, d});
  auto mask = at::rand({b, 1, sq, sk}) > 0.5;
  mask.select(2, 2).fill_(false);  // query 2: no keys in any batch
  mask.select(2, 3).fill_(true);
  auto ref = naive(q, k, v, 0.5, mask);
  for (int64_t chunk : {int64_t{1}, int64_t{3}, sq, sq + 4}) {
    AttentionOptions opts;
    opts.mask = mask;
    opts.query_chunk_size = chunk;
    auto r = attention(q, k, v, opts);
    EXPECT_FALSE(at::isnan(r.out).any().item<bool>());
    EXPECT_FALSE(at::isnan(r.lse).any().item<bool>());
    EXPECT_LE(max_rel_error(r.out, ref.out), 1e-5) << "chunk " << chunk;
    expect_lse_equal(r.lse, ref.lse, 1e-4);
    EXPECT_EQ(r.out.select(1, 2).abs().max().item<float>(), 0.0f);
    EXPECT_TRUE(
        at::all(r.lse.select(2, 2) == -std::numeric_limits<float>::infinity()).item<bool>());
  }
}

TEST(Attention, PerHeadMask) {
  at::manual_seed(6);
  const int64_t b = 1, sq = 4, sk = 6, h = 2, d = 4;
  auto q = at::randn({b, sq, h, d}), k = at::randn({b, sk, h, d}), v = at::randn({b, sk, h, d});
  auto mask = at::rand({b, h, 1, sk}) > 0.3;
  mask[0][0][0][0] = true;
  mask[0][1][0][5] = true;
  AttentionOptions opts;
  opts.mask = mask;
  auto ref = naive(q, k, v, 0.5, mask);
  EXPECT_LE(max_rel_error(attention(q, k, v, opts).out, ref.out), 1e-5);
}

TEST(Attention, LseIsLogSumExpOfScaledScores) {
  at::manual_seed(7);
  auto q = at::randn({2, 5, 2, 8}) * 3, k = at::randn({2, 8, 2, 8}) * 3,
       v = at::randn({2, 8, 2, 8});
  AttentionOptions opts;
  opts.query_chunk_size = 2;
  auto r = attention(q, k, v, opts);
  auto scores =
      at::einsum("bqhd,bkhd->bhqk", {q.to(at::kDouble), k.to(at::kDouble)}) / std::sqrt(8.0);
  auto want = at::logsumexp(scores, -1);  // [B, H, Sq]
  EXPECT_LE((r.lse.to(at::kDouble) - want).abs().max().item<double>(), 1e-4);
  EXPECT_GT(want.abs().max().item<double>(), 1.0);  // not a trivial case
}

TEST(Attention, HalfPrecisionInputsKeepFloat32Statistics) {
  at::manual_seed(8);
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    auto q = at::randn({2, 33, 2, 16}).to(dtype);
    auto k = at::randn({2, 40, 2, 16}).to(dtype);
    auto v = at::randn({2, 40, 2, 16}).to(dtype);
    AttentionOptions opts;
    opts.query_chunk_size = 8;
    auto r = attention(q, k, v, opts);
    EXPECT_EQ(r.out.scalar_type(), dtype);
    EXPECT_EQ(r.lse.scalar_type(), at::kFloat);
    // Reference on the same (rounded) inputs. fp16 (chunked path): only the output rounding
    // differs. bf16 (blocked path): P is also rounded to bf16 for the P V product, as
    // FlashAttention does (2^-9 relative per probability, then the output's own 2^-9).
    auto ref = naive(q, k, v, 0.25);
    EXPECT_LE(max_rel_error(r.out, ref.out), dtype == at::kBFloat16 ? 1.6e-2 : 1e-3);
    expect_lse_equal(r.lse, ref.lse, 1e-4);
  }
}

TEST(Attention, MergeOfTwoKeyHalvesEqualsFullAttention) {
  at::manual_seed(9);
  const int64_t b = 2, sq = 9, sk = 14, h = 3, d = 8;
  auto q = at::randn({b, sq, h, d}), k = at::randn({b, sk, h, d}), v = at::randn({b, sk, h, d});
  auto full = attention(q, k, v);
  auto a = attention(q, k.narrow(1, 0, 5), v.narrow(1, 0, 5));
  auto c = attention(q, k.narrow(1, 5, sk - 5), v.narrow(1, 5, sk - 5));
  auto m = merge_attention(a, c);
  EXPECT_LE(max_rel_error(m.out, full.out), 1e-5);
  EXPECT_LE((m.lse - full.lse).abs().max().item<float>(), 1e-5);
  // Order does not matter.
  EXPECT_LE(max_rel_error(merge_attention(c, a).out, full.out), 1e-5);
  // bf16 partials merged into a float32 accumulator.
  auto ab = attention(q.to(at::kBFloat16), k.narrow(1, 0, 5).to(at::kBFloat16),
                      v.narrow(1, 0, 5).to(at::kBFloat16));
  auto cb = attention(q.to(at::kBFloat16), k.narrow(1, 5, sk - 5).to(at::kBFloat16),
                      v.narrow(1, 5, sk - 5).to(at::kBFloat16));
  auto mb = merge_attention(ab, cb, at::kFloat);
  EXPECT_EQ(mb.out.scalar_type(), at::kFloat);
  EXPECT_LE(max_rel_error(mb.out, full.out), 3e-2);
}

TEST(Attention, MergeWithMaskedHalves) {
  at::manual_seed(10);
  const int64_t b = 2, sq = 4, sk = 8, h = 2, d = 4;
  auto q = at::randn({b, sq, h, d}), k = at::randn({b, sk, h, d}), v = at::randn({b, sk, h, d});
  auto mask = at::ones({b, sk}, at::kBool);
  mask[0].narrow(0, 0, 4).fill_(false);  // batch 0: first half fully masked
  mask[1].fill_(false);                  // batch 1: everything masked
  AttentionOptions full_opts;
  full_opts.mask = mask;
  auto full = attention(q, k, v, full_opts);
  AttentionOptions o1, o2;
  o1.mask = mask.narrow(1, 0, 4).contiguous();
  o2.mask = mask.narrow(1, 4, 4).contiguous();
  auto a = attention(q, k.narrow(1, 0, 4), v.narrow(1, 0, 4), o1);
  auto c = attention(q, k.narrow(1, 4, 4), v.narrow(1, 4, 4), o2);
  auto m = merge_attention(a, c);
  EXPECT_FALSE(at::isnan(m.out).any().item<bool>());
  EXPECT_LE(max_rel_error(m.out, full.out), 1e-5);
  EXPECT_TRUE(at::equal(at::isfinite(m.lse), at::isfinite(full.lse)));
  EXPECT_EQ(m.out[1].abs().max().item<float>(), 0.0f);
}

TEST(Attention, EmptyKeySetGivesZeroAndMinusInf) {
  auto q = at::randn({1, 3, 2, 4});
  auto r = attention(q, at::randn({1, 0, 2, 4}), at::randn({1, 0, 2, 4}));
  EXPECT_EQ(r.out.abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(at::all(r.lse == -std::numeric_limits<float>::infinity()).item<bool>());
}

TEST(Attention, ShapeErrorsNameTheTensors) {
  auto q = at::randn({1, 3, 2, 4});
  auto expect_error = [](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning " << needle;
    } catch (const xfuser::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { attention(q, at::randn({1, 3, 2, 5}), at::randn({1, 3, 2, 5})); }, "head dim");
  expect_error(
      [&] {
        attention(q, at::randn({1, 3, 4, 4}), at::randn({1, 3, 4, 4}));
      },
      "head counts");
  expect_error([&] { attention(q, at::randn({1, 3, 2, 4}), at::randn({1, 5, 2, 4})); }, "keys");
  expect_error([&] { attention(q.view({1, 3, 8}), q, q); }, "[B, S, H, D]");
  AttentionOptions opts;
  opts.mask = at::ones({1, 4}, at::kBool);
  expect_error([&] { attention(q, q, q, opts); }, "key mask");
  opts.mask = at::ones({1, 3}, at::kFloat);
  expect_error([&] { attention(q, q, q, opts); }, "boolean");
}

// An additive bias (T5's relative position bias, CLIP's causal bias) in every broadcast form,
// alone and with a mask, and for every chunk size.
TEST(Attention, AdditiveBiasMatchesNaive) {
  at::manual_seed(11);
  const int64_t b = 2, sq = 7, sk = 9, h = 3, d = 8;
  auto q = at::randn({b, sq, h, d}), k = at::randn({b, sk, h, d}), v = at::randn({b, sk, h, d});
  for (auto bias_shape : std::vector<std::vector<int64_t>>{
           {b, h, sq, sk}, {1, h, sq, sk}, {b, 1, 1, sk}, {1, 1, sq, sk}}) {
    at::Tensor bias = at::randn(bias_shape) * 3;
    for (int64_t chunk : {0, 1, 3, 7}) {
      AttentionOptions opts;
      opts.bias = bias;
      opts.query_chunk_size = chunk;
      auto got = attention(q, k, v, opts);
      auto want = naive(q, k, v, 1.0 / std::sqrt(8.0), {}, bias);
      EXPECT_LE(max_rel_error(got.out.to(at::kDouble), want.out), 1e-5)
          << "bias " << at::IntArrayRef(bias_shape) << " chunk " << chunk;
      expect_lse_equal(got.lse, want.lse, 1e-5);
    }
  }
  // With a key mask too; the float16 inputs of the CPU keep float32 statistics.
  at::Tensor bias = at::randn({1, h, sq, sk});
  at::Tensor mask = at::rand({b, sk}) > 0.3;
  mask.select(1, 0).fill_(true);
  AttentionOptions opts;
  opts.bias = bias;
  opts.mask = mask;
  auto want = naive(q, k, v, 0.5, mask.view({b, 1, 1, sk}), bias);
  opts.scale = 0.5;
  auto got = attention(q, k, v, opts);
  EXPECT_LE(max_rel_error(got.out.to(at::kDouble), want.out), 1e-5);
  expect_lse_equal(got.lse, want.lse, 1e-5);
  auto half = attention(q.to(at::kHalf), k.to(at::kHalf), v.to(at::kHalf), opts);
  EXPECT_EQ(half.out.scalar_type(), at::kHalf);
  EXPECT_LE(max_rel_error(half.out.to(at::kDouble), want.out), 5e-3);
}

// A bias of -inf over a whole row masks it as a mask does: out 0, lse -inf.
TEST(Attention, MinusInfinityBiasRowIsEmpty) {
  at::manual_seed(12);
  auto q = at::randn({1, 4, 2, 8}), k = at::randn({1, 5, 2, 8}), v = at::randn({1, 5, 2, 8});
  at::Tensor bias = at::zeros({1, 2, 4, 5});
  bias.select(2, 1).fill_(-std::numeric_limits<double>::infinity());  // query 1, both heads
  AttentionOptions opts;
  opts.bias = bias;
  auto got = attention(q, k, v, opts);
  EXPECT_FALSE(at::isnan(got.out).any().item<bool>());
  EXPECT_EQ(got.out.select(1, 1).abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(at::isneginf(got.lse.select(2, 1)).all().item<bool>());
  auto want = naive(q, k, v, 1.0 / std::sqrt(8.0), {}, bias);
  EXPECT_LE(max_rel_error(got.out.to(at::kDouble), want.out), 1e-5);
  expect_lse_equal(got.lse, want.lse, 1e-5);
}

// The fused kernels leave a row whose keys are all masked each in their own way: flash and cuDNN
// -inf or NaN, memory-efficient a finite lse (seen on an H100 with PyTorch 2.11), which only the
// folded bias identifies. Every one becomes the contract's out 0 and lse -inf; other rows are
// untouched.
TEST(Attention, FullyMaskedRowsOfAnyFusedKernelBecomeZeroAndMinusInf) {
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t b = 1, sq = 4, h = 2, d = 3;
  AttentionOutput r;
  r.out = at::randn({b, sq, h, d});
  r.lse = at::randn({b, h, sq});
  r.lse.index_put_({0, 0, 1}, inf);                                       // +inf
  r.lse.index_put_({0, 1, 1}, -inf);                                      // flash
  r.lse.index_put_({0, 1, 2}, std::numeric_limits<double>::quiet_NaN());  // cuDNN
  const at::Tensor out0 = r.out.clone(), lse0 = r.lse.clone();
  at::Tensor from_bias = at::zeros({b, h, sq}, at::kBool);
  from_bias.index_put_({0, 0, 3}, true);  // memory-efficient: a finite lse, named by the bias
  xfuser::backends::clear_fully_masked_rows(r, from_bias);
  at::Tensor empty = from_bias.clone();
  empty.index_put_({0, 0, 1}, true);
  empty.index_put_({0, 1, 1}, true);
  empty.index_put_({0, 1, 2}, true);
  EXPECT_TRUE(at::equal(r.lse.isneginf(), empty));
  EXPECT_TRUE(
      at::equal(r.lse.masked_select(empty.logical_not()), lse0.masked_select(empty.logical_not())));
  const at::Tensor empty_out = empty.transpose(1, 2).unsqueeze(-1).expand({b, sq, h, d});
  EXPECT_EQ(r.out.masked_select(empty_out).abs().max().item<double>(), 0.0);
  EXPECT_TRUE(at::equal(r.out.masked_select(empty_out.logical_not()),
                        out0.masked_select(empty_out.logical_not())));
}

TEST(Attention, BiasErrorsNameTheBias) {
  auto q = at::randn({1, 3, 2, 4});
  AttentionOptions opts;
  opts.bias = at::zeros({1, 2, 3, 4});  // Sk 4 != 3
  try {
    attention(q, q, q, opts);
    FAIL() << "a bias of the wrong shape was accepted";
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bias [1, 2, 3, 4]"), std::string::npos) << e.what();
  }
  opts.bias = at::zeros({1, 2, 3, 3}, at::kInt);
  try {
    attention(q, q, q, opts);
    FAIL() << "an integer bias was accepted";
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("floating point"), std::string::npos) << e.what();
  }
}

}  // namespace

// Kernel selection on the CPU: the names round-trip, an unknown name is an error naming where it
// came from, the chunked kernel equals the blocked one, a CUDA kernel named for CPU tensors is an
// error naming the kernel and the tensors, and every call is counted under the kernel that ran.
TEST(AttentionKernel, NamesParseAndUnknownNamesAreErrors) {
  using xfuser::backends::attention_kernel_name;
  using xfuser::backends::AttentionKernel;
  using xfuser::backends::parse_attention_kernel;
  for (AttentionKernel k :
       {AttentionKernel::automatic, AttentionKernel::chunked, AttentionKernel::flash,
        AttentionKernel::efficient, AttentionKernel::cudnn}) {
    EXPECT_EQ(parse_attention_kernel(attention_kernel_name(k), "--x"), k);
  }
  try {
    parse_attention_kernel("flash3", "XFUSER_ATTENTION_KERNEL");
    ADD_FAILURE() << "no error";
  } catch (const xfuser::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("XFUSER_ATTENTION_KERNEL"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'flash3'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cudnn"), std::string::npos) << msg;
  }
}

TEST(AttentionKernel, CpuCallsAreCountedAndCudaKernelsRefused) {
  using xfuser::backends::attention_kernel_calls;
  using xfuser::backends::AttentionKernel;
  at::manual_seed(5);
  auto q = at::randn({1, 6, 2, 8}), k = at::randn({1, 5, 2, 8}), v = at::randn({1, 5, 2, 8});
  xfuser::backends::reset_attention_kernel_calls();
  const AttentionOutput blocked = attention(q, k, v);
  AttentionOptions chunked_opts;
  chunked_opts.kernel = AttentionKernel::chunked;
  const AttentionOutput chunked = attention(q, k, v, chunked_opts);
  EXPECT_LE(max_rel_error(chunked.out, blocked.out), 1e-5);
  expect_lse_equal(chunked.lse, blocked.lse.to(at::kDouble), 1e-5);
  AttentionOptions masked;
  masked.mask = at::ones({1, 5}, at::kBool);
  attention(q, k, v, masked);  // a mask: chunked
  const std::string cpu = xfuser::backends::cpu_attention_kernel_name();
  const std::map<std::string, int64_t> want = {{cpu, 1}, {"chunked", 2}};
  EXPECT_EQ(attention_kernel_calls(), want);

  // The process default is a preference: a CUDA kernel does not apply to CPU tensors, so the CPU
  // path runs; a default of "chunked" applies everywhere.
  const AttentionKernel saved = xfuser::backends::default_attention_kernel();
  xfuser::backends::set_default_attention_kernel(AttentionKernel::cudnn);
  EXPECT_LE(max_rel_error(attention(q, k, v).out, blocked.out), 1e-6);
  xfuser::backends::set_default_attention_kernel(AttentionKernel::chunked);
  attention(q, k, v);
  xfuser::backends::set_default_attention_kernel(saved);
  const std::map<std::string, int64_t> want2 = {{cpu, 2}, {"chunked", 3}};
  EXPECT_EQ(attention_kernel_calls(), want2);

  // A kernel named per call is a requirement.
  for (AttentionKernel k2 :
       {AttentionKernel::flash, AttentionKernel::efficient, AttentionKernel::cudnn}) {
    AttentionOptions opts;
    opts.kernel = k2;
    try {
      attention(q, k, v, opts);
      ADD_FAILURE() << "no error for " << xfuser::backends::attention_kernel_name(k2);
    } catch (const xfuser::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("kernel '") + xfuser::backends::attention_kernel_name(k2)),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("CUDA"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[1, 6, 2, 8]"), std::string::npos) << msg;
    }
  }
  xfuser::backends::reset_attention_kernel_calls();
  EXPECT_TRUE(attention_kernel_calls().empty());
}
