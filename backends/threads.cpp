#include "backends/threads.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <thread>

#include <ATen/Parallel.h>

#include "backends/memory.h"

namespace xfuser {

int configure_threads(int local_ranks) {
  configure_host_allocator();
  int threads = 0;
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env && *env) threads = std::atoi(env);
  if (threads <= 0) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    threads = std::max(1, (cores > 0 ? cores : 1) / std::max(1, local_ranks));
  }
  at::set_num_threads(threads);
  // OpenBLAS reads OPENBLAS_NUM_THREADS only when it loads; set it at run time through its API.
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(threads);
  }
  return threads;
}

}  // namespace xfuser
