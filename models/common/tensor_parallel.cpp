#include "models/common/tensor_parallel.h"

#include <numeric>

#include <ATen/ATen.h>

#include "backends/error.h"
#include "models/common/kernels.h"

namespace xfuser::models {
namespace {

void mark_linear(ParamSlot* weight, ParamSlot* bias) {
  weight->layer = LayerKind::kLinear;
  if (bias) bias->layer = LayerKind::kLinear;
}

int64_t sum_of(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), 0L); }

void check_tp(const TensorParallel& tp) {
  XF_CHECK(tp.size >= 1 && tp.rank >= 0 && tp.rank < tp.size, "tensor-parallel rank ", tp.rank,
           " of ", tp.size, " is out of range");
}

}  // namespace

// ---- ColumnParallelLinear -----------------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(int64_t in_features, int64_t out_features,
                                           const TensorParallel& tp, bool bias,
                                           std::vector<int64_t> segments)
    : in_(in_features), parts_(tp.size) {
  check_tp(tp);
  if (segments.empty()) segments = {out_features};
  XF_CHECK(sum_of(segments) == out_features, "ColumnParallelLinear: segments sum to ",
           sum_of(segments), ", out_features is ", out_features);
  segments_ = static_cast<int>(segments.size());
  weight_ = &sharded_param("weight", {out_features, in_features}, tp.shard(0, segments));
  if (bias) bias_ = &sharded_param("bias", {out_features}, tp.shard(0, segments));
  mark_linear(weight_, bias_);
  local_out_ = weight_->shape[0];
}

at::Tensor ColumnParallelLinear::forward(const at::Tensor& x) const {
  XF_CHECK(weight_->loaded(), "ColumnParallelLinear [", local_out_, ", ", in_,
           "] used before loading");
  XF_CHECK(x.dim() >= 1 && x.size(-1) == in_, "ColumnParallelLinear expects [..., ", in_, "], got ",
           shape_string(x.sizes()));
  return linear(x, *weight_, bias_);
}

at::Tensor ColumnParallelLinear::forward_gathered(const at::Tensor& x,
                                                  const TensorParallelOps& ops) const {
  at::Tensor y = forward(x);  // [..., out/n]
  if (parts_ == 1) return y;
  XF_CHECK(segments_ == 1, "ColumnParallelLinear::forward_gathered needs a single segment");
  XF_CHECK(static_cast<bool>(ops.all_gather_last), "a tensor-parallel model (degree ", parts_,
           ") runs without its all-gather hook: set the tensor-parallel ops before forward");
  return ops.all_gather_last(y.contiguous());  // [..., out]
}

// ---- RowParallelLinear --------------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(int64_t in_features, int64_t out_features,
                                     const TensorParallel& tp, bool bias,
                                     std::vector<int64_t> segments)
    : out_(out_features), parts_(tp.size) {
  check_tp(tp);
  if (segments.empty()) segments = {in_features};
  XF_CHECK(sum_of(segments) == in_features, "RowParallelLinear: segments sum to ", sum_of(segments),
           ", in_features is ", in_features);
  weight_ = &sharded_param("weight", {out_features, in_features}, tp.shard(1, segments));
  if (bias) bias_ = &param("bias", {out_features});  // replicated, added once
  mark_linear(weight_, bias_);
  local_in_ = weight_->shape[1];
}

at::Tensor RowParallelLinear::forward(const at::Tensor& x, const TensorParallelOps& ops) const {
  XF_CHECK(weight_->loaded(), "RowParallelLinear [", out_, ", ", local_in_,
           "] used before loading");
  XF_CHECK(x.dim() >= 1 && x.size(-1) == local_in_, "RowParallelLinear expects [..., ", local_in_,
           "] (this rank's input features), got ", shape_string(x.sizes()));
  if (parts_ == 1) return linear(x, *weight_, bias_);
  XF_CHECK(static_cast<bool>(ops.all_reduce), "a tensor-parallel model (degree ", parts_,
           ") runs without its all-reduce hook: set the tensor-parallel ops before forward");
  at::Tensor y = linear(x, *weight_, nullptr).contiguous();  // [..., out] partial
  ops.all_reduce(y);
  return bias_ ? y + bias_->value() : y;
}

