// Ops a backend may replace with a hand-written kernel (Backend::register_override), with their
// reference (eager) definitions. The eager versions are diffusers' op sequences; an override must
// compute the same math (the tests hold every override to the eager result).
#pragma once

#include <utility>

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

}  // namespace xfuser::backends
