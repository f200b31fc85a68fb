#include "backends/fp8.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "backends/error.h"

#if XFUSER_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

// libtorch >= 2.1 has fp8 dtypes.
#if XFUSER_TORCH_MAJOR > 2 || (XFUSER_TORCH_MAJOR == 2 && XFUSER_TORCH_MINOR >= 1)
#define XFUSER_NATIVE_FP8 1
#else
#define XFUSER_NATIVE_FP8 0
#endif
// Row-wise scaled matmul (per-row and per-column float32 scales) is in libtorch >= 2.5.
#if XFUSER_TORCH_CUDA && \
    (XFUSER_TORCH_MAJOR > 2 || (XFUSER_TORCH_MAJOR == 2 && XFUSER_TORCH_MINOR >= 5))
#define XFUSER_ROWWISE_SCALED_MM 1
#else
#define XFUSER_ROWWISE_SCALED_MM 0
#endif

namespace xfuser::backends {
namespace {

uint32_t fp8_float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float fp8_bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// PyTorch's fp8e4m3fn_from_fp32_value (c10/util/Float8_e4m3fn.h).
uint8_t encode_e4m3fn(float f) {
  constexpr uint32_t kFirstNan = UINT32_C(1087) << 20;   // 480.0f: not representable
  constexpr uint32_t kDenormMask = UINT32_C(141) << 23;  // (127 - 7) + (23 - 3) + 1
  uint32_t f_bits = fp8_float_bits(f);
  const uint32_t sign = f_bits & UINT32_C(0x80000000);
  f_bits ^= sign;
  uint8_t result;
  if (f_bits >= kFirstNan) {
    result = 0x7f;  // NaN (also for inf and NaN inputs)
  } else if (f_bits < (UINT32_C(121) << 23)) {
    // Below 2^-6, the smallest normal: the float addition rounds the mantissa into place.
    f_bits = fp8_float_bits(fp8_bits_float(f_bits) + fp8_bits_float(kDenormMask));
    result = static_cast<uint8_t>(f_bits - kDenormMask);
  } else {
    const uint32_t mant_odd = (f_bits >> 20) & 1;
    f_bits += (static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFF;
    f_bits += mant_odd;  // round half to even
    result = static_cast<uint8_t>(f_bits >> 20);
  }
  return static_cast<uint8_t>(result | (sign >> 24));
}

// PyTorch's fp8e5m2_from_fp32_value (c10/util/Float8_e5m2.h).
uint8_t encode_e5m2(float f) {
  constexpr uint32_t kInf = UINT32_C(255) << 23;
  constexpr uint32_t kMax = UINT32_C(143) << 23;
  constexpr uint32_t kDenormMask = UINT32_C(134) << 23;
  uint32_t f_bits = fp8_float_bits(f);
  const uint32_t sign = f_bits & UINT32_C(0x80000000);
  f_bits ^= sign;
  uint8_t result;
  if (f_bits >= kMax) {
    result = f_bits > kInf ? UINT8_C(0x7F) : UINT8_C(0x7C);  // NaN stays NaN, else infinity
  } else if (f_bits < (UINT32_C(113) << 23)) {
    f_bits = fp8_float_bits(fp8_bits_float(f_bits) + fp8_bits_float(kDenormMask));
    result = static_cast<uint8_t>(f_bits - kDenormMask);
  } else {
    const uint32_t mant_odd = (f_bits >> 21) & 1;
    f_bits += (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFFF;
    f_bits += mant_odd;
    result = static_cast<uint8_t>(f_bits >> 21);
  }
  return static_cast<uint8_t>(result | (sign >> 24));
}

float fp8_decode_bits(uint8_t byte, Fp8Format format) {
  const bool e4m3 = format == Fp8Format::kE4M3FN;
  const bool negative = (byte & 0x80) != 0;
  const int exp_bits = e4m3 ? 4 : 5;
  const int mant_bits = 7 - exp_bits;
  const int bias = e4m3 ? 7 : 15;
  const int exp = (byte >> mant_bits) & ((1 << exp_bits) - 1);
  const int mant = byte & ((1 << mant_bits) - 1);
  const float scale = static_cast<float>(1 << mant_bits);
  float value;
  if (e4m3 && exp == 15 && mant == 7) {
    value = std::numeric_limits<float>::quiet_NaN();
  } else if (!e4m3 && exp == 31) {
    value = mant == 0 ? std::numeric_limits<float>::infinity()
                      : std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    value = std::ldexp(static_cast<float>(mant) / scale, 1 - bias);  // subnormal
  } else {
    value = std::ldexp(1.0f + static_cast<float>(mant) / scale, exp - bias);
  }
  return negative ? -value : value;
}

const std::array<float, 256>& fp8_decode_table(Fp8Format format) {
  static const auto make = [](Fp8Format f) {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = fp8_decode_bits(static_cast<uint8_t>(b), f);
    return t;
  };
  static const std::array<float, 256> e4m3 = make(Fp8Format::kE4M3FN);
  static const std::array<float, 256> e5m2 = make(Fp8Format::kE5M2);
  return format == Fp8Format::kE4M3FN ? e4m3 : e5m2;
}

#if XFUSER_NATIVE_FP8
c10::ScalarType fp8_native_dtype(Fp8Format format) {
  return format == Fp8Format::kE4M3FN ? c10::ScalarType::Float8_e4m3fn
                                      : c10::ScalarType::Float8_e5m2;
}
#endif

}  // namespace

Fp8Format parse_fp8_format(const std::string& name, const std::string& flag) {
  if (name == "float8_e4m3fn" || name == "e4m3fn") return Fp8Format::kE4M3FN;
  if (name == "float8_e5m2" || name == "e5m2") return Fp8Format::kE5M2;
  XF_THROW(flag, " must be float8_e4m3fn or float8_e5m2, got '", name, "'");
}

std::string fp8_format_name(Fp8Format format) {
  return format == Fp8Format::kE4M3FN ? "float8_e4m3fn" : "float8_e5m2";
}

double fp8_max(Fp8Format format) { return format == Fp8Format::kE4M3FN ? 448.0 : 57344.0; }

bool native_fp8() { return XFUSER_NATIVE_FP8 != 0; }

uint8_t fp8_encode(float value, Fp8Format format) {
  return format == Fp8Format::kE4M3FN ? encode_e4m3fn(value) : encode_e5m2(value);
}

float fp8_decode(uint8_t bits, Fp8Format format) { return fp8_decode_table(format)[bits]; }

Fp8Format fp8_format_of(c10::ScalarType dtype) {
#if XFUSER_NATIVE_FP8
  if (dtype == c10::ScalarType::Float8_e4m3fn) return Fp8Format::kE4M3FN;
  if (dtype == c10::ScalarType::Float8_e5m2) return Fp8Format::kE5M2;
#endif
  XF_THROW("not an fp8 dtype: ", dtype);
}

at::Tensor to_fp8(const at::Tensor& x, Fp8Format format) {
  XF_CHECK(at::isFloatingType(x.scalar_type()), "to_fp8: ", x.scalar_type(),
           " is not a floating-point type");
#if XFUSER_NATIVE_FP8
  // Narrower dtypes widen to float32 exactly, so the one rounding is libtorch's float -> fp8.
  return x.to(fp8_native_dtype(format));
#else
  XF_CHECK(x.device().is_cpu(), "fp8 weights on ", x.device(), " need libtorch >= 2.1");
  const at::Tensor src = x.to(at::kFloat).contiguous();
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(at::kByte));
  const float* in = src.data_ptr<float>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, src.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] = fp8_encode(in[i], format);
  });
  return out;
