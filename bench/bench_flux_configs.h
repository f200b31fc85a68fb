// The FLUX transformer configs every benchmark measures (bench_flux, bench_parallel,
// bench_e2e), their analytic FLOPs and pipeline-like inputs. Header-only (see bench_common.h).
//
// Every config has head dim 128, in_channels 64, joint_attention_dim 512, pooled_projection_dim
// 128, guidance embedding on, batch 1:
//   tiny    2 heads (D = 256),   1 double +  1 single block,  256 image (16x16) +  64 text tokens
//   small   4 heads (D = 512),   4 double +  8 single blocks, 1024 image (32x32) + 128 text tokens
//   medium  8 heads (D = 1024),  8 double + 16 single blocks, 1024 image (32x32) + 256 text tokens
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "backends/error.h"
#include "models/flux/flux_transformer.h"

namespace xfuser::bench {

struct BenchConfig {
  std::string name;
  int64_t heads = 0;
  int64_t double_blocks = 0;
  int64_t single_blocks = 0;
  int64_t grid = 0;  // image tokens = grid * grid
  int64_t text_tokens = 0;
  int default_reps = 0;
};

inline const std::vector<BenchConfig>& bench_configs() {
  static const std::vector<BenchConfig> configs = {
      {"tiny", 2, 1, 1, 16, 64, 10},
      {"small", 4, 4, 8, 32, 128, 5},
      {"medium", 8, 8, 16, 32, 256, 3},
  };
  return configs;
}

// The configs named in a comma-separated `list` (e.g. "small,medium"), in table order; an
// unknown name is an error naming `flag`.
inline std::vector<BenchConfig> select_configs(const std::string& list, const std::string& flag) {
  const std::string padded = "," + list + ",";
  for (size_t start = 1; start < padded.size();) {
    const size_t comma = padded.find(',', start);
    const std::string item = padded.substr(start, comma - start);
    bool known = item.empty();
    for (const auto& b : bench_configs()) known = known || b.name == item;
    XF_CHECK(known, "--", flag, ": unknown config '", item, "' (tiny, small, medium)");
    start = comma + 1;
  }
  std::vector<BenchConfig> out;
  for (const auto& b : bench_configs()) {
    if (padded.find("," + b.name + ",") != std::string::npos) out.push_back(b);
  }
  XF_CHECK(!out.empty(), "--", flag, " selects no config");
  return out;
}

// The dtypes named in a comma-separated `list` of fp32 / bf16, in that order.
inline std::vector<c10::ScalarType> select_dtypes(const std::string& list,
                                                  const std::string& flag) {
  const std::string padded = "," + list + ",";
  for (size_t start = 1; start < padded.size();) {
    const size_t comma = padded.find(',', start);
    const std::string item = padded.substr(start, comma - start);
    XF_CHECK(item.empty() || item == "fp32" || item == "bf16", "--", flag, ": unknown dtype '",
             item, "' (fp32, bf16)");
    start = comma + 1;
  }
  std::vector<c10::ScalarType> out;
  if (padded.find(",fp32,") != std::string::npos) out.push_back(at::kFloat);
  if (padded.find(",bf16,") != std::string::npos) out.push_back(at::kBFloat16);
  XF_CHECK(!out.empty(), "--", flag, " selects no dtype");
  return out;
}

inline models::flux::FluxConfig flux_config(const BenchConfig& b) {
  models::flux::FluxConfig c;
  c.patch_size = 1;
  c.in_channels = 64;
  c.num_layers = b.double_blocks;
  c.num_single_layers = b.single_blocks;
  c.attention_head_dim = 128;
  c.num_attention_heads = b.heads;
  c.joint_attention_dim = 512;
  c.pooled_projection_dim = 128;
  c.guidance_embeds = true;
  c.axes_dims_rope = {16, 56, 56};
  c.validate("bench config " + b.name);
  return c;
}

// Analytic FLOPs of one forward (multiply-add = 2 FLOP), S = image + text tokens, D = hidden:
//   per block, linear layers: 2 * 12 * D^2 * S
//     double block: q,k,v (3 D^2) + attention out (D^2) + MLP D->4D->D (8 D^2) = 12 D^2 per
//                   token, counted once per token over both streams (image N + text L = S);
//     single block: q,k,v (3 D^2) + MLP up D->4D (4 D^2) + proj_out 5D->D (5 D^2) = 12 D^2;
//   per block, attention: 4 * S^2 * D  (Q K^T and P V, 2 S^2 D each, over all heads);
//   total = (double + single blocks) * (24 D^2 S + 4 S^2 D).
// Not counted (small here): the embedders, AdaLN modulation linears on the [B, D] conditioning,
// norm_out/proj_out, norms, RoPE, softmax and element-wise work.
inline double forward_flops(const models::flux::FluxConfig& c, int64_t tokens) {
  const double d = static_cast<double>(c.inner_dim());
  const double s = static_cast<double>(tokens);
  const double per_block = 2.0 * 12.0 * d * d * s + 4.0 * s * s * d;
  return static_cast<double>(c.num_layers + c.num_single_layers) * per_block;
}

// Pipeline-like inputs in fp32 (the model casts): image ids (0, row, col) on the grid, text ids
// zero.
inline models::flux::FluxInputs make_inputs(const models::flux::FluxConfig& c,
                                            const BenchConfig& b) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  const int64_t n = b.grid * b.grid;
  models::flux::FluxInputs in;
  in.hidden_states = at::empty({1, n, c.in_channels}).normal_(0.0, 1.0, gen);  // [1, N, C]
  in.encoder_hidden_states =
      at::empty({1, b.text_tokens, c.joint_attention_dim}).normal_(0.0, 1.0, gen);  // [1, L, J]
  in.pooled_projections = at::empty({1, c.pooled_projection_dim}).normal_(0.0, 1.0, gen);
  in.timestep = at::full({1}, 0.5);
  in.guidance = at::full({1}, 3.5);
  auto rows = at::arange(b.grid, at::kFloat).repeat_interleave(b.grid);  // [N]
  auto cols = at::arange(b.grid, at::kFloat).repeat({b.grid});           // [N]
  in.img_ids = at::stack({at::zeros({n}), rows, cols}, 1);               // [N, 3]
  in.txt_ids = at::zeros({b.text_tokens, 3});                            // [L, 3]
  return in;
}

inline double median(std::vector<double> v) {
  XF_CHECK(!v.empty(), "median of no values");
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace xfuser::bench
