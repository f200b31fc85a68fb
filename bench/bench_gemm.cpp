// bench_gemm: the GEMM peak of this machine through libtorch (at::mm) at a given thread count.
//
//   bench_gemm [--threads N] [--sizes 2048,4096] [--dtypes fp32,bf16] [--reps R]
//              [--budget SECONDS] [--out FILE]
//
// For every dtype and size: one warm-up, then up to R timed square matmuls (fewer once the
// timed calls exceed the per-size budget, at least two); reports the best repetition as FLOP/s
// (2 n^3 / seconds) and the peak per dtype (the best size). JSON to --out (else stdout).
#include <iostream>

#include "bench/bench_common.h"

namespace xb = xfuser::bench;

int main(int argc, char** argv) {
  try {
    xb::Args args(argc, argv, {});
    args.check_known({"threads", "sizes", "dtypes", "reps", "budget", "out"});
    const int threads = static_cast<int>(args.get_int("threads", 1));
    const bool openblas = xb::set_threads(threads);
    const auto sizes = xb::parse_int_list(args.get("sizes", "2048,4096"), "sizes");
    const int reps = static_cast<int>(args.get_int("reps", 5));
    const double budget = static_cast<double>(args.get_int("budget", 20));
    XF_CHECK(reps >= 2, "--reps must be >= 2, got ", reps);

    std::vector<c10::ScalarType> dtypes;
    for (const auto& name : {std::string("fp32"), std::string("bf16")}) {
      const std::string list = "," + args.get("dtypes", "fp32,bf16") + ",";
      if (list.find("," + name + ",") != std::string::npos) dtypes.push_back(xb::parse_dtype(name));
    }
    XF_CHECK(!dtypes.empty(), "--dtypes selects nothing (use fp32, bf16 or fp32,bf16)");

    std::vector<xb::GemmResult> results;
    nlohmann::json runs = nlohmann::json::array();
    for (auto dtype : dtypes) {
      for (int64_t n : sizes) {
        auto r = xb::measure_gemm(n, dtype, reps, budget);
        std::cerr << "gemm " << xb::dtype_name(dtype) << " n=" << n << ": " << r.flop_per_s / 1e9
                  << " GFLOP/s (best of " << r.reps << ", " << r.best_seconds << " s)\n";
        results.push_back(r);
        runs.push_back(xb::to_json(r));
      }
    }
    nlohmann::json peak = nlohmann::json::object();
    for (auto dtype : dtypes) peak[xb::dtype_name(dtype)] = xb::gemm_peak(results, dtype) / 1e9;

    nlohmann::json out = {{"benchmark", "gemm"},
                          {"environment", xb::environment_json(threads, openblas)},
                          {"runs", runs},
                          {"peak_gflop_per_s", peak}};
    xb::emit_json(args, out);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_gemm: " << e.what() << "\n";
    return 1;
  }
}
