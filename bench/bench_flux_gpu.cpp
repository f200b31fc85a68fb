// The FLUX.1-dev transformer at full size on one device: ms per denoising step and s per 28-step
// image (transformer forwards only), MFU against the GEMM peak measured in the same run.
//   bench_flux_gpu [--device cuda|cpu] [--dtype bf16|fp16|fp32] [--height 1024] [--width 1024]
//                  [--text-tokens 512] [--heads 24] [--double-blocks 19] [--single-blocks 38]
//                  [--steps 28] [--reps 10] [--warmup 3] [--gemm-size 8192] [--seed 0]
//                  [--attention auto|flash|efficient|cudnn|chunked] [--compare-attention 0|1]
//                  [--fp8 0|1] [--kernels FILE] [--out FILE]
// The weights are seeded random values made on the device (no checkpoint: FLUX.1-dev is 24 GB),
// N(0, 0.02) per tensor. The image is 1024x1024 -> a 128x128 latent -> 64x64 = 4096 tokens of
// 2x2 patches (in_channels 64), plus 512 text tokens. Smaller --heads / blocks / sizes run the
// same code on a CPU (a smoke test of the program). bench/gpu_flux.sh runs it beside diffusers'
// FluxTransformer2DModel, eager and under torch.compile (bench/flux_gpu_diffusers.py).
// --attention picks the attention kernel (default auto: the one PyTorch's SDPA picks, as diffusers
// runs); the JSON counts the calls per kernel that ran. --compare-attention (default 1 on CUDA)
// also times the step with each fused kernel this libtorch has, in the same run. --fp8 1 runs the
// blocks' Linear layers as FP8 GEMMs, as --use_fp8_gemms does (e4m3 weights with per-channel
// scales, per-token activation scales; bf16 only): the JSON names the GEMM path the layers take
// (scaled_mm on a GPU of compute capability >= 9 with libtorch >= 2.5, else emulated).
// --kernels FILE writes the device kernels of one profiled forward (name, calls, microseconds;
// kineto, libtorch 2.x), as bench/flux_gpu_diffusers.py --kernels does for diffusers.
#include <algorithm>
#include <map>
#include <numeric>

#include "backends/attention.h"
#include "backends/device.h"
#include "backends/dtype.h"
#include "backends/fp8.h"
#include "bench/bench_common.h"
#include "bench/bench_flux_configs.h"
#include "models/common/kernels.h"
#include "models/dit/dit_parallel.h"
#include "models/flux/flux_transformer.h"
#include "profiling/trace.h"

namespace xb = xfuser::bench;
using xfuser::models::flux::FluxConfig;
using xfuser::models::flux::FluxInputs;
using xfuser::models::flux::FluxTransformer2DModel;

