// Thread configuration of a rank: libtorch's intra-op pool and OpenBLAS (which ignores
// at::set_num_threads and must be told separately).
#pragma once

namespace xfuser {

// Threads per rank: OMP_NUM_THREADS when the user set it, else hardware cores / local_ranks
// (at least 1). Applied to libtorch and, when OpenBLAS provides BLAS, to OpenBLAS.
// Returns the count applied. Also configures the host allocator (backends/memory.h).
int configure_threads(int local_ranks);

}  // namespace xfuser
