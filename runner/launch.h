// The process-group mesh of a job from its flags, shared by every program that runs a model
// over the ranks of an mpirun job (xfuser-run, xfuser serve).
#pragma once

#include <memory>

#include "runner/run_config.h"

namespace xfuser::parallel {
class MpiEnvironment;
class ProcessGroups;
}  // namespace xfuser::parallel

namespace xfuser::runner {

// Selects --device (before any CUDA or NCCL call: --device cuda on a host without one is an error
// on every rank), checks that the degrees multiply to the world size (the error names every
// degree), and on more than one rank builds the world communicator (--comm_backend, every
// collective bounded by --comm_timeout) and the groups of the degrees. Null on one rank.
std::shared_ptr<parallel::ProcessGroups> make_process_groups(const RunConfig& config,
                                                             const parallel::MpiEnvironment& mpi);

}  // namespace xfuser::runner
