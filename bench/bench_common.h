// Shared pieces of the benchmark programs (header-only: every bench/*.cpp is its own executable).
//   - command-line parsing of `--name value` flags,
//   - thread setup (libtorch's intra-op pool and OpenBLAS),
//   - the GEMM peak routine that bench_gemm reports and bench_flux divides by (MFU).
#pragma once

#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "backends/dtype.h"
#include "backends/error.h"
#include "backends/memory.h"

namespace xfuser::bench {

// `--name value` flags (and bare `--name` switches, stored as "1").
class Args {
 public:
  Args(int argc, char** argv, const std::vector<std::string>& switches) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      XF_CHECK(a.rfind("--", 0) == 0, "unexpected argument '", a, "' (flags are --name value)");
      const std::string name = a.substr(2);
      if (std::find(switches.begin(), switches.end(), name) != switches.end()) {
        values_[name] = "1";
        continue;
      }
      XF_CHECK(i + 1 < argc, "flag --", name, " needs a value");
      values_[name] = argv[++i];
    }
  }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback) const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }
  int64_t get_int(const std::string& name, int64_t fallback) const {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    try {
      size_t used = 0;
      const int64_t v = std::stoll(it->second, &used);
      XF_CHECK(used == it->second.size(), "trailing characters");
      return v;
    } catch (const std::exception&) {
      XF_THROW("flag --", name, " expects an integer, got '", it->second, "'");
    }
  }
  // Rejects flags outside `known` (typos must not silently fall back to defaults).
  void check_known(const std::vector<std::string>& known) const {
    for (const auto& [name, value] : values_) {
      XF_CHECK(std::find(known.begin(), known.end(), name) != known.end(), "unknown flag --", name);
    }
  }

 private:
  std::map<std::string, std::string> values_;
};

// Applies `threads` to libtorch (at::set_num_threads) and, when OpenBLAS provides BLAS, to
// OpenBLAS (which ignores libtorch's setting; OPENBLAS_NUM_THREADS is only read at load time).
// Returns whether OpenBLAS was found.
inline bool set_threads(int threads) {
  XF_CHECK(threads >= 1, "--threads must be >= 1, got ", threads);
  xfuser::configure_host_allocator();  // as every rank does (backends/threads.cpp)
  at::set_num_threads(threads);
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
    return true;
  }
  return false;
}

inline double now_seconds() {
  using Clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// CPU time of the whole process (every thread). With one thread per rank it is the compute
// time, and unlike wall time it does not grow while other processes hold the core.
inline double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

using xfuser::backends::dtype_name;  // fp32, bf16, fp16 in the JSON results

inline c10::ScalarType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32") return at::kFloat;
  if (s == "bf16" || s == "bfloat16") return at::kBFloat16;
  XF_THROW("unknown dtype '", s, "' (expected fp32 or bf16)");
}

// One square GEMM measurement: C[n, n] = A[n, n] @ B[n, n] in `dtype`, 2 n^3 FLOP.
struct GemmResult {
  int64_t n = 0;
  c10::ScalarType dtype = at::kFloat;
  int reps = 0;                 // timed repetitions actually run
  double best_seconds = 0;      // fastest repetition
  double flops = 0;             // 2 n^3
  double flop_per_s = 0;        // flops / best_seconds
  double best_cpu_seconds = 0;  // fastest repetition in process CPU time
  double flop_per_cpu_s = 0;    // flops / best_cpu_seconds
};

// Warm-up (one call), then up to `reps` timed calls; stops early once `budget_seconds` of timed
// calls have passed (after at least two). The best repetition is the peak estimate.
inline GemmResult measure_gemm(int64_t n, c10::ScalarType dtype, int reps, double budget_seconds) {
  c10::InferenceMode guard;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234);
  auto a = at::empty({n, n}, at::kFloat).normal_(0.0, 1.0, gen).to(dtype);  // [n, n]
  auto b = at::empty({n, n}, at::kFloat).normal_(0.0, 1.0, gen).to(dtype);  // [n, n]
  auto c = at::empty({n, n}, a.options());                                  // [n, n]
  at::mm_out(c, a, b);                                                      // warm-up
  GemmResult r;
  r.n = n;
  r.dtype = dtype;
  r.flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  r.best_seconds = 1e300;
  r.best_cpu_seconds = 1e300;
  double spent = 0;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_seconds(), c0 = cpu_seconds();
    at::mm_out(c, a, b);
    const double dt = now_seconds() - t0;
    r.best_cpu_seconds = std::min(r.best_cpu_seconds, cpu_seconds() - c0);
    r.best_seconds = std::min(r.best_seconds, dt);
    spent += dt;
    ++r.reps;
    if (r.reps >= 2 && spent > budget_seconds) break;
  }
  r.flop_per_s = r.flops / r.best_seconds;
  r.flop_per_cpu_s = r.flops / r.best_cpu_seconds;
  return r;
}

// The peak of a dtype: the best FLOP/s over the sizes measured (wall or CPU time).
inline double gemm_peak(const std::vector<GemmResult>& results, c10::ScalarType dtype,
                        bool cpu_time = false) {
  double peak = 0;
  for (const auto& r : results) {
    if (r.dtype == dtype) peak = std::max(peak, cpu_time ? r.flop_per_cpu_s : r.flop_per_s);
  }
  return peak;
}

inline nlohmann::json to_json(const GemmResult& r) {
  return {{"n", r.n},
          {"dtype", dtype_name(r.dtype)},
          {"reps", r.reps},
          {"best_seconds", r.best_seconds},
          {"flops", r.flops},
          {"gflop_per_s", r.flop_per_s / 1e9},
          {"best_cpu_seconds", r.best_cpu_seconds},
          {"gflop_per_cpu_s", r.flop_per_cpu_s / 1e9}};
}

inline std::vector<int64_t> parse_int_list(const std::string& s, const std::string& flag) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string item =
        s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    try {
      size_t used = 0;
      out.push_back(std::stoll(item, &used));
      XF_CHECK(used == item.size() && out.back() > 0, "bad item");
    } catch (const std::exception&) {
      XF_THROW("flag --", flag, " expects a comma-separated list of positive integers, got '", s,
               "'");
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Machine and library facts recorded with every result.
inline nlohmann::json environment_json(int threads, bool openblas) {
  return {
      {"threads", threads},
      {"at_num_threads", at::get_num_threads()},
      {"openblas_found", openblas},
      {"hardware_concurrency", std::thread::hardware_concurrency()},
      {"omp_num_threads_env", std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : ""},
      {"torch_parallel_info", at::get_parallel_info()}};
}

// `flag` names the option the path came from, for the error.
inline void write_json(const std::string& path, const nlohmann::json& j,
                       const char* flag = "--out") {
  std::ofstream f(path);
  XF_CHECK(f.good(), "cannot open ", flag, " file '", path, "' for writing");
  f << j.dump(2) << "\n";
  XF_CHECK(f.good(), "failed writing '", path, "'");
}

// The result to --out FILE when given, else to stdout.
inline void emit_json(const Args& args, const nlohmann::json& j) {
  if (args.has("out")) {
    write_json(args.get("out", ""), j);
  } else {
    std::cout << j.dump(2) << "\n";
  }
}

}  // namespace xfuser::bench