namespace {

// Seconds of `fn` on `device`, the device synchronised before and after.
template <typename F>
double timed(const at::Device& device, F&& fn) {
  xfuser::backends::synchronize_device(device);
  const double t0 = xb::now_seconds();
  fn();
  xfuser::backends::synchronize_device(device);
  return xb::now_seconds() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    xb::Args args(argc, argv, {});
    args.check_known({"device", "dtype", "height", "width", "text-tokens", "heads", "double-blocks",
                      "single-blocks", "steps", "reps", "warmup", "gemm-size", "seed", "threads",
                      "attention", "compare-attention", "fp8", "kernels", "out"});
    const std::string device_name = args.get("device", "cuda");
    const at::Device device = xfuser::backends::select_device(device_name);
    const c10::ScalarType dtype = xfuser::backends::parse_dtype(args.get("dtype", "bf16"));
    const int64_t height = args.get_int("height", 1024), width = args.get_int("width", 1024);
    XF_CHECK(height > 0 && width > 0 && height % 16 == 0 && width % 16 == 0,
             "--height and --width must be positive multiples of 16");
    const int64_t text_tokens = args.get_int("text-tokens", 512);
    const int steps = static_cast<int>(args.get_int("steps", 28));
    const int reps = static_cast<int>(args.get_int("reps", 10));
    const int warmup = static_cast<int>(args.get_int("warmup", 3));
    XF_CHECK(reps >= 1 && warmup >= 0 && steps >= 1 && text_tokens >= 1,
             "--reps, --steps and --text-tokens must be >= 1, --warmup >= 0");
    const bool openblas = xb::set_threads(static_cast<int>(args.get_int("threads", 1)));
    namespace xbk = xfuser::backends;
    const xbk::AttentionKernel attention_kernel =
        xbk::parse_attention_kernel(args.get("attention", "auto"), "--attention");
    xbk::check_attention_kernel_runs(attention_kernel, device, "--attention");
    xbk::set_default_attention_kernel(attention_kernel);
    const bool compare_attention = args.get_int("compare-attention", device.is_cuda() ? 1 : 0) != 0;
    const bool fp8 = args.get_int("fp8", 0) != 0;
    XF_CHECK(!fp8 || dtype == at::kBFloat16, "--fp8 1 needs --dtype bf16 (the FP8 GEMMs' output)");
    c10::InferenceMode guard;

    FluxConfig cfg;  // FLUX.1-dev's transformer/config.json
    cfg.patch_size = 1;
    cfg.in_channels = 64;
    cfg.num_layers = args.get_int("double-blocks", 19);
    cfg.num_single_layers = args.get_int("single-blocks", 38);
    cfg.attention_head_dim = 128;
    cfg.num_attention_heads = args.get_int("heads", 24);
    cfg.joint_attention_dim = 4096;
    cfg.pooled_projection_dim = 768;
    cfg.guidance_embeds = true;
    cfg.axes_dims_rope = {16, 56, 56};
    cfg.validate("bench_flux_gpu");
    const int64_t gh = height / 16, gw = width / 16, n = gh * gw;

    // Weights: seeded N(0, 0.02) made on the device.
    at::manual_seed(static_cast<uint64_t>(args.get_int("seed", 0)));
    FluxTransformer2DModel model(cfg);
    const double t_init = timed(device, [&] {
      for (auto& [name, slot] : model.named_parameters()) {
        slot->tensor = at::empty(slot->shape, at::TensorOptions().dtype(dtype).device(device))
                           .normal_(0.0, 0.02);
      }
    });
    int fp8_layers = 0;
    if (fp8) {
      xfuser::models::WeightFormat scaled;
      scaled.kind = xfuser::models::WeightFormat::Kind::kFp8Scaled;
      scaled.format = xfuser::backends::Fp8Format::kE4M3FN;
      fp8_layers = model.apply_weight_format(xfuser::models::dit::dit_weight_format(model, scaled));
      XF_CHECK(fp8_layers > 0, "--fp8 1 quantized no layer");
    }
    const std::string gemm_path =
        fp8 ? xfuser::backends::fp8_linear_path(device, xfuser::backends::Fp8Format::kE4M3FN, dtype,
                                                cfg.inner_dim(), cfg.inner_dim())
            : std::string("dense");
    // Device-generic ops: the CPU's hand-written kernels are not used on a GPU.
    xfuser::models::KernelScope kernels(&xfuser::models::KernelTable::eager());

    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    FluxInputs in;
    in.hidden_states = at::randn({1, n, cfg.in_channels}, f32);
    in.encoder_hidden_states = at::randn({1, text_tokens, cfg.joint_attention_dim}, f32);
    in.pooled_projections = at::randn({1, cfg.pooled_projection_dim}, f32);
    in.timestep = at::full({1}, 0.5, f32);
    in.guidance = at::full({1}, 3.5, f32);
    auto rows = at::arange(gh, f32).repeat_interleave(gw);
    auto cols = at::arange(gw, f32).repeat({gh});
    in.img_ids = at::stack({at::zeros({n}, f32), rows, cols}, 1);  // [N, 3]
    in.txt_ids = at::zeros({text_tokens, 3}, f32);                 // [L, 3]

    at::Tensor out;
    for (int i = 0; i < warmup; ++i) out = model.forward(in);
    std::vector<double> times;
    xbk::reset_attention_kernel_calls();
    for (int i = 0; i < reps; ++i) times.push_back(timed(device, [&] { out = model.forward(in); }));
    const auto attention_calls = xbk::attention_kernel_calls();
    XF_CHECK(out.size(1) == n && at::isfinite(out.to(at::kFloat)).all().item<bool>(),
             "the forward gave ", out.sizes(), " or non-finite values");
    const double med = xb::median(times);

    const std::string kernels_file = args.get("kernels", "");
    if (!kernels_file.empty()) {
      auto& recorder = xfuser::profiling::TraceRecorder::instance();
      XF_CHECK(xfuser::profiling::TraceRecorder::torch_ops_available(),
               "--kernels needs libtorch's profiler (", recorder.torch_ops_profiler(), ")");
      xfuser::backends::synchronize_device(device);
      xfuser::profiling::TraceOptions options;
      options.torch_ops = true;
      recorder.start(options);
      out = model.forward(in);
      xfuser::backends::synchronize_device(device);
      recorder.stop();
      std::map<std::string, std::pair<int64_t, int64_t>> by_name;  // calls, microseconds
      int64_t total_us = 0, calls = 0;
      for (const auto& e : recorder.events()) {
        if (e.category != "gpu") continue;
        auto& [n, us] = by_name[e.name];
        ++n;
        us += e.dur_us;
        total_us += e.dur_us;
        ++calls;
      }
      recorder.clear();
      std::vector<nlohmann::json> rows;
      for (const auto& [name, k] : by_name) {
        rows.push_back({{"name", name}, {"calls", k.first}, {"us", k.second}});
      }
      std::sort(rows.begin(), rows.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
        return a["us"].get<int64_t>() > b["us"].get<int64_t>();
      });
      xb::write_json(
          kernels_file,
          {{"engine", "xfuser"}, {"total_us", total_us}, {"calls", calls}, {"kernels", rows}},
          "--kernels");
    }
    const double flops = xb::forward_flops(cfg, n + text_tokens);

