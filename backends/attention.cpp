#include "backends/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include "backends/error.h"
#include "backends/tensor_util.h"

namespace xfuser::backends {
namespace {

constexpr int64_t kAutoChunkScoreElements = int64_t{1} << 24;

// The mask as a boolean [B|1, H|1, Sq|1, Sk] tensor (undefined when there is none).
at::Tensor normalize_mask(const at::Tensor& mask, int64_t b, int64_t h, int64_t sq, int64_t sk) {
  if (!mask.defined()) return {};
  XF_CHECK(mask.scalar_type() == at::kBool, "attention: mask must be boolean (True = attend), got ",
           mask.scalar_type());
  at::Tensor m = mask;
  if (m.dim() == 2) {
    XF_CHECK(m.size(0) == b && m.size(1) == sk, "attention: key mask ", shape_string(m.sizes()),
             " must be [B, Sk] = [", b, ", ", sk, "]");
    return m.view({b, 1, 1, sk});
  }
  XF_CHECK(m.dim() == 4, "attention: mask ", shape_string(m.sizes()),
           " must be a key mask [B, Sk] or broadcastable to [B, H, Sq, Sk] = [", b, ", ", h, ", ",
           sq, ", ", sk, "]");
  const int64_t want[4] = {b, h, sq, sk};
  for (int i = 0; i < 4; ++i) {
    XF_CHECK(m.size(i) == want[i] || (m.size(i) == 1 && i < 3), "attention: mask ",
             shape_string(m.sizes()), " is not broadcastable to [B, H, Sq, Sk] = [", b, ", ", h,
             ", ", sq, ", ", sk, "]");
  }
  return m;
}

// The bias as a float32 [B|1, H|1, Sq|1, Sk] tensor on `device` (undefined when there is none).
at::Tensor normalize_bias(const at::Tensor& bias, int64_t b, int64_t h, int64_t sq, int64_t sk,
                          const c10::Device& device) {
  if (!bias.defined()) return {};
  XF_CHECK(at::isFloatingType(bias.scalar_type()), "attention: bias must be floating point, got ",
           bias.scalar_type());
  const int64_t want[4] = {b, h, sq, sk};
  bool ok = bias.dim() == 4;
  for (int i = 0; ok && i < 4; ++i) ok = bias.size(i) == want[i] || (bias.size(i) == 1 && i < 3);
  XF_CHECK(ok, "attention: bias ", shape_string(bias.sizes()),
           " is not broadcastable to [B, H, Sq, Sk] = [", b, ", ", h, ", ", sq, ", ", sk, "]");
  return bias.to(device, at::kFloat);
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  XF_CHECK(q.defined() && k.defined() && v.defined(), "attention: q, k and v must be defined");
  XF_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
           "attention: q, k, v must be [B, S, H, D]; got q ", shape_string(q.sizes()), ", k ",
           shape_string(k.sizes()), ", v ", shape_string(v.sizes()));
  XF_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(2) == q.size(2) &&
               v.size(2) == q.size(2),
           "attention: batch and head counts differ: q ", shape_string(q.sizes()), ", k ",
           shape_string(k.sizes()), ", v ", shape_string(v.sizes()));
  XF_CHECK(k.size(3) == q.size(3), "attention: q head dim ", q.size(3), " != k head dim ",
           k.size(3), " (q ", shape_string(q.sizes()), ", k ", shape_string(k.sizes()), ")");
  XF_CHECK(k.size(1) == v.size(1), "attention: k has ", k.size(1), " keys but v has ", v.size(1),
           " (k ", shape_string(k.sizes()), ", v ", shape_string(v.sizes()), ")");
  XF_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
           "attention: q, k, v dtypes differ: ", q.scalar_type(), ", ", k.scalar_type(), ", ",
           v.scalar_type());
  XF_CHECK(at::isFloatingType(q.scalar_type()), "attention: inputs must be floating point, got ",
           q.scalar_type());
  XF_CHECK(q.device() == k.device() && q.device() == v.device(),
           "attention: q, k, v are on different devices");
}

