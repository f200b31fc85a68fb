// Step caching on the trained tiny-shapes model, where a change in the pictures means something:
// for each number of steps, the uncached run over held-out scenes, then every cache method at a
// few settings, each with
//   - the held-out pass rate (examples/tiny_shapes/scene_check.h, the project's scene checker),
//   - PSNR and the largest pixel difference against the uncached pictures of the same seeds,
//   - transformer evaluations computed and skipped, and the denoising time against uncached
//     (measured in this run, one thread).
//
//   bench_cache_quality [--out FILE] [--scenes16 N] [--scenes50 N] [--dtype fp32|bf16]
//                       [--heldout examples/tiny_shapes/heldout.json]
//
// Run from the source folder.
// Default FILE: bench/results/cache_quality.json; 300 scenes at 16 steps (the model's default)
// and 100 at 50. docs/caching.md quotes the results.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/dtype.h"
#include "bench/bench_common.h"
#include "examples/tiny_shapes/scene_check.h"
#include "models/flux/tiny_flux.h"
#include "models/registry.h"
#include "models/xfuser_model.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using xfuser::models::CacheMethod;
using xfuser::models::StepCacheConfig;

struct Setting {
  std::string label;
  StepCacheConfig cache;
};

std::vector<Setting> settings() {
  std::vector<Setting> out;
  for (double t : {0.05, 0.1, 0.2}) {
    Setting s;
    s.cache.method = CacheMethod::kFirstBlock;
    s.cache.threshold = t;
    s.label = "fbcache threshold=" + std::to_string(t).substr(0, 4);
    out.push_back(s);
  }
  for (double t : {0.06, 0.12, 0.24}) {
    Setting s;
    s.cache.method = CacheMethod::kMagCache;
    s.cache.threshold = t;
    s.label = "magcache threshold=" + std::to_string(t).substr(0, 4);
    out.push_back(s);
  }
  for (double t : {0.25, 0.4, 0.6}) {  // TeaCache4FLUX's README: 1.5x, 1.8x, 2x on FLUX.1-dev
    Setting s;
    s.cache.method = CacheMethod::kTeaCache;
    s.cache.threshold = t;
    s.label = "teacache threshold=" + std::to_string(t).substr(0, 4);
    out.push_back(s);
  }
  for (auto [interval, order] : {std::pair{2, 1}, {3, 1}, {5, 1}, {3, 2}}) {
    Setting s;
    s.cache.method = CacheMethod::kTaylorSeer;
    s.cache.cache_interval = interval;
    s.cache.max_order = order;
    s.label = "taylorseer cache_interval=" + std::to_string(interval) +
              " max_order=" + std::to_string(order);
    out.push_back(s);
  }
  return out;
}

struct Run {
  std::vector<at::Tensor> images;  // uint8 [H, W, 3] per scene
  int passed = 0;
  int computed = 0;
  int skipped = 0;
  double denoise_seconds = 0.0;
};

Run generate(const fs::path& folder, const json& held, const json& scenes, int steps,
             c10::ScalarType dtype, const StepCacheConfig& cache) {
  using namespace xfuser::models;
  const auto& spec = ModelRegistry::for_pipeline_folder(folder);
  auto model = spec.create(spec);
  ModelLoadOptions options;
  options.dtype = dtype;
  options.cache = cache;
  model->load(folder, options);
  Run run;
  const int count = static_cast<int>(scenes.size());
  const int batch = 8;
  for (int start = 0; start < count; start += batch) {
    const GenerationRequest r = xfuser::examples::tiny_shapes::scene_request(
        scenes, start, std::min(count, start + batch), held, steps);
    const auto out = model->generate(r);
    for (const auto& t : out.timings) {
      if (t.name == "denoise_step") run.denoise_seconds += t.seconds;
    }
    run.computed += out.cache.computed;
    run.skipped += out.cache.skipped;
    for (size_t b = 0; b < r.prompts.size(); ++b) {
      const at::Tensor img = out.images[static_cast<int64_t>(b)].clone();
      run.passed += xfuser::examples::tiny_shapes::check_picture(
                        img, scenes[start + static_cast<int>(b)], held)
                        .pass;
      run.images.push_back(img);
    }
  }
  return run;
}