#endif
}

at::Tensor from_fp8(const at::Tensor& fp8, Fp8Format format, c10::ScalarType dtype) {
#if XFUSER_NATIVE_FP8
  if (fp8.scalar_type() != at::kByte) {
    XF_CHECK(fp8_format_of(fp8.scalar_type()) == format, "from_fp8: a ", fp8.scalar_type(),
             " tensor read as ", fp8_format_name(format));
    return fp8.to(dtype);
  }
#endif
  XF_CHECK(fp8.scalar_type() == at::kByte, "from_fp8: expected fp8 bits, got ", fp8.scalar_type());
  XF_CHECK(fp8.device().is_cpu(), "fp8 bits on ", fp8.device(), " need libtorch >= 2.1");
  const at::Tensor src = fp8.contiguous();
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(at::kFloat));
  const uint8_t* in = src.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  const auto& t = fp8_decode_table(format);
  at::parallel_for(0, src.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] = t[in[i]];
  });
  return dtype == at::kFloat ? out : out.to(dtype);
}

std::string fp8_linear_path(const c10::Device& device, Fp8Format format, c10::ScalarType dtype,
                            int64_t in_features, int64_t out_features) {
#if XFUSER_ROWWISE_SCALED_MM
  if (device.is_cuda() && format == Fp8Format::kE4M3FN && dtype == at::kBFloat16 &&
      in_features % 16 == 0 && out_features % 16 == 0 &&
      at::cuda::getDeviceProperties(device.index())->major >= 9) {
    return "scaled_mm";
  }
#endif
  return "emulated";
}

at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scale,
                      const at::Tensor& bias, Fp8Format format, c10::ScalarType dtype) {
  const int64_t k = data.size(1), n = data.size(0);
  XF_CHECK(x.dim() >= 1 && x.size(-1) == k, "FP8 linear [", n, ", ", k, "] expects [..., ", k,
           "], got ", x.sizes());
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = n;
  const at::Tensor x2 = x.reshape({-1, k});
  // Per-token scales: each row's largest magnitude maps to the format's largest finite value.
  // The max-norm reads the rows once (no float32 copy, no |x| tensor), and the division
  // promotes to float32 by itself: on a GPU these passes over the activations, not the GEMM,
  // are most of an FP8 layer's extra time.
  const at::Tensor x_scale =
      (at::linalg_vector_norm(x2, std::numeric_limits<double>::infinity(), {1},
                              /*keepdim=*/true, at::kFloat) /
       fp8_max(format))
          .clamp_min(1e-12);
  const at::Tensor xq = to_fp8(at::div(x2, x_scale), format);
#if XFUSER_ROWWISE_SCALED_MM
  if (fp8_linear_path(x.device(), format, dtype, k, n) == "scaled_mm") {
    const at::Tensor y =
        at::_scaled_mm(xq, data.t(), x_scale, scale.t().contiguous(),
                       bias.defined() ? std::optional<at::Tensor>(bias.to(dtype)) : std::nullopt,
                       std::nullopt, dtype);
    return y.reshape(out_shape);
  }
#endif
  // The same operands, decoded exactly and scaled; float16 has no CPU matmul: float32.
  const c10::ScalarType mm =
      (dtype == at::kHalf && !x.is_cuda()) || dtype == at::kFloat ? at::kFloat : dtype;
  const at::Tensor xd = (from_fp8(xq, format, at::kFloat) * x_scale).to(mm);
  const at::Tensor wd = (from_fp8(data, format, at::kFloat) * scale).to(mm);
  const at::Tensor y = at::linear(xd, wd, bias.defined() ? bias.to(mm) : bias);
  return y.to(dtype).reshape(out_shape);
}

}  // namespace xfuser::backends
