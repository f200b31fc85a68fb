// Tiling helpers shared by the video VAEs (HunyuanVideo, HunyuanVideo-1.5): diffusers' blend of
// overlapping tiles and Python-style clipped slicing.
#pragma once

#include <algorithm>
#include <cstdint>

#include <ATen/ATen.h>

namespace xfuser::models::vae {

// diffusers' blend_v / blend_h / blend_t along `dim`: the first `extent` slices of b become a's
// last ones * (1 - y / extent) + b's * (y / extent), in place, one slice at a time with
// Python-float weights (the same arithmetic in every dtype).
inline void blend(const at::Tensor& a, at::Tensor& b, int64_t dim, int64_t extent) {
  extent = std::min({a.size(dim), b.size(dim), extent});
  for (int64_t y = 0; y < extent; ++y) {
    const double wb = static_cast<double>(y) / static_cast<double>(extent);
    at::Tensor by = b.select(dim, y);
    by.copy_(a.select(dim, a.size(dim) - extent + y) * (1.0 - wb) + by * wb);
  }
}

// x[..., start : start + len] along `dim`, clipped as Python slicing clips.
inline at::Tensor slice(const at::Tensor& x, int64_t dim, int64_t start, int64_t len) {
  const int64_t n = x.size(dim);
  start = std::min(start, n);
  return x.narrow(dim, start, std::min(len, n - start));
}

}  // namespace xfuser::models::vae
