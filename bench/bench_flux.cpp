// bench_flux: FluxTransformer2DModel forward time, analytic FLOPs and MFU on this machine.
//
//   bench_flux [--threads N] [--configs tiny,small,medium] [--dtypes fp32,bf16] [--reps R]
//              [--warmup W] [--gemm-sizes 2048,4096] [--out FILE]
//
// Models are built from a FluxConfig with seeded random weights (no files). Every config has
// head dim 128, in_channels 64, joint_attention_dim 512, pooled_projection_dim 128, guidance
// embedding on, batch 1:
//   tiny    2 heads (D = 256),   1 double +  1 single block,  256 image (16x16) +  64 text tokens
//   small   4 heads (D = 512),   4 double +  8 single blocks, 1024 image (32x32) + 128 text tokens
//   medium  8 heads (D = 1024),  8 double + 16 single blocks, 1024 image (32x32) + 256 text tokens
// The GEMM peak of each dtype is measured first in the same process with the routine of
// bench_gemm; MFU = (analytic FLOPs / median forward seconds) / that peak.
#include <iostream>
#include <numeric>

#include "backends/backend.h"
#include "bench/bench_common.h"
#include "models/common/kernels.h"
#include "models/flux/flux_transformer.h"

namespace xb = xfuser::bench;
using xfuser::models::flux::FluxConfig;
using xfuser::models::flux::FluxInputs;
using xfuser::models::flux::FluxTransformer2DModel;