AttentionOutput chunked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& mask, const at::Tensor& bias, double scale,
                                  int64_t chunk) {
  const int64_t b = q.size(0), sq = q.size(1), h = q.size(2), sk = k.size(1), dv = v.size(3);
  const auto f32 = q.options().dtype(at::kFloat);
  auto out = at::empty({b, sq, h, dv}, q.options());
  auto lse = at::empty({b, h, sq}, f32);
  if (sq == 0) return {out, lse};
  if (sk == 0) {
    out.zero_();
    lse.fill_(-std::numeric_limits<float>::infinity());
    return {out, lse};
  }
  if (chunk <= 0)
    chunk = std::max<int64_t>(1, kAutoChunkScoreElements / std::max<int64_t>(1, b * h * sk));
  chunk = std::min(chunk, sq);

  auto qt = q.transpose(1, 2);                              // [B, H, Sq, D]
  auto kt = k.transpose(1, 2).to(at::kFloat).contiguous();  // [B, H, Sk, D]
  auto vt = v.transpose(1, 2).to(at::kFloat).contiguous();  // [B, H, Sk, Dv]
  auto kT = kt.transpose(-1, -2);                           // [B, H, D, Sk]
  const bool mask_per_query = mask.defined() && mask.size(2) > 1;
  const bool bias_per_query = bias.defined() && bias.size(2) > 1;
  // A row can lose every key (a mask, or -inf in the bias).
  const bool may_empty = mask.defined() || bias.defined();
  at::Tensor not_mask = mask.defined() ? mask.logical_not() : at::Tensor();
  const double neg_inf = -std::numeric_limits<double>::infinity();

  for (int64_t start = 0; start < sq; start += chunk) {
    const int64_t len = std::min(chunk, sq - start);
    auto qc = qt.narrow(2, start, len).to(at::kFloat);  // [B, H, c, D]
    auto s = at::matmul(qc, kT);                        // [B, H, c, Sk]
    s.mul_(scale);
    if (mask.defined()) {
      s.masked_fill_(mask_per_query ? not_mask.narrow(2, start, len) : not_mask, neg_inf);
    }
    if (bias.defined()) s.add_(bias_per_query ? bias.narrow(2, start, len) : bias);
    auto m = std::get<0>(s.max(-1, /*keepdim=*/true));  // [B, H, c, 1]
    if (may_empty) m.masked_fill_(m == neg_inf, 0.0);   // fully masked rows
    s.sub_(m).exp_();
    auto l = s.sum(-1, /*keepdim=*/true);  // [B, H, c, 1]
    auto o = at::matmul(s, vt);            // [B, H, c, Dv]
    if (may_empty) {
      o.div_(at::where(l == 0, at::ones_like(l), l));  // masked rows stay 0
    } else {
      o.div_(l);
    }
    out.narrow(1, start, len).copy_(o.transpose(1, 2));
    lse.narrow(2, start, len).copy_((m + l.log()).squeeze(-1));
  }
  return {out, lse};
}

// Score bytes per query block on the blocked path: the [c, Sk] float32 scores and probabilities
// of one block stay in a core's L2 cache (1-2 MiB on current server CPUs).
constexpr int64_t kBlockScoreBytes = int64_t{1} << 20;

