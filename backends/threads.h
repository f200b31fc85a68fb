// Thread configuration of a rank: libtorch's intra-op pool and OpenBLAS (which ignores
// at::set_num_threads and must be told separately).
#pragma once

namespace xfuser {

// The cores this process may run on (its CPU affinity mask: taskset, cgroup cpusets, mpirun's
// binding), at least 1.
int available_cores();

// Threads per rank from OMP_NUM_THREADS's value (null or empty: unset): a positive integer (or
// the first entry of an OpenMP list), capped at `cores` with a warning; unset or not a positive
// number (warned): cores / local_ranks, at least 1.
int threads_per_rank(const char* omp_num_threads, int cores, int local_ranks);

// threads_per_rank(OMP_NUM_THREADS, available_cores(), local_ranks), applied to libtorch and,
// when OpenBLAS provides BLAS, to OpenBLAS. Returns the count applied. Also configures the host
// allocator (backends/memory.h).
int configure_threads(int local_ranks);

}  // namespace xfuser