// ---- ParallelFeedForward ------------------------------------------------------------------------

namespace {
bool gated(FeedForwardKind kind) {
  return kind == FeedForwardKind::kGeglu || kind == FeedForwardKind::kGegluApproximate ||
         kind == FeedForwardKind::kSwiglu;
}
}  // namespace

ParallelFeedForward::ParallelFeedForward(int64_t dim, int64_t dim_out, double mult,
                                         FeedForwardKind kind, const TensorParallel& tp, bool bias)
    : kind_(kind) {
  const auto inner = static_cast<int64_t>(dim * mult);
  // Gated kinds: net.0.proj's output is [hidden | gate]; each half is split on its own so a
  // rank's part is [hidden_r | gate_r] and chunk(2) still pairs them.
  std::vector<int64_t> segments =
      gated(kind) ? std::vector<int64_t>{inner, inner} : std::vector<int64_t>{inner};
  proj_ = child("net.0.proj",
                std::make_shared<ColumnParallelLinear>(dim, sum_of(segments), tp, bias, segments));
  out_ = child("net.2", std::make_shared<RowParallelLinear>(inner, dim_out, tp, bias));
}

at::Tensor ParallelFeedForward::forward(const at::Tensor& x, const TensorParallelOps& ops) const {
  // [..., inner/n] (or 2*inner/n gated): a gated kind's hidden and gate halves are split alike,
  // so the rank's halves pair up.
  return out_->forward(feed_forward_activation(proj_->forward(x), kind_), ops);
}

// ---- AdaLN modulation ---------------------------------------------------------------------------

ParallelAdaLayerNormZero::ParallelAdaLayerNormZero(int64_t dim, const TensorParallel& tp,
                                                   double eps)
    : eps_(eps) {
  linear_ = child("linear", std::make_shared<ColumnParallelLinear>(dim, 6 * dim, tp));
}

AdaLayerNormZero::Output ParallelAdaLayerNormZero::forward(const at::Tensor& x,
                                                           const at::Tensor& temb,
                                                           const TensorParallelOps& ops) const {
  const int64_t dim = linear_->in_features();
  XF_CHECK(x.dim() == 3 && x.size(2) == dim, "AdaLayerNormZero: x must be [B, S, ", dim, "], got ",
           shape_string(x.sizes()));
  auto emb = linear_->forward_gathered(activate(temb, Activation::kSilu), ops);  // [B, 6D]
  auto c = emb.chunk(6, 1);
  AdaLayerNormZero::Output o;
  o.x = kernels().norm_modulate(x, c[0], c[1], eps_);
  o.gate_msa = c[2];
  o.shift_mlp = c[3];
  o.scale_mlp = c[4];
  o.gate_mlp = c[5];
  return o;
}

ParallelAdaLayerNormZeroSingle::ParallelAdaLayerNormZeroSingle(int64_t dim,
                                                               const TensorParallel& tp, double eps)
    : eps_(eps) {
  linear_ = child("linear", std::make_shared<ColumnParallelLinear>(dim, 3 * dim, tp));
}

AdaLayerNormZeroSingle::Output ParallelAdaLayerNormZeroSingle::forward(
    const at::Tensor& x, const at::Tensor& temb, const TensorParallelOps& ops) const {
  const int64_t dim = linear_->in_features();
  XF_CHECK(x.dim() == 3 && x.size(2) == dim, "AdaLayerNormZeroSingle: x must be [B, S, ", dim,
           "], got ", shape_string(x.sizes()));
  auto emb = linear_->forward_gathered(activate(temb, Activation::kSilu), ops);  // [B, 3D]
  auto c = emb.chunk(3, 1);
  return {kernels().norm_modulate(x, c[0], c[1], eps_), c[2]};
}

}  // namespace xfuser::models
