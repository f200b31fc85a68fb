#include "models/image/pil_resize.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/ATen.h>

#include "backends/error.h"

namespace xfuser::models::image {
namespace {

// ---- Pillow's filters (Resample.c), expression for expression ---------------------------------

double box_filter(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }

double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  if (x < 1.0) return 1.0 - x;
  return 0.0;
}

double hamming_filter(double x) {
  if (x < 0.0) x = -x;
  if (x == 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  x = x * M_PI;
  return std::sin(x) / x * (0.54f + 0.46f * std::cos(x));
}

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

double sinc_filter(double x) {
  if (x == 0.0) return 1.0;
  x = x * M_PI;
  return std::sin(x) / x;
}

double lanczos_filter(double x) {
  if (-3.0 <= x && x < 3.0) return sinc_filter(x) * sinc_filter(x / 3);
  return 0.0;
}

struct Filter {
  double (*fn)(double);
  double support;
};

Filter filter_of(PilFilter f) {
  switch (f) {
    case PilFilter::kBox:
      return {box_filter, 0.5};
    case PilFilter::kBilinear:
      return {bilinear_filter, 1.0};
    case PilFilter::kHamming:
      return {hamming_filter, 1.0};
    case PilFilter::kBicubic:
      return {bicubic_filter, 2.0};
    case PilFilter::kLanczos:
      return {lanczos_filter, 3.0};
    case PilFilter::kNearest:
      break;
  }
  XF_THROW("pil_resize: no convolution filter for NEAREST");
}

constexpr int kPrecisionBits = 32 - 8 - 2;

// One output position's window [xmin, xmin + count) and its fixed-point weights.
struct Coeffs {
  int64_t ksize = 0;
  std::vector<int> xmin, count;
  std::vector<int32_t> k;  // [out, ksize]
};

// precompute_coeffs + normalize_coeffs_8bpc for in0 = 0, in1 = in_size (no box).
Coeffs precompute_coeffs(int in_size, int out_size, const Filter& filter) {
  const float in0 = 0.0f, in1 = static_cast<float>(in_size);
  double filterscale, scale;
  filterscale = scale = static_cast<double>(in1 - in0) / out_size;
  if (filterscale < 1.0) filterscale = 1.0;
  const double support = filter.support * filterscale;
  Coeffs c;
  c.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  c.xmin.resize(out_size);
  c.count.resize(out_size);
  c.k.assign(static_cast<size_t>(out_size * c.ksize), 0);
  std::vector<double> w(static_cast<size_t>(c.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    double ww = 0.0;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    for (int x = 0; x < xmax; ++x) {
      w[x] = filter.fn((x + xmin - center + 0.5) * ss);
      ww += w[x];
    }
    for (int x = 0; x < xmax; ++x) {
      if (ww != 0.0) w[x] /= ww;
      const double v = w[x] * (1 << kPrecisionBits);
      c.k[xx * c.ksize + x] =
          w[x] < 0 ? static_cast<int32_t>(-0.5 + v) : static_cast<int32_t>(0.5 + v);
    }
    c.xmin[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

inline uint8_t clip8(int64_t in) {
  const int64_t v = in >> kPrecisionBits;  // arithmetic shift, as Pillow's lookup table index
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Horizontal pass: rows [row0, row0 + rows) of `in` [H, W, C] -> out [rows, out_w, C].
void resample_horizontal(const uint8_t* in, int64_t w, int64_t c, int64_t row0, int64_t rows,
                         const Coeffs& co, int64_t out_w, uint8_t* out) {
  for (int64_t yy = 0; yy < rows; ++yy) {
    const uint8_t* src = in + (row0 + yy) * w * c;
    uint8_t* dst = out + yy * out_w * c;
    for (int64_t xx = 0; xx < out_w; ++xx) {
      const int32_t* k = &co.k[xx * co.ksize];
      const int xmin = co.xmin[xx], n = co.count[xx];
      for (int64_t ch = 0; ch < c; ++ch) {
        int64_t ss = int64_t{1} << (kPrecisionBits - 1);
        for (int x = 0; x < n; ++x) ss += int64_t{src[(x + xmin) * c + ch]} * k[x];
        dst[xx * c + ch] = clip8(ss);
      }
    }
  }
}

// Vertical pass: in [rows, W, C] (window starts shifted by `shift`) -> out [out_h, W, C].
void resample_vertical(const uint8_t* in, int64_t w, int64_t c, int64_t shift, const Coeffs& co,
                       int64_t out_h, uint8_t* out) {
  const int64_t row = w * c;
  for (int64_t yy = 0; yy < out_h; ++yy) {
    const int32_t* k = &co.k[yy * co.ksize];
    const int64_t ymin = co.xmin[yy] - shift;
    const int n = co.count[yy];
    uint8_t* dst = out + yy * row;
    for (int64_t i = 0; i < row; ++i) {
      int64_t ss = int64_t{1} << (kPrecisionBits - 1);
      for (int y = 0; y < n; ++y) ss += int64_t{in[(y + ymin) * row + i]} * k[y];
      dst[i] = clip8(ss);
    }
  }
}

// ImagingResampleInner without a box: [H, W, C] -> [out_h, out_w, C]. Pillow 13 runs the
// vertical pass first when the height shrinks by more than twice as many pixels as the width
// (python-pillow/Pillow#9549); the order changes the rounding of the uint8 intermediate.
at::Tensor resample(const at::Tensor& src, int64_t out_w, int64_t out_h, const Filter& filter) {
  const int64_t h = src.size(0), w = src.size(1), c = src.size(2);
  const bool need_horizontal = out_w != w;
  const bool need_vertical = out_h != h;
  const Coeffs vert = precompute_coeffs(static_cast<int>(h), static_cast<int>(out_h), filter);
  if (need_horizontal && need_vertical && out_h < h && (h - out_h) > 2 * (w - out_w)) {
    const Coeffs horiz = precompute_coeffs(static_cast<int>(w), static_cast<int>(out_w), filter);
    at::Tensor tmp = at::empty({out_h, w, c}, src.options());
    resample_vertical(src.data_ptr<uint8_t>(), w, c, 0, vert, out_h, tmp.data_ptr<uint8_t>());
    at::Tensor out = at::empty({out_h, out_w, c}, src.options());
    resample_horizontal(tmp.data_ptr<uint8_t>(), w, c, 0, out_h, horiz, out_w,
                        out.data_ptr<uint8_t>());
    return out;
  }
  const int64_t ybox_first = vert.xmin[0];
  const int64_t ybox_last = vert.xmin[out_h - 1] + vert.count[out_h - 1];

  at::Tensor cur = src;
  int64_t shift = 0;
  if (need_horizontal) {
    // Only the source rows the vertical pass reads.
    const Coeffs horiz = precompute_coeffs(static_cast<int>(w), static_cast<int>(out_w), filter);
    const int64_t rows = ybox_last - ybox_first;
    at::Tensor tmp = at::empty({rows, out_w, c}, src.options());
    resample_horizontal(src.data_ptr<uint8_t>(), w, c, ybox_first, rows, horiz, out_w,
                        tmp.data_ptr<uint8_t>());
    cur = tmp;
    shift = ybox_first;
  }
  if (need_vertical) {
    at::Tensor out = at::empty({out_h, cur.size(1), c}, src.options());
    resample_vertical(cur.data_ptr<uint8_t>(), cur.size(1), c, shift, vert, out_h,
                      out.data_ptr<uint8_t>());
    return out;
  }
  return need_horizontal ? cur : src.clone();
}

// ImagingScaleAffine for a = (in_w / out_w, 0, 0, 0, in_h / out_h, 0), fill = 1.
at::Tensor resize_nearest(const at::Tensor& src, int64_t out_w, int64_t out_h) {
  const int64_t h = src.size(0), w = src.size(1), c = src.size(2);
  const double a0 = static_cast<double>(static_cast<float>(w) - 0.0f) / out_w;
  const double a4 = static_cast<double>(static_cast<float>(h) - 0.0f) / out_h;
  auto coord = [](double v) { return v < 0.0 ? -1 : static_cast<int>(v); };
  std::vector<int> xintab(static_cast<size_t>(out_w), 0);
  int64_t xmin = out_w, xmax = 0;
  double xo = 0.0 + a0 * 0.5;
  for (int64_t x = 0; x < out_w; ++x) {
    const int xin = coord(xo);
    if (xin >= 0 && xin < w) {
      xmax = x + 1;
      if (x < xmin) xmin = x;
      xintab[x] = xin;
    }
    xo += a0;
  }
  at::Tensor out = at::zeros({out_h, out_w, c}, src.options());
  const uint8_t* in = src.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  double yo = 0.0 + a4 * 0.5;
  for (int64_t y = 0; y < out_h; ++y) {
    const int yi = coord(yo);
    if (yi >= 0 && yi < h) {
      for (int64_t x = xmin; x < xmax; ++x) {
        std::copy_n(in + (yi * w + xintab[x]) * c, c, o + (y * out_w + x) * c);
      }
    }
    yo += a4;
  }
  return out;
}

// "RGBA" -> "RGBa" (Convert.c rgbA2rgba): colour * alpha / 255 via MULDIV255.
void premultiply(uint8_t* p, int64_t pixels) {
  for (int64_t i = 0; i < pixels; ++i, p += 4) {
    const unsigned alpha = p[3];
    for (int ch = 0; ch < 3; ++ch) {
      const unsigned tmp = p[ch] * alpha + 128;
      p[ch] = static_cast<uint8_t>(((tmp >> 8) + tmp) >> 8);
    }
  }
}

// "RGBa" -> "RGBA" (Convert.c rgba2rgbA): colour * 255 / alpha, clipped; alpha 0 or 255 as is.
void unpremultiply(uint8_t* p, int64_t pixels) {
  for (int64_t i = 0; i < pixels; ++i, p += 4) {
    const unsigned alpha = p[3];
    if (alpha == 255 || alpha == 0) continue;
    for (int ch = 0; ch < 3; ++ch) {
      const unsigned v = (255u * p[ch]) / alpha;
      p[ch] = static_cast<uint8_t>(v < 256 ? v : 255);
    }
  }
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

PilFilter pil_filter_from_int(int64_t value, const std::string& where) {
  switch (value) {
    case 0:
      return PilFilter::kNearest;
    case 1:
      return PilFilter::kLanczos;
    case 2:
      return PilFilter::kBilinear;
    case 3:
      return PilFilter::kBicubic;
    case 4:
      return PilFilter::kBox;
    case 5:
      return PilFilter::kHamming;
    default:
      break;
  }
  XF_THROW(where, ": unsupported PIL resample filter ", value,
           " (expected 0 NEAREST, 1 LANCZOS, 2 BILINEAR, 3 BICUBIC, 4 BOX or 5 HAMMING)");
}

const char* pil_filter_name(PilFilter filter) {
  switch (filter) {
    case PilFilter::kNearest:
      return "NEAREST";
    case PilFilter::kLanczos:
      return "LANCZOS";
    case PilFilter::kBilinear:
      return "BILINEAR";
    case PilFilter::kBicubic:
      return "BICUBIC";
    case PilFilter::kBox:
      return "BOX";
    case PilFilter::kHamming:
      return "HAMMING";
  }
  return "?";
}

at::Tensor pil_resize(const at::Tensor& image, int64_t width, int64_t height, PilFilter filter) {
  XF_CHECK(image.defined(), "pil_resize: image is undefined");
  XF_CHECK(image.dim() == 3 && image.scalar_type() == at::kByte &&
               (image.size(2) == 1 || image.size(2) == 3 || image.size(2) == 4),
           "pil_resize: image must be uint8 [H, W, C] with C = 1, 3 or 4, got ",
           image.scalar_type(), " ", image.sizes());
  XF_CHECK(image.size(0) >= 1 && image.size(1) >= 1, "pil_resize: empty image ", image.sizes());
  XF_CHECK(width >= 1 && height >= 1, "pil_resize: height and width must be > 0, got ", width, "x",
           height);
  XF_CHECK(width < (int64_t{1} << 24) && height < (int64_t{1} << 24) &&
               image.size(0) < (int64_t{1} << 24) && image.size(1) < (int64_t{1} << 24),
           "pil_resize: sizes above 2^24 are not supported, got ", image.sizes(), " -> ", width,
           "x", height);
  const auto device = image.device();
  at::Tensor src = image.to(at::kCPU).contiguous();
  const int64_t h = src.size(0), w = src.size(1), c = src.size(2);
  at::Tensor out;
  if (width == w && height == h) {
    out = src.clone();  // Image.resize returns self.copy()
  } else if (filter == PilFilter::kNearest) {
    out = resize_nearest(src, width, height);
  } else if (c == 4) {
    at::Tensor pre = src.clone();
    premultiply(pre.data_ptr<uint8_t>(), h * w);
    out = resample(pre, width, height, filter_of(filter));
    unpremultiply(out.data_ptr<uint8_t>(), height * width);
  } else {
    out = resample(src, width, height, filter_of(filter));
  }
  return out.to(device);
}

at::Tensor center_crop(const at::Tensor& image, int64_t crop_height, int64_t crop_width) {
  XF_CHECK(image.defined() && image.dim() == 3,
           "center_crop: image must be [H, W, C] (channels last), got ",
           image.defined() ? image.sizes() : at::IntArrayRef{});
  XF_CHECK(crop_height >= 1 && crop_width >= 1, "center_crop: crop size must be positive, got ",
           crop_height, "x", crop_width);
  const int64_t h = image.size(0), w = image.size(1);
  int64_t top = floor_div(h - crop_height, 2), left = floor_div(w - crop_width, 2);
  int64_t bottom = top + crop_height, right = left + crop_width;
  if (top >= 0 && bottom <= h && left >= 0 && right <= w) {
    return image.narrow(0, top, crop_height).narrow(1, left, crop_width).clone();
  }
  // Too small: zero-pad to at least the crop size, the image centred (ceil of half the padding
  // before it), then crop.
  const int64_t new_h = std::max(crop_height, h), new_w = std::max(crop_width, w);
  const int64_t top_pad = (new_h - h + 1) / 2, left_pad = (new_w - w + 1) / 2;
  at::Tensor padded = at::zeros({new_h, new_w, image.size(2)}, image.options());
  padded.narrow(0, top_pad, h).narrow(1, left_pad, w).copy_(image);
  top += top_pad;
  bottom += top_pad;
  left += left_pad;
  right += left_pad;
  const int64_t r0 = std::max<int64_t>(0, top), r1 = std::min(new_h, bottom);
  const int64_t c0 = std::max<int64_t>(0, left), c1 = std::min(new_w, right);
  return padded.narrow(0, r0, r1 - r0).narrow(1, c0, c1 - c0);
}

}  // namespace xfuser::models::image
