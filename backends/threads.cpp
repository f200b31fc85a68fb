#include "backends/threads.h"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>

#include "backends/memory.h"

namespace xfuser {

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return cores > 0 ? cores : 1;
}

int threads_per_rank(const char* omp_num_threads, int cores, int local_ranks) {
  const int fair = std::max(1, cores / std::max(1, local_ranks));
  if (omp_num_threads == nullptr || *omp_num_threads == '\0') return fair;
  // OpenMP's syntax: a positive integer, or a list ("4,2") whose first entry counts here.
  char* end = nullptr;
  const long asked = std::strtol(omp_num_threads, &end, 10);
  if (end == omp_num_threads || asked <= 0 || (*end != '\0' && *end != ',')) {
    spdlog::warn("OMP_NUM_THREADS='{}' is not a positive number of threads; using {}",
                 omp_num_threads, fair);
    return fair;
  }
  // More threads than cores only costs (each GEMM waits for its slowest thread), and libtorch
  // creates its pool with the count given: 100000 threads take minutes and ignore SIGTERM.
  if (asked > cores) {
    spdlog::warn("OMP_NUM_THREADS={} exceeds the {} core(s) this process may use; using {}",
                 omp_num_threads, cores, cores);
    return cores;
  }
  return static_cast<int>(asked);
}

int configure_threads(int local_ranks) {
  configure_host_allocator();
  const int threads =
      threads_per_rank(std::getenv("OMP_NUM_THREADS"), available_cores(), local_ranks);
  at::set_num_threads(threads);
  // OpenBLAS reads OPENBLAS_NUM_THREADS only when it loads; set it at run time through its API.
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
  }
  return threads;
}

}  // namespace xfuser