// Unmasked attention, one (batch, head) at a time in query blocks. Per block: S = Q_c (scale K)^T
// in float32 (the scores are never rounded to a half type), P = softmax(S) by ATen's fused
// kernel, lse = max(S) - log(max(P)) (exact: max(P) = exp(0) / sum exp(S - max S) = 1 / l), and
// O = P V straight into the output rows (P in the input dtype, as FlashAttention does, so half
// types run the second product at their own speed). No [B, H, Sq, Sk] tensor and no copies of
// Q, V or O. Memory: O(c * Sk) plus one head's K in float32.
AttentionOutput blocked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  double scale, int64_t chunk) {
  const int64_t b = q.size(0), sq = q.size(1), h = q.size(2), sk = k.size(1), dv = v.size(3);
  const auto f32 = q.options().dtype(at::kFloat);
  auto out = at::empty({b, sq, h, dv}, q.options());
  auto lse = at::empty({b, h, sq}, f32);
  if (chunk <= 0) chunk = std::max<int64_t>(16, kBlockScoreBytes / (4 * sk));
  chunk = std::min(chunk, sq);
  const bool is_float = q.scalar_type() == at::kFloat;
  auto scores = at::empty({chunk, sk}, f32);
  auto probs = at::empty({chunk, sk}, f32);
  at::Tensor probs_half = is_float ? at::Tensor() : at::empty({chunk, sk}, q.options());
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t hi = 0; hi < h; ++hi) {
      auto ks = k.select(0, bi).select(1, hi).to(at::kFloat).mul(scale);  // [Sk, D] float32
      auto ksT = ks.t();                                                  // [D, Sk]
      auto vh = v.select(0, bi).select(1, hi);                            // [Sk, Dv]
      auto qh = q.select(0, bi).select(1, hi);                            // [Sq, D]
      auto oh = out.select(0, bi).select(1, hi);                          // [Sq, Dv]
      auto lh = lse.select(0, bi).select(0, hi);                          // [Sq]
      for (int64_t start = 0; start < sq; start += chunk) {
        const int64_t len = std::min(chunk, sq - start);
        auto qc = qh.narrow(0, start, len);
        if (!is_float) qc = qc.to(at::kFloat);
        auto s = scores.narrow(0, 0, len);  // [c, Sk]
        auto p = probs.narrow(0, 0, len);
        at::mm_out(s, qc, ksT);
        at::_softmax_out(p, s, -1, false);
        auto smax = at::amax(s, -1);  // [c]
        auto pmax = at::amax(p, -1);
        auto lc = lh.narrow(0, start, len);
        at::sub_out(lc, smax, pmax.log_());
        auto oc = oh.narrow(0, start, len);  // [c, Dv] rows of out
        if (is_float) {
          at::mm_out(oc, p, vh);
        } else {
          auto ph = probs_half.narrow(0, 0, len);
          ph.copy_(p);
          at::mm_out(oc, ph, vh);
        }
      }
    }
  }
  return {out, lse};
}

// The kernels that ran, counted per call (attention_kernel_calls()).
enum class Ran { blocked, chunked, flash, efficient, cudnn, cpu_flash };
constexpr const char* kRanNames[] = {"blocked",   "chunked", "flash",
                                     "efficient", "cudnn",   "cpu_flash"};
constexpr size_t kRanCount = sizeof(kRanNames) / sizeof(kRanNames[0]);
std::atomic<int64_t> g_calls[kRanCount];

AttentionOutput counted(Ran ran, AttentionOutput r) {
  g_calls[static_cast<size_t>(ran)].fetch_add(1, std::memory_order_relaxed);
  return r;
}

// The process default: -1 until read from XFUSER_ATTENTION_KERNEL (or set).
std::atomic<int> g_default_kernel{-1};

#if XFUSER_TORCH_MAJOR > 2 || (XFUSER_TORCH_MAJOR == 2 && XFUSER_TORCH_MINOR >= 1)
#define XFUSER_FUSED_ATTENTION 1
#endif
#if XFUSER_TORCH_MAJOR > 2 || (XFUSER_TORCH_MAJOR == 2 && XFUSER_TORCH_MINOR >= 6)
#define XFUSER_CUDNN_ATTENTION 1
#endif
#if XFUSER_TORCH_MAJOR > 2 || (XFUSER_TORCH_MAJOR == 2 && XFUSER_TORCH_MINOR >= 3)
#define XFUSER_CPU_FLASH_ATTENTION 1
#endif

