#include "backends/kernels.h"

#include <ATen/ATen.h>

#include "backends/error.h"
#include "backends/tensor_util.h"

namespace xfuser::backends {
namespace {

void check_modulation(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  XF_CHECK(x.dim() == 3, "norm_modulate: x must be [B, S, D], got ", shape_string(x.sizes()));
  const int64_t b = x.size(0), d = x.size(2);
  for (const auto* t : {&shift, &scale}) {
    XF_CHECK(t->dim() == 2 && t->size(1) == d && (t->size(0) == b || t->size(0) == 1),
             "norm_modulate: shift and scale must be [B, D] or [1, D] with B = ", b, ", D = ", d,
             "; got ", shape_string(t->sizes()));
  }
}

}  // namespace

at::Tensor norm_modulate_eager(const at::Tensor& x, const at::Tensor& shift,
                               const at::Tensor& scale, double eps) {
  check_modulation(x, shift, scale);
  auto n = at::layer_norm(x.to(at::kFloat), {x.size(-1)}, {}, {}, eps).to(x.scalar_type());
  return n * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

at::Tensor norm_modulate_fused(const at::Tensor& x, const at::Tensor& shift,
                               const at::Tensor& scale, double eps) {
  check_modulation(x, shift, scale);
  const int64_t b = x.size(0), d = x.size(2);
  auto xf = x.to(at::kFloat);
  auto weight = scale.to(at::kFloat) + 1.0;  // [B|1, D]
  auto bias = shift.to(at::kFloat);
  if (weight.size(0) == 1 && bias.size(0) == 1) {
    return at::layer_norm(xf, {d}, weight[0], bias[0], eps).to(x.scalar_type());
  }
  auto out = at::empty(x.sizes(), x.options());
  for (int64_t i = 0; i < b; ++i) {
    const int64_t wi = weight.size(0) == 1 ? 0 : i, bi = bias.size(0) == 1 ? 0 : i;
    out[i].copy_(at::layer_norm(xf[i], {d}, weight[wi], bias[bi], eps));
  }
  return out;
}

std::pair<at::Tensor, at::Tensor> rope_qk_fused(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& cos, const at::Tensor& sin) {
  XF_CHECK(q.dim() == 4 && k.dim() == 4 && q.size(1) == k.size(1) && q.size(3) == k.size(3),
           "rope_qk: q and k must be [B, S, H, D] with equal S and D; got q ",
           shape_string(q.sizes()), ", k ", shape_string(k.sizes()));
  const int64_t s = q.size(1), d = q.size(3);
  XF_CHECK(d % 2 == 0, "rope_qk: head dim must be even, got ", d);
  XF_CHECK(cos.dim() == 2 && cos.size(0) == s && cos.size(1) == d && sin.sizes() == cos.sizes(),
           "rope_qk: tables must be [S, D] = [", s, ", ", d, "]; got cos ",
           shape_string(cos.sizes()), ", sin ", shape_string(sin.sizes()));
  // (cos + i sin) per pair: the interleaved tables repeat each value twice.
  auto table = at::view_as_complex(
      at::stack({cos.to(at::kFloat).slice(1, 0, d, 2), sin.to(at::kFloat).slice(1, 0, d, 2)}, -1)
          .contiguous());                   // [S, D/2] complex64
  table = table.view({1, s, 1, d / 2});     // broadcast over batch and heads
  auto rotate = [&](const at::Tensor& x) {  // [B, S, H, D]
    auto xf = x.to(at::kFloat).contiguous();
    auto xc = at::view_as_complex(xf.view({x.size(0), s, x.size(2), d / 2, 2}));
    return at::view_as_real(xc * table).view(x.sizes()).to(x.scalar_type());
  };
  return {rotate(q), rotate(k)};
}

at::Tensor conv3d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  const std::vector<int64_t>& stride, const std::vector<int64_t>& padding) {
  XF_CHECK(x.dim() == 5 && weight.dim() == 5 && x.size(1) == weight.size(1) && stride.size() == 3 &&
               padding.size() == 3,
           "conv3d: expected x [B, C, T, H, W], weight [O, C, kT, kH, kW] and 3 strides and "
           "paddings; got x ",
           shape_string(x.sizes()), ", weight ", shape_string(weight.sizes()));
  const bool onednn = x.device().is_cpu() && x.scalar_type() == at::kFloat &&
                      weight.scalar_type() == at::kFloat && at::hasMKLDNN() &&
                      at::globalContext().userEnabledMkldnn() && x.size(0) > 0;
  if (!onednn) return at::conv3d(x, weight, bias, stride, padding);
  const std::vector<int64_t> dilation = {1, 1, 1};
  return at::mkldnn_convolution(x.contiguous(), weight.contiguous(),
                                bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt,
                                padding, stride, dilation, 1);
}

}  // namespace xfuser::backends