namespace {

struct BenchConfig {
  std::string name;
  int64_t heads = 0;
  int64_t double_blocks = 0;
  int64_t single_blocks = 0;
  int64_t grid = 0;  // image tokens = grid * grid
  int64_t text_tokens = 0;
  int default_reps = 0;
};

const std::vector<BenchConfig>& bench_configs() {
  static const std::vector<BenchConfig> configs = {
      {"tiny", 2, 1, 1, 16, 64, 10},
      {"small", 4, 4, 8, 32, 128, 5},
      {"medium", 8, 8, 16, 32, 256, 3},
  };
  return configs;
}

FluxConfig flux_config(const BenchConfig& b) {
  FluxConfig c;
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
  c.validate("bench_flux config " + b.name);
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
double forward_flops(const FluxConfig& c, int64_t tokens) {
  const double d = static_cast<double>(c.inner_dim());
  const double s = static_cast<double>(tokens);
  const double per_block = 2.0 * 12.0 * d * d * s + 4.0 * s * s * d;
  return static_cast<double>(c.num_layers + c.num_single_layers) * per_block;
}

// Pipeline-like inputs: image ids (0, row, col) on the grid, text ids zero.
FluxInputs make_inputs(const FluxConfig& c, const BenchConfig& b) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  const int64_t n = b.grid * b.grid;
  FluxInputs in;
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    xb::Args args(argc, argv, {});
    args.check_known(
        {"threads", "configs", "dtypes", "reps", "warmup", "gemm-sizes", "kernels", "out"});
    const int threads = static_cast<int>(args.get_int("threads", 1));
    const bool openblas = xb::set_threads(threads);
    const int reps_override = static_cast<int>(args.get_int("reps", 0));
    const int warmup = static_cast<int>(args.get_int("warmup", 1));
    XF_CHECK(reps_override >= 0 && warmup >= 0, "--reps and --warmup must be >= 0");
    const auto gemm_sizes = xb::parse_int_list(args.get("gemm-sizes", "2048,4096"), "gemm-sizes");

    const std::string config_list = "," + args.get("configs", "tiny,small,medium") + ",";
    const std::string dtype_list = "," + args.get("dtypes", "fp32,bf16") + ",";
    std::vector<BenchConfig> configs;
    for (const auto& b : bench_configs()) {
      if (config_list.find("," + b.name + ",") != std::string::npos) configs.push_back(b);
    }
    for (size_t start = 1; start < config_list.size();) {  // reject unknown names
      const size_t comma = config_list.find(',', start);
      const std::string item = config_list.substr(start, comma - start);
      bool known = item.empty();
      for (const auto& b : bench_configs()) known = known || b.name == item;
      XF_CHECK(known, "--configs: unknown config '", item, "' (tiny, small, medium)");
      start = comma + 1;
    }
    std::vector<c10::ScalarType> dtypes;
    for (const auto& name : {std::string("fp32"), std::string("bf16")}) {
      if (dtype_list.find("," + name + ",") != std::string::npos)
        dtypes.push_back(xb::parse_dtype(name));
    }
    XF_CHECK(!configs.empty() && !dtypes.empty(), "--configs / --dtypes select nothing");

    c10::InferenceMode guard;
    // The overridable ops as the runner resolves them ("backend": compile -> override -> eager
    // on the CPU backend), or the eager reference ops.
    const std::string kernels = args.get("kernels", "backend");
    XF_CHECK(kernels == "backend" || kernels == "eager",
             "--kernels must be backend or eager, got '", kernels, "'");
    const xfuser::models::KernelTable table =
        kernels == "eager"
            ? xfuser::models::KernelTable::eager()
            : xfuser::models::KernelTable::resolve(xfuser::backends::backend_for("cpu"), false);
    xfuser::models::KernelScope kernel_scope(&table);

    // GEMM peak of each dtype, measured here with bench_gemm's routine.
    std::vector<xb::GemmResult> gemm;
    nlohmann::json gemm_json = nlohmann::json::array();
    for (auto dtype : dtypes) {
      for (int64_t n : gemm_sizes) {
        gemm.push_back(xb::measure_gemm(n, dtype, 5, 20.0));
        gemm_json.push_back(xb::to_json(gemm.back()));
        std::cerr << "gemm " << xb::dtype_name(dtype) << " n=" << n << ": "
                  << gemm.back().flop_per_s / 1e9 << " GFLOP/s\n";
      }
    }

    nlohmann::json runs = nlohmann::json::array();
    for (const auto& b : configs) {
      const FluxConfig cfg = flux_config(b);
      const FluxInputs inputs = make_inputs(cfg, b);
      const int64_t tokens = b.grid * b.grid + b.text_tokens;
      const double flops = forward_flops(cfg, tokens);
      const int reps = reps_override > 0 ? reps_override : b.default_reps;
      for (auto dtype : dtypes) {
        FluxTransformer2DModel model(cfg);
        model.init_random(7, 0.02, dtype);
        // The default attention op, timed: how much of a forward the attention kernel takes.
        double attention_seconds = 0;
        model.set_attention_hook([&attention_seconds](const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v,
                                                      const xfuser::models::AttentionCall& call) {
          const double t0 = xb::now_seconds();
          auto o = xfuser::models::local_attention(q, k, v, call);
          attention_seconds += xb::now_seconds() - t0;
          return o;
        });
        for (int i = 0; i < warmup; ++i) model.forward(inputs);
        attention_seconds = 0;
        std::vector<double> times, cpu_times;
        at::Tensor out;
        for (int i = 0; i < reps; ++i) {
          const double t0 = xb::now_seconds(), c0 = xb::cpu_seconds();
          out = model.forward(inputs);  // [1, N, 64]
          times.push_back(xb::now_seconds() - t0);
          cpu_times.push_back(xb::cpu_seconds() - c0);
        }
        XF_CHECK(out.size(1) == b.grid * b.grid && out.size(2) == cfg.output_dim(),
                 "unexpected output shape ", out.sizes());
        XF_CHECK(at::isfinite(out.to(at::kFloat)).all().item<bool>(),
                 "non-finite output for config ", b.name, " ", xb::dtype_name(dtype));
        const double med = median(times);
        const double flop_per_s = flops / med;
        const double peak = xb::gemm_peak(gemm, dtype);
        // The same ratio in process CPU time (forward and GEMM peak alike): robust to other
        // processes taking the core, not to their cache and memory-bandwidth pressure.
        const double med_cpu = median(cpu_times);
        const double peak_cpu = xb::gemm_peak(gemm, dtype, /*cpu_time=*/true);
        nlohmann::json r = {{"config", b.name},
                            {"dtype", xb::dtype_name(dtype)},
                            {"heads", b.heads},
                            {"hidden", cfg.inner_dim()},
                            {"double_blocks", b.double_blocks},
                            {"single_blocks", b.single_blocks},
                            {"image_tokens", b.grid * b.grid},
                            {"text_tokens", b.text_tokens},
                            {"parameters", model.num_parameters()},
                            {"warmup", warmup},
                            {"reps", reps},
                            {"seconds", times},
                            {"median_seconds", med},
                            {"min_seconds", *std::min_element(times.begin(), times.end())},
                            {"flops", flops},
                            {"gflop_per_s", flop_per_s / 1e9},
                            {"gemm_peak_gflop_per_s", peak / 1e9},
                            {"mfu", flop_per_s / peak},
                            {"cpu_seconds", cpu_times},
                            {"median_cpu_seconds", med_cpu},
                            {"mfu_cpu", flops / med_cpu / peak_cpu},
                            {"attention_seconds_per_forward", attention_seconds / reps},
                            {"attention_fraction",
                             attention_seconds / std::accumulate(times.begin(), times.end(), 0.0)}};
        std::cerr << "flux " << b.name << " " << xb::dtype_name(dtype) << ": " << med * 1e3
                  << " ms median, " << flop_per_s / 1e9 << " GFLOP/s, MFU " << flop_per_s / peak
                  << " (CPU time: " << r["mfu_cpu"].get<double>() << "), attention "
                  << r["attention_fraction"].get<double>() << " of the time\n";
        runs.push_back(r);
      }
    }

    nlohmann::json out = {
        {"benchmark", "flux_forward"},
        {"environment", xb::environment_json(threads, openblas)},
        {"kernels", kernels},
        {"flops_formula", "(double_blocks + single_blocks) * (2*12*D^2*S + 4*S^2*D)"},
        {"gemm", gemm_json},
        {"runs", runs}};
    xb::emit_json(args, out);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_flux: " << e.what() << "\n";
    return 1;
  }
}
