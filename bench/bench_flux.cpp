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
#include "bench/bench_flux_configs.h"
#include "models/common/kernels.h"
#include "models/flux/flux_transformer.h"

namespace xb = xfuser::bench;
using xb::BenchConfig;
using xb::median;
using xfuser::models::flux::FluxConfig;
using xfuser::models::flux::FluxInputs;
using xfuser::models::flux::FluxTransformer2DModel;

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

    const std::vector<BenchConfig> configs =
        xb::select_configs(args.get("configs", "tiny,small,medium"), "configs");
    const std::vector<c10::ScalarType> dtypes =
        xb::select_dtypes(args.get("dtypes", "fp32,bf16"), "dtypes");

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
      const FluxConfig cfg = xb::flux_config(b);
      const FluxInputs inputs = xb::make_inputs(cfg, b);
      const int64_t tokens = b.grid * b.grid + b.text_tokens;
      const double flops = xb::forward_flops(cfg, tokens);
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
