// 8-bit floating point weights: the two OCP FP8 formats PyTorch names float8_e4m3fn and
// float8_e5m2, rounded exactly as PyTorch's `.to(torch.float8_*)` rounds, on every libtorch.
//
// libtorch >= 2.1 has fp8 dtypes: an fp8 tensor is then a tensor of that dtype, converted by
// libtorch's own kernels (CPU and CUDA). Older libtorch (Debian's 1.13) has none: an fp8 tensor
// is a CPU uint8 tensor of the format's bits, encoded and decoded here with PyTorch's algorithms
// (round to nearest even; e4m3fn: 480 and above is NaN, there are no infinities; e5m2: IEEE-style
// infinities). Both representations hold the same bits and decode to the same values.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace xfuser::backends {

enum class Fp8Format { kE4M3FN, kE5M2 };

// "float8_e4m3fn" / "e4m3fn" and "float8_e5m2" / "e5m2"; anything else is an error naming
// `flag` and the accepted names.
Fp8Format parse_fp8_format(const std::string& name, const std::string& flag);
// PyTorch's dtype name: "float8_e4m3fn", "float8_e5m2".
std::string fp8_format_name(Fp8Format format);
// The largest finite value: 448 (e4m3fn), 57344 (e5m2).
double fp8_max(Fp8Format format);

// True when libtorch has fp8 dtypes (>= 2.1) and fp8 tensors use them.
bool native_fp8();

// One value, bit for bit as PyTorch's c10::Float8_e4m3fn(float) / Float8_e5m2(float).
uint8_t fp8_encode(float value, Fp8Format format);
float fp8_decode(uint8_t bits, Fp8Format format);

// `x` (any floating dtype; read as float32, which every narrower dtype converts to exactly)
// rounded to fp8: the native fp8 dtype where libtorch has it, else uint8 bits on the CPU.
at::Tensor to_fp8(const at::Tensor& x, Fp8Format format);
// An fp8 tensor made by to_fp8 (or read from a checkpoint) decoded to `dtype`.
at::Tensor from_fp8(const at::Tensor& fp8, Fp8Format format, c10::ScalarType dtype);
// The format of a native fp8 tensor; an error for any other dtype (uint8 bits carry no format).
Fp8Format fp8_format_of(c10::ScalarType dtype);

}  // namespace xfuser::backends

namespace xfuser::backends {

// y = x W^T + b for a Linear weight held in fp8 with one float32 scale per output channel
// (W = data * scale, data [N, K], scale [N, 1]); x [..., K] in the layer's compute dtype `dtype`,
// y [..., N] in `dtype`. The activations are quantized per token (row) to the same format, with
// float32 scales amax / fp8 max, as the FP8 GEMMs of TensorRT-LLM and torchao's rowwise recipe do.
// Where the device has FP8 tensor cores for it (CUDA, compute capability >= 9.0, libtorch >= 2.5,
// float8_e4m3fn, bf16 compute, K and N multiples of 16) the product is libtorch's scaled matmul
// (fp32 accumulation, bf16 out). Elsewhere the same quantized operands are decoded and multiplied
// in `dtype` (float32 for float16 on the CPU), so the two paths differ only by the GEMM's rounding.
at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scale,
                      const at::Tensor& bias, Fp8Format format, c10::ScalarType dtype);
// Which path fp8_linear takes for an input on `device` with these sizes: "scaled_mm" or
// "emulated" (reports and tests).
std::string fp8_linear_path(const c10::Device& device, Fp8Format format, c10::ScalarType dtype,
                            int64_t in_features, int64_t out_features);

}  // namespace xfuser::backends