#ifdef XFUSER_CPU_FLASH_ATTENTION
// PyTorch's fused CPU kernel, what scaled_dot_product_attention runs on CPU tensors without a
// mask (so xfuser and diffusers run the same attention on the same libtorch): Q K^T, an online
// softmax and P V per block of queries and keys, parallel over batch x heads x query blocks, with
// the log-sum-exp. It reads [B, H, S, D] views of the [B, S, H, D] inputs in place, and its
// output is laid out [B, Sq, H, Dv] under the [B, H, Sq, Dv] view, so no copy either way.
AttentionOutput cpu_flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    double scale) {
  auto heads = [](const at::Tensor& x) {  // the kernel reads rows of D contiguous elements
    return (x.stride(3) == 1 ? x : x.contiguous()).transpose(1, 2);
  };
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
      heads(q), heads(k), heads(v), 0.0, false, std::nullopt, scale);
  return {out.transpose(1, 2), lse.to(at::kFloat)};
}
#endif

#ifdef XFUSER_FUSED_ATTENTION
// [B, S, H, D] -> the [B, H, S, D] view the fused kernels read; they need only the head dim
// contiguous, so a [B, S, H, D] view of a [B, S, H*D] projection is read in place.
at::Tensor heads_first(const at::Tensor& x) {
  at::Tensor t = x.transpose(1, 2);
  return t.stride(-1) == 1 ? t : t.contiguous();
}

// The mask and the bias as one additive bias in q's dtype, broadcast to [B, H, Sq, Sk], in the
// layout the memory-efficient kernel accepts: the key dim padded to a multiple of 16 elements so
// every row starts aligned (as PyTorch's own SDPA pads it), broadcast dims of stride 0.
// Also sets *empty_rows to the [B, H, Sq] rows whose every key is masked (-inf), from the folded
// bias before it is broadcast.
at::Tensor fused_bias(const at::Tensor& mask, const at::Tensor& bias, int64_t b, int64_t h,
                      int64_t sq, int64_t sk, const at::TensorOptions& opts,
                      at::Tensor* empty_rows) {
  const int64_t bb = std::max(mask.defined() ? mask.size(0) : 1, bias.defined() ? bias.size(0) : 1);
  const int64_t bh = std::max(mask.defined() ? mask.size(1) : 1, bias.defined() ? bias.size(1) : 1);
  const int64_t bq = std::max(mask.defined() ? mask.size(2) : 1, bias.defined() ? bias.size(2) : 1);
  const int64_t padded = (sk + 15) / 16 * 16;
  at::Tensor out = at::zeros({bb, bh, bq, padded}, opts).narrow(3, 0, sk);
  if (bias.defined()) out.copy_(bias.expand({bb, bh, bq, sk}));
  if (mask.defined()) {
    out.masked_fill_(mask.logical_not().expand({bb, bh, bq, sk}),
                     -std::numeric_limits<double>::infinity());
  }
  *empty_rows = out.isneginf().all(-1).expand({b, h, sq});
  return out.expand({b, h, sq, sk});
}

// One call's inputs as the fused kernels take them.
struct FusedCall {
  at::Tensor q, k, v;                   // [B, H, S, D] views
  c10::optional<at::Tensor> attn_bias;  // mask and bias folded (fused_bias), if any
  at::Tensor empty_rows;                // [B, H, Sq]: rows the folded bias masks whole
  int64_t sq = 0, d = 0, dv = 0;
  double scale = 1.0;
  bool half = false;  // fp16 or bf16
};