// PSNR (dB) of `a` against `b` over all pictures (+inf when identical), and the largest
// difference of one channel value.
std::pair<double, int> psnr(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double se = 0.0;
  int64_t n = 0;
  int largest = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    at::Tensor d = a[i].to(at::kDouble) - b[i].to(at::kDouble);
    se += d.pow(2).sum().item<double>();
    n += d.numel();
    largest = std::max(largest, static_cast<int>(d.abs().max().item<double>()));
  }
  const double mse = se / static_cast<double>(n);
  return {mse == 0.0 ? INFINITY : 10.0 * std::log10(255.0 * 255.0 / mse), largest};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    xfuser::bench::Args args(argc, argv, {});
    args.check_known({"out", "scenes16", "scenes50", "dtype", "heldout"});
    xfuser::bench::set_threads(1);
    const fs::path out_path = args.get("out", "bench/results/cache_quality.json");
    const c10::ScalarType dtype = xfuser::backends::parse_dtype(args.get("dtype", "fp32"));
    const fs::path folder = xfuser::models::flux::tiny_shapes_dir();
    const fs::path heldout = args.get("heldout", "examples/tiny_shapes/heldout.json");
    std::ifstream in(heldout);
    XF_CHECK(in.good(), heldout.string(),
             " not found (run from the source folder, or give "
             "--heldout)");
    const json held = json::parse(in);
    json results = json::array();
    for (auto [steps, count] : {std::pair{16, static_cast<int>(args.get_int("scenes16", 300))},
                                {50, static_cast<int>(args.get_int("scenes50", 100))}}) {
      if (count <= 0) continue;
      const json scenes = xfuser::examples::tiny_shapes::spread_scenes(held, count);
      const Run base = generate(folder, held, scenes, steps, dtype, {});
      std::printf("%d steps, %d scenes: uncached %.1f%% pass, denoise %.2f s\n", steps, count,
                  100.0 * base.passed / count, base.denoise_seconds);
      json row = {{"steps", steps},
                  {"scenes", count},
                  {"uncached",
                   {{"pass_rate", static_cast<double>(base.passed) / count},
                    {"denoise_seconds", base.denoise_seconds}}},
                  {"cached", json::array()}};
      for (const Setting& s : settings()) {
        const Run run = generate(folder, held, scenes, steps, dtype, s.cache);
        const auto [db, largest] = psnr(run.images, base.images);
        const double speedup = base.denoise_seconds / run.denoise_seconds;
        std::printf("  %-44s %5.1f%% pass (%+.1f), PSNR %6.2f dB, skipped %d of %d, %.2fx\n",
                    s.label.c_str(), 100.0 * run.passed / count,
                    100.0 * (run.passed - base.passed) / count, db, run.skipped,
                    run.computed + run.skipped, speedup);
        row["cached"].push_back(
            {{"setting", s.label},
             {"pass_rate", static_cast<double>(run.passed) / count},
             {"pass_rate_change_points", 100.0 * (run.passed - base.passed) / count},
             {"psnr_db", std::isfinite(db) ? json(db) : json()},
             {"max_pixel_diff", largest},
             {"computed", run.computed},
             {"skipped", run.skipped},
             {"denoise_seconds", run.denoise_seconds},
             {"denoise_speedup", speedup}});
      }
      results.push_back(row);
    }
    json report = {{"benchmark", "cache_quality"},
                   {"model", "tiny-shapes"},
                   {"dtype", xfuser::backends::dtype_name(dtype)},
                   {"threads", 1},
                   {"results", results}};
    fs::create_directories(out_path.parent_path().empty() ? "." : out_path.parent_path());
    std::ofstream(out_path) << report.dump(2) << "\n";
    std::printf("wrote %s\n", out_path.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cache_quality: %s\n", e.what());
    return 1;
  }
}
