// Host memory of a rank: the allocator settings a diffusion run wants, and what its tensors hold.
#pragma once

#include <cstdint>

namespace xfuser {

// Keeps freed activation memory in the process instead of returning it to the kernel after
// every op: glibc malloc's mmap threshold fixed at its maximum (32 MiB on 64-bit), no trimming
// of the heap top, 64 MiB of top padding. Without it a forward pass page-faults and zero-fills
// its activations again on every call (measured: half the page faults and ~15% of the CPU time
// of a small FLUX forward, bench/). The cost is that the resident size stays at its peak, as
// with any caching allocator. Returns false when the allocator is not glibc's (nothing done).
// Idempotent; XFUSER_DEFAULT_MALLOC=1 leaves the allocator alone.
bool configure_host_allocator();

// Bytes host tensors hold: every CPU tensor libtorch allocates goes through a counting CPU
// allocator (installed by track_host_tensor_memory(); 64-byte aligned blocks from the C heap, as
// libtorch's own), so that a run can say what its tensors held at the peak, as a GPU's caching
// allocator reports allocated bytes.
// Tensors that alias memory they do not own (a memory-mapped checkpoint's weights) are not
// counted; XFuserModel::parameter_bytes() counts the weights whole.
struct HostTensorMemory {
  bool tracked = false;  // false before track_host_tensor_memory() (both counts 0)
  int64_t allocated = 0;
  int64_t peak = 0;  // since the process started or the last reset_host_tensor_peak()
};
// Installs the wrapper (once; later calls do nothing). Call before tensors are made: a tensor
// allocated before is never counted, and its free is not subtracted either.
void track_host_tensor_memory();
HostTensorMemory host_tensor_memory();
// Sets the peak to what is allocated now.
void reset_host_tensor_peak();

}  // namespace xfuser