// Why `kernel` cannot take the call, or nullptr when it can (no allocation: it is asked on every
// call). Mirrors the kernels' own constraints closely enough that a call they would refuse is not
// made (PyTorch still checks).
const char* why_not(AttentionKernel kernel, const FusedCall& c) {
  switch (kernel) {
    case AttentionKernel::flash:
      if (!c.half) return "needs fp16 or bf16";
      if (c.attn_bias) return "takes no mask or bias";
      if (c.d != c.dv || c.d % 8 != 0 || c.d > 256)
        return "needs equal head dims, a multiple of 8 and at most 256";
      return nullptr;
    case AttentionKernel::efficient:
      if (c.d % 8 != 0 || c.dv % 8 != 0) return "needs head dims that are multiples of 8";
      return nullptr;
    case AttentionKernel::cudnn:
#ifdef XFUSER_CUDNN_ATTENTION
      if (!c.half) return "needs fp16 or bf16";
      if (c.d % 8 != 0 || c.dv % 8 != 0) return "needs head dims that are multiples of 8";
      return nullptr;
#else
      return "needs libtorch >= 2.6";
#endif
    default:
      return "is not a fused kernel";
  }
}

bool takes(AttentionKernel kernel, const FusedCall& c) { return why_not(kernel, c) == nullptr; }

// [B, H, Sq, Dv] output and the kernel's log-sum-exp -> the contract's [B, Sq, H, Dv] and float32
// [B, H, Sq]; with a mask or bias, a query whose keys are all masked gets out 0 and lse -inf
// (clear_fully_masked_rows).
AttentionOutput finish(const at::Tensor& out_bhsd, at::Tensor lse, const FusedCall& c) {
  if (lse.dim() == 4) lse = lse.select(3, 0);                // cuDNN: [B, H, Sq, 1]
  lse = lse.narrow(2, 0, c.sq).to(at::kFloat).contiguous();  // padded to 32 in some versions
  at::Tensor out = out_bhsd.transpose(1, 2);                 // [B, Sq, H, Dv]
  AttentionOutput result{out, lse};
  if (c.attn_bias) clear_fully_masked_rows(result, c.empty_rows);
  return result;
}

AttentionOutput run_fused(AttentionKernel kernel, const FusedCall& c) {
  switch (kernel) {
    case AttentionKernel::flash: {
      auto r = at::_scaled_dot_product_flash_attention(c.q, c.k, c.v, 0.0, false, false, c.scale);
      return counted(Ran::flash, finish(std::get<0>(r), std::get<1>(r), c));
    }
    case AttentionKernel::efficient: {
      auto r = at::_scaled_dot_product_efficient_attention(c.q, c.k, c.v, c.attn_bias, true, 0.0,
                                                           false, c.scale);
      return counted(Ran::efficient, finish(std::get<0>(r), std::get<1>(r), c));
    }
#ifdef XFUSER_CUDNN_ATTENTION
    case AttentionKernel::cudnn: {
      auto r = at::_scaled_dot_product_cudnn_attention(c.q, c.k, c.v, c.attn_bias,
                                                       /*compute_log_sumexp=*/true, 0.0, false,
                                                       false, c.scale);
      return counted(Ran::cudnn, finish(std::get<0>(r), std::get<1>(r), c));
    }
#endif
    default:
      XF_THROW("attention: '", attention_kernel_name(kernel), "' is not a fused kernel");
  }
}

// cuDNN calls that failed, without and with an additive bias: that kind of call is not sent to
// cuDNN again in this process (reported once).
std::atomic<bool> g_cudnn_failed[2];

// PyTorch's own choice for these inputs: flash, efficient or cudnn; chunked where PyTorch would
// run its math path (or a backend xfuser does not call); automatic where it cannot say (every
// SDP backend disabled).
AttentionKernel pytorch_choice(const FusedCall& c) {
  int64_t choice = -1;
  try {
    choice = at::_fused_sdp_choice(c.q, c.k, c.v, c.attn_bias, 0.0, false, c.scale);
  } catch (const c10::Error&) {
    return AttentionKernel::automatic;  // every SDP backend disabled: no opinion
  }
  switch (choice) {
    case 1:
      return AttentionKernel::flash;
    case 2:
      return AttentionKernel::efficient;
    case 3:
      return AttentionKernel::cudnn;
    default:
      return AttentionKernel::chunked;  // math (0), or a backend xfuser does not call
  }
}

