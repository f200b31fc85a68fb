// The one attention op every model uses: softmax(scale * Q K^T, masked) V, with the per-query
// log-sum-exp of the (scaled, masked) scores so partial results can be merged exactly (ring
// attention, stale K/V in PipeFusion).
//
// Layout (all tensors on one device):
//   q    [B, Sq, H, D]      k [B, Sk, H, D]      v [B, Sk, H, Dv]
//   out  [B, Sq, H, Dv]     in q's dtype
//   lse  [B, H, Sq]         float32; -inf for a query whose keys are all masked (its out is 0)
// Any strides are accepted ([B, S, H, D] views of [B, S, H*D] projections need no copy).
//
// CPU without a mask or bias (float32, bf16), libtorch >= 2.3: PyTorch's fused CPU kernel, the
// one its scaled_dot_product_attention runs there (at::_scaled_dot_product_flash_attention_for_cpu:
// blocks of queries and keys with an online softmax, parallel over batch x heads x query blocks),
// counted as "cpu_flash". On older libtorch ("blocked"): one (batch, head) at a time in query
// blocks whose scores fit in cache; Q K^T, the softmax and its statistics in float32, P V in the
// input dtype with float32 accumulation. CPU with a mask or bias, or fp16: query chunks over all
// heads with every product in float32 (memory O(chunk * Sk) per batch and head).
//
// CUDA on libtorch >= 2.1: a fused kernel that returns the log-sum-exp, reading Q, K, V in place
// (no copy unless the head dim is strided), the mask and bias folded into one additive bias:
//   automatic  the kernel PyTorch's scaled_dot_product_attention picks for the same inputs
//              (at::_fused_sdp_choice: flash, memory-efficient or, on libtorch >= 2.5, cuDNN,
//              honouring at::globalContext()'s SDP enable flags), so xfuser runs what diffusers
//              runs on that GPU and libtorch; where PyTorch would pick its math path, the chunked
//              path. A cuDNN call that fails (an unsupported layout or version) is reported once
//              and the process goes on with flash / memory-efficient.
//   flash      fp16/bf16, head dims equal, a multiple of 8 and <= 256, no mask or bias
//   efficient  head dims multiples of 8; any float dtype
//   cudnn      libtorch >= 2.5; fp16/bf16
// Otherwise the chunked path.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace xfuser::backends {

enum class AttentionKernel {
  automatic,  // CUDA: as PyTorch's SDPA chooses (above); CPU: blocked or chunked
  chunked,    // the chunked path, on any device (the reference the fused kernels are tested on)
  flash,      // the fused CUDA kernels (libtorch >= 2.1; cudnn >= 2.5)
  efficient,
  cudnn,
};

// "auto", "chunked", "flash", "efficient", "cudnn" (the names of parse_attention_kernel).
const char* attention_kernel_name(AttentionKernel kernel);
// Parses one of those names; anything else is an error naming `what` (a flag or variable) and
// the accepted names.
AttentionKernel parse_attention_kernel(const std::string& name, const std::string& what);

// Throws, naming `what` (a flag), when `kernel` cannot run on `device` with this libtorch: a fused
// kernel needs a CUDA device and libtorch >= 2.1 (cuDNN: >= 2.6). automatic and chunked always run.
void check_attention_kernel_runs(AttentionKernel kernel, const c10::Device& device,
                                 const std::string& what);

// The kernel a run asks for: `flag` (the value of --attention_backend) when not empty, else
// XFUSER_ATTENTION_KERNEL, else automatic; an unknown name, or a kernel that cannot run on
// `device` (check_attention_kernel_runs), is an error naming the flag or the variable.
AttentionKernel resolve_attention_kernel(const std::string& flag, const c10::Device& device);

// The process default for calls that name no kernel: XFUSER_ATTENTION_KERNEL when set (an
// unknown name is an error naming the variable), else automatic.
AttentionKernel default_attention_kernel();
void set_default_attention_kernel(AttentionKernel kernel);

// Calls per kernel that ran in this process ("cpu_flash", "blocked", "chunked", "flash",
// "efficient", "cudnn"), for run reports and benchmarks: which kernel a GPU really ran.
std::map<std::string, int64_t> attention_kernel_calls();
// The name an unmasked float32 / bf16 CPU call is counted under with this libtorch:
// "cpu_flash" (>= 2.3) or "blocked".
const char* cpu_attention_kernel_name();
void reset_attention_kernel_calls();

struct AttentionOptions {
  // Multiplies Q K^T; default 1/sqrt(D).
  std::optional<double> scale;
  // Optional boolean mask, True = attend. Either a key mask [B, Sk] or a tensor broadcastable to
  // [B, H, Sq, Sk] (e.g. [B, 1, 1, Sk] or a pairwise [B, 1, Sq, Sk]). Undefined = no mask.
  at::Tensor mask;
  // Optional additive float bias broadcastable to [B, H, Sq, Sk] (4-D, each dim full or 1), added
  // to the scaled scores before the softmax: T5's relative position bias, CLIP's causal bias.
  // -inf entries mask like `mask` does.
  at::Tensor bias;
  // Queries per block/chunk on the CPU paths; 0 = automatic (blocked: about 1 MiB of float32
  // scores per block; chunked: about 16M score elements per chunk).
  int64_t query_chunk_size = 0;
  // The kernel; unset = the process default (default_attention_kernel()). A kernel named here
  // must take the call (an error says why not); the process default is a preference (used where
  // it applies, else automatic).
  std::optional<AttentionKernel> kernel;
};

struct AttentionOutput {
  at::Tensor out;  // [B, Sq, H, Dv], q's dtype (merge_attention: see there)
  at::Tensor lse;  // [B, H, Sq], float32
};

// Attention of q over k/v (see the layout above). Shapes are checked; errors name the tensors.
AttentionOutput attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionOptions& opts = {});

// The contract for rows whose keys are all masked, applied to a fused kernel's result of a call
// with a mask or bias: out 0 and lse -inf, whatever the kernel left there. Such a row is one
// `empty_rows` names ([B, H, Sq] bool, from the folded bias: every key -inf; PyTorch's
// memory-efficient kernel leaves a finite lse and an average of V there, as seen on an H100) or
// one whose lse is not finite (flash and cuDNN leave -inf or NaN; finite scores always give a
// finite lse). `out` is [B, Sq, H, Dv], `lse` float32 [B, H, Sq]; both are replaced.
void clear_fully_masked_rows(AttentionOutput& result, const at::Tensor& empty_rows = {});

// Exactly combines two attention results of the same queries over disjoint key sets:
//   lse = log(exp(lse_a) + exp(lse_b)),  out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b,
// computed in float32. A side with lse = -inf contributes nothing; both -inf gives out 0 and
// lse -inf. The output has `out_dtype` (default: a.out's dtype; pass float32 to keep an exact
// accumulator over many merges).
AttentionOutput merge_attention(const AttentionOutput& a, const AttentionOutput& b,
                                std::optional<c10::ScalarType> out_dtype = std::nullopt);

}  // namespace xfuser::backends
