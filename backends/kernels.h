// Ops a backend may replace with a hand-written kernel (Backend::register_override), with their
// reference (eager) definitions. The eager versions are diffusers' op sequences; an override must
// compute the same math (the tests hold every override to the eager result).
#pragma once

#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace xfuser::backends {

// "norm_modulate": LayerNorm without affine, then AdaLN modulation:
//   LN(x, eps) * (1 + scale) + shift
// x [B, S, D]; shift, scale [B, D] or [1, D]. Output in x's dtype.
using NormModulateFn = at::Tensor(const at::Tensor& x, const at::Tensor& shift,
                                  const at::Tensor& scale, double eps);
// Eager: LN in float32 rounded to x's dtype, then the product and the sum in x's dtype.
at::Tensor norm_modulate_eager(const at::Tensor& x, const at::Tensor& shift,
                               const at::Tensor& scale, double eps);
// Fused (CPU): one LayerNorm kernel per batch row with weight 1 + scale and bias shift, all in
// float32, rounded once to x's dtype.
at::Tensor norm_modulate_fused(const at::Tensor& x, const at::Tensor& shift,
                               const at::Tensor& scale, double eps);

// "rope_qk": rotary embedding on q and k together, interleaved pairs (2i, 2i+1):
//   out[2i] = x[2i] cos - x[2i+1] sin,  out[2i+1] = x[2i+1] cos + x[2i] sin
// q, k [B, S, H, D]; cos, sin [S, D] float32 with cos[2i] == cos[2i+1] (the interleaved tables
// diffusers builds). Returns (q', k') in the inputs' dtypes, computed in float32.
using RopeQkFn = std::pair<at::Tensor, at::Tensor>(const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& cos, const at::Tensor& sin);
// Fused (CPU): one complex multiplication per tensor, x viewed as D/2 complex numbers times
// (cos + i sin), sharing the complex table between q and k.
std::pair<at::Tensor, at::Tensor> rope_qk_fused(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& cos, const at::Tensor& sin);

// A 3-D convolution (groups 1, no dilation, zero padding `padding` per side), as at::conv3d
// computes it. Float32 CPU tensors go through oneDNN (at::mkldnn_convolution) whenever libtorch
// has it: ATen sends inputs of batch 1 with few channels and rows (C x T x H <= 20480) to its
// im2col kernel, slow_conv3d, which is ~10x slower for the 3x3x3 convolutions of the video VAEs
// (measured: [1, 8, 6, 256, 256] 429 ms against 44 ms, one thread). The same sums in another
// order: float32 rounding apart, the same result. Other dtypes and devices: at::conv3d.
at::Tensor conv3d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  const std::vector<int64_t>& stride, const std::vector<int64_t>& padding);

}  // namespace xfuser::backends