// The fused path for a CUDA call. `wanted` is a kernel the caller named (strict), the process
// default (a preference: `strict` false), or automatic.
AttentionOutput fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& mask, const at::Tensor& bias, double scale,
                                AttentionKernel wanted, bool strict, int64_t chunk) {
  const int64_t b = q.size(0), sq = q.size(1), h = q.size(2), sk = k.size(1);
  FusedCall c;
  c.q = heads_first(q);
  c.k = heads_first(k);
  c.v = heads_first(v);
  if (mask.defined() || bias.defined())
    c.attn_bias = fused_bias(mask, bias, b, h, sq, sk, q.options(), &c.empty_rows);
  c.sq = sq;
  c.d = q.size(3);
  c.dv = v.size(3);
  c.scale = scale;
  c.half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  if (strict) {
    const char* why = why_not(wanted, c);
    XF_CHECK(why == nullptr, "attention: kernel '", attention_kernel_name(wanted), "' ", why,
             " (q ", shape_string(q.sizes()), " ", q.scalar_type(), ", k ", shape_string(k.sizes()),
             ", v ", shape_string(v.sizes()), mask.defined() ? ", a mask" : "",
             bias.defined() ? ", a bias" : "", ")");
    try {
      return run_fused(wanted, c);
    } catch (const c10::Error& e) {
      XF_THROW("attention: kernel '", attention_kernel_name(wanted), "' failed on q ",
               shape_string(q.sizes()), " ", q.scalar_type(), ": ", e.what_without_backtrace());
    }
  }
  AttentionKernel kernel = wanted;
  if (kernel == AttentionKernel::automatic || !takes(kernel, c)) {
    kernel = pytorch_choice(c);
  }
  if (kernel == AttentionKernel::cudnn) {
    std::atomic<bool>& failed = g_cudnn_failed[c.attn_bias ? 1 : 0];
    if (takes(kernel, c) && !failed.load(std::memory_order_relaxed)) {
      try {
        return run_fused(kernel, c);
      } catch (const c10::Error& e) {
        if (!failed.exchange(true)) {
          spdlog::warn(
              "attention: cuDNN failed on q {} {}{}; calls like it use flash / memory-efficient "
              "from now on: {}",
              shape_string(q.sizes()), c10::toString(q.scalar_type()),
              c.attn_bias ? " with a mask or bias" : "", e.what_without_backtrace());
        }
      }
    }
    kernel = AttentionKernel::automatic;
  }
  if (kernel == AttentionKernel::automatic) {  // PyTorch had no usable answer: xfuser's order
    kernel = takes(AttentionKernel::flash, c)       ? AttentionKernel::flash
             : takes(AttentionKernel::efficient, c) ? AttentionKernel::efficient
                                                    : AttentionKernel::chunked;
  }
  if (kernel == AttentionKernel::chunked || !takes(kernel, c)) {
    return counted(Ran::chunked, chunked_attention(q, k, v, mask, bias, scale, chunk));
  }
  return run_fused(kernel, c);
}
#endif

}  // namespace

const char* attention_kernel_name(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::automatic:
      return "auto";
    case AttentionKernel::chunked:
      return "chunked";
    case AttentionKernel::flash:
      return "flash";
    case AttentionKernel::efficient:
      return "efficient";
    case AttentionKernel::cudnn:
      return "cudnn";
  }
  return "?";
}

AttentionKernel parse_attention_kernel(const std::string& name, const std::string& what) {
  for (AttentionKernel k :
       {AttentionKernel::automatic, AttentionKernel::chunked, AttentionKernel::flash,
        AttentionKernel::efficient, AttentionKernel::cudnn}) {
    if (name == attention_kernel_name(k)) return k;
  }
  XF_THROW(what, ": unknown attention kernel '", name,
           "' (expected auto, chunked, flash, efficient or cudnn)");
}

