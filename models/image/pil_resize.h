// Pillow's Image.resize and transformers' center_crop for uint8 HWC images, byte for byte.
//
// pil_resize(image, width, height, filter) equals PIL.Image.fromarray(image).resize((width,
// height), filter) (Pillow 13, src/libImaging/Resample.c) for uint8 [H, W, C] with C = 1 ("L"),
// 3 ("RGB") or 4 ("RGBA"):
//   - per dimension, precompute_coeffs: scale = in / out, filterscale = max(scale, 1), support =
//     filter support * filterscale, window [(int)(center - support + 0.5), (int)(center + support
//     + 0.5)) clamped to the image, weights filter((x - center + 0.5) / filterscale) normalised to
//     sum 1, then to 22-bit fixed point (round half away from zero);
//   - the horizontal pass (only over the source rows the vertical pass reads), then the vertical
//     pass, each accumulating in integers from 1 << 21 and clipping (>> 22) to [0, 255]; a pass
//     whose dimension is unchanged is skipped, and the same size returns a copy. Pillow 13 runs
//     the vertical pass first when the height shrinks by more than twice as many pixels as the
//     width (H - height > 2 * (W - width), python-pillow/Pillow#9549; found to decide the order
//     in every one of ~850 probed size pairs; Pillow < 13 always runs horizontal first), which
//     changes the rounding of the uint8 intermediate;
//   - RGBA is premultiplied by alpha first and un-premultiplied after (Image.resize converts to
//     "RGBa" and back for every filter but NEAREST);
//   - NEAREST is Pillow's affine nearest-neighbour scale (ImagingScaleAffine): source index
//     (int)(x * in / out + in / (2 out)), accumulated in double as Pillow does.
// The arithmetic runs on the CPU; the result comes back on the input's device.
//
// center_crop(image, crop_height, crop_width) equals transformers (v4.44.2)
// image_transforms.center_crop on a channels-last array: top = (H - crop_h) // 2, left =
// (W - crop_w) // 2; a crop larger than the image pads it with zeros, centred (the larger half
// of the padding before the image). Any dtype; [H, W, C] in, [crop_h, crop_w, C] out.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace xfuser::models::image {

// PIL.Image.Resampling values (NEAREST 0, LANCZOS 1, BILINEAR 2, BICUBIC 3, BOX 4, HAMMING 5).
enum class PilFilter {
  kNearest = 0,
  kLanczos = 1,
  kBilinear = 2,
  kBicubic = 3,
  kBox = 4,
  kHamming = 5,
};

// A PIL resample number as a PilFilter; `where` names its source (file and key) in the error.
PilFilter pil_filter_from_int(int64_t value, const std::string& where);
const char* pil_filter_name(PilFilter filter);

// image: uint8 [H, W, C], C in {1, 3, 4}; width, height >= 1. Returns uint8 [height, width, C].
at::Tensor pil_resize(const at::Tensor& image, int64_t width, int64_t height, PilFilter filter);

// image: [H, W, C] (any dtype); crop sizes >= 1. Returns [crop_height, crop_width, C].
at::Tensor center_crop(const at::Tensor& image, int64_t crop_height, int64_t crop_width);

}  // namespace xfuser::models::image
