// Host memory of a rank: the allocator settings a diffusion run wants.
#pragma once

namespace xfuser {

// Keeps freed activation memory in the process instead of returning it to the kernel after
// every op: glibc malloc's mmap threshold fixed at its maximum (32 MiB on 64-bit), no trimming
// of the heap top, 64 MiB of top padding. Without it a forward pass page-faults and zero-fills
// its activations again on every call (measured: half the page faults and ~15% of the CPU time
// of a small FLUX forward, bench/). The cost is that the resident size stays at its peak, as
// with any caching allocator. Returns false when the allocator is not glibc's (nothing done).
// Idempotent; XFUSER_DEFAULT_MALLOC=1 leaves the allocator alone.
bool configure_host_allocator();

}  // namespace xfuser
