#include "backends/memory.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace xfuser {

bool configure_host_allocator() {
  if (const char* env = std::getenv("XFUSER_DEFAULT_MALLOC"); env && std::strcmp(env, "1") == 0) {
    return false;
  }
#if defined(__GLIBC__)
  // M_MMAP_THRESHOLD above HEAP_MAX/2 (32 MiB on 64-bit) is rejected by glibc.
  const bool ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 &&
                  mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1 && mallopt(M_TOP_PAD, 64 << 20) == 1;
  return ok;
#else
  return false;
#endif
}

}  // namespace xfuser