    // The same step with each fused kernel (a preference: a call a kernel cannot take runs the
    // automatic choice; the counts say what ran).
    nlohmann::json by_kernel = nlohmann::json::object();
    if (compare_attention) {
      for (xbk::AttentionKernel k : {xbk::AttentionKernel::flash, xbk::AttentionKernel::efficient,
                                     xbk::AttentionKernel::cudnn}) {
        try {
          xbk::check_attention_kernel_runs(k, device, "--attention");
        } catch (const xfuser::Error&) {
          continue;  // not in this libtorch
        }
        xbk::set_default_attention_kernel(k);
        out = model.forward(in);
        std::vector<double> kt;
        xbk::reset_attention_kernel_calls();
        for (int i = 0; i < reps; ++i)
          kt.push_back(timed(device, [&] { out = model.forward(in); }));
        by_kernel[xbk::attention_kernel_name(k)] = {{"ms_per_step", xb::median(kt) * 1e3},
                                                    {"calls", xbk::attention_kernel_calls()}};
      }
      xbk::set_default_attention_kernel(attention_kernel);
    }

    // The GEMM peak of this device and dtype, measured now: the best of square products.
    const int64_t g = args.get_int("gemm-size", device.is_cuda() ? 8192 : 1024);
    const auto gopts = at::TensorOptions().dtype(dtype).device(device);
    at::Tensor a = at::randn({g, g}, gopts), b = at::randn({g, g}, gopts),
               c = at::empty({g, g}, gopts);
    at::mm_out(c, a, b);
    double best = 1e300;
    for (int i = 0; i < 10; ++i) best = std::min(best, timed(device, [&] { at::mm_out(c, a, b); }));
    const double peak = 2.0 * static_cast<double>(g) * g * g / best;

    const auto mem = xfuser::backends::device_memory_stats(device);
    nlohmann::json result = {
        {"benchmark", "flux_dev_transformer"},
        {"engine", "xfuser"},
        {"device", device.str()},
        {"dtype", args.get("dtype", "bf16")},
        {"height", height},
        {"width", width},
        {"image_tokens", n},
        {"text_tokens", text_tokens},
        {"heads", cfg.num_attention_heads},
        {"double_blocks", cfg.num_layers},
        {"single_blocks", cfg.num_single_layers},
        {"parameters", model.num_parameters()},
        {"parameter_bytes", model.parameter_bytes()},
        {"fp8_gemms", fp8},
        {"fp8_layers", fp8_layers},
        {"gemm_path", gemm_path},
        {"init_seconds", t_init},
        {"warmup", warmup},
        {"seconds", times},
        {"ms_per_step", med * 1e3},
        {"min_ms_per_step", *std::min_element(times.begin(), times.end()) * 1e3},
        {"steps", steps},
        {"s_per_image_transformer", med * steps},
        {"flops_per_step", flops},
        {"tflop_per_s", flops / med / 1e12},
        {"gemm_size", g},
        {"gemm_peak_tflop_per_s", peak / 1e12},
        {"mfu", flops / med / peak},
        {"attention", xbk::attention_kernel_name(attention_kernel)},
        {"attention_kernel_calls", attention_calls},
        {"by_attention_kernel", by_kernel},
        {"device_peak_allocated_bytes", mem.available ? mem.peak_allocated : 0},
        {"environment",
         xb::environment_json(static_cast<int>(args.get_int("threads", 1)), openblas)}};
    std::cerr << "xfuser flux-dev " << device.str() << " " << args.get("dtype", "bf16")
              << (fp8 ? " fp8 GEMMs (" + gemm_path + ")" : std::string()) << ": " << med * 1e3
              << " ms/step, " << med * steps << " s per " << steps << "-step image, MFU "
              << flops / med / peak << " (GEMM peak " << peak / 1e12 << " TFLOP/s)\n";
    xb::emit_json(args, result);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_flux_gpu: " << e.what() << "\n";
    return 1;
  }
}