void check_attention_kernel_runs(AttentionKernel kernel, const c10::Device& device,
                                 const std::string& what) {
  if (kernel == AttentionKernel::automatic || kernel == AttentionKernel::chunked) return;
  const char* name = attention_kernel_name(kernel);
  XF_CHECK(device.is_cuda(), what, " ", name,
           " is a CUDA kernel: it needs --device cuda (this run is on ", device.str(),
           "; auto or chunked run anywhere)");
#ifndef XFUSER_FUSED_ATTENTION
  XF_THROW(what, " ", name, " needs libtorch >= 2.1 (this one is ", XFUSER_TORCH_MAJOR, ".",
           XFUSER_TORCH_MINOR, ")");
#elif !defined(XFUSER_CUDNN_ATTENTION)
  XF_CHECK(kernel != AttentionKernel::cudnn, what, " cudnn needs libtorch >= 2.6 (this one is ",
           XFUSER_TORCH_MAJOR, ".", XFUSER_TORCH_MINOR, ")");
#endif
}

AttentionKernel resolve_attention_kernel(const std::string& flag, const c10::Device& device) {
  const AttentionKernel kernel = flag.empty() ? default_attention_kernel()
                                              : parse_attention_kernel(flag, "--attention_backend");
  check_attention_kernel_runs(kernel, device,
                              flag.empty() ? "XFUSER_ATTENTION_KERNEL" : "--attention_backend");
  return kernel;
}

AttentionKernel default_attention_kernel() {
  int k = g_default_kernel.load(std::memory_order_acquire);
  if (k < 0) {
    const char* env = std::getenv("XFUSER_ATTENTION_KERNEL");
    const AttentionKernel parsed = env && *env
                                       ? parse_attention_kernel(env, "XFUSER_ATTENTION_KERNEL")
                                       : AttentionKernel::automatic;
    int expected = -1;
    g_default_kernel.compare_exchange_strong(expected, static_cast<int>(parsed));
    k = g_default_kernel.load(std::memory_order_acquire);
  }
  return static_cast<AttentionKernel>(k);
}

void set_default_attention_kernel(AttentionKernel kernel) {
  g_default_kernel.store(static_cast<int>(kernel), std::memory_order_release);
}

std::map<std::string, int64_t> attention_kernel_calls() {
  std::map<std::string, int64_t> calls;
  for (size_t i = 0; i < kRanCount; ++i) {
    const int64_t n = g_calls[i].load(std::memory_order_relaxed);
    if (n > 0) calls[kRanNames[i]] = n;
  }
  return calls;
}

const char* cpu_attention_kernel_name() {
#ifdef XFUSER_CPU_FLASH_ATTENTION
  return kRanNames[static_cast<size_t>(Ran::cpu_flash)];
#else
  return kRanNames[static_cast<size_t>(Ran::blocked)];
#endif
}

void reset_attention_kernel_calls() {
  for (auto& n : g_calls) n.store(0, std::memory_order_relaxed);
}

void clear_fully_masked_rows(AttentionOutput& result, const at::Tensor& empty_rows) {
  at::Tensor empty = at::isfinite(result.lse).logical_not_();  // [B, H, Sq]
  if (empty_rows.defined()) empty = empty.logical_or_(empty_rows);
  result.lse = result.lse.masked_fill(empty, -std::numeric_limits<double>::infinity());
  result.out = result.out.masked_fill(empty.transpose(1, 2).unsqueeze(-1), 0.0);
}

AttentionOutput attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionOptions& opts) {
  check_inputs(q, k, v);
  const int64_t b = q.size(0), sq = q.size(1), h = q.size(2), d = q.size(3), sk = k.size(1);
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  at::Tensor mask = normalize_mask(opts.mask, b, h, sq, sk);
  if (mask.defined()) mask = mask.to(q.device());
  at::Tensor bias = normalize_bias(opts.bias, b, h, sq, sk, q.device());
  const bool strict = opts.kernel.has_value();
  const AttentionKernel kernel = strict ? *opts.kernel : default_attention_kernel();
  if (kernel == AttentionKernel::chunked) {
    return counted(Ran::chunked,
                   chunked_attention(q, k, v, mask, bias, scale, opts.query_chunk_size));
  }
  if (q.is_cuda() && b > 0 && sq > 0 && sk > 0) {
#ifdef XFUSER_FUSED_ATTENTION
    return fused_attention(q, k, v, mask, bias, scale, kernel, strict, opts.query_chunk_size);
#else
    XF_CHECK(!strict || kernel == AttentionKernel::automatic, "attention: kernel '",
             attention_kernel_name(kernel), "' needs libtorch >= 2.1 (this one is ",
             XFUSER_TORCH_MAJOR, ".", XFUSER_TORCH_MINOR, ")");
#endif
  } else {
    XF_CHECK(!strict || kernel == AttentionKernel::automatic, "attention: kernel '",
             attention_kernel_name(kernel),
             "' runs on CUDA tensors with at least one query and key", " (q ",
             shape_string(q.sizes()), " on ", q.device().str(), ", k ", shape_string(k.sizes()),
             ")");
  }
  if (!mask.defined() && !bias.defined() && q.device().is_cpu() && sq > 0 && sk > 0 &&
      q.scalar_type() != at::kHalf) {
#ifdef XFUSER_CPU_FLASH_ATTENTION
    if (q.size(3) == v.size(3)) return counted(Ran::cpu_flash, cpu_flash_attention(q, k, v, scale));
#endif
    return counted(Ran::blocked, blocked_attention(q, k, v, scale, opts.query_chunk_size));
  }
  return counted(Ran::chunked,
                 chunked_attention(q, k, v, mask, bias, scale, opts.query_chunk_size));
}

AttentionOutput merge_attention(const AttentionOutput& a, const AttentionOutput& b,
                                std::optional<c10::ScalarType> out_dtype) {
  XF_CHECK(a.out.defined() && b.out.defined() && a.lse.defined() && b.lse.defined(),
           "merge_attention: both partial results must be defined");
  XF_CHECK(a.out.sizes() == b.out.sizes(),
           "merge_attention: outputs differ in shape: ", shape_string(a.out.sizes()), " vs ",
           shape_string(b.out.sizes()));
  XF_CHECK(a.out.dim() == 4 && a.lse.dim() == 3 && a.lse.sizes() == b.lse.sizes() &&
               a.lse.size(0) == a.out.size(0) && a.lse.size(1) == a.out.size(2) &&
               a.lse.size(2) == a.out.size(1),
           "merge_attention: expected out [B, Sq, H, Dv] and lse [B, H, Sq]; got out ",
           shape_string(a.out.sizes()), ", lse ", shape_string(a.lse.sizes()), " and ",
           shape_string(b.lse.sizes()));
  const double neg_inf = -std::numeric_limits<double>::infinity();
  auto la = a.lse.to(at::kFloat), lb = b.lse.to(at::kFloat);  // [B, H, Sq]
  auto m = at::maximum(la, lb);
  m.masked_fill_(m == neg_inf, 0.0);
  auto wa = (la - m).exp(), wb = (lb - m).exp();
  auto sum = wa + wb;
  auto lse = m + sum.log();  // -inf when both sides are empty
  auto safe = at::where(sum == 0, at::ones_like(sum), sum);
  wa = (wa / safe).transpose(1, 2).unsqueeze(-1);  // [B, Sq, H, 1]
  wb = (wb / safe).transpose(1, 2).unsqueeze(-1);
  auto out = a.out.to(at::kFloat) * wa + b.out.to(at::kFloat) * wb;  // [B, Sq, H, Dv]
  return {out.to(out_dtype.value_or(a.out.scalar_type())), lse};
}

}  // namespace xfuser::backends
