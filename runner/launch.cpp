#include "runner/launch.h"

#include <chrono>

#include "backends/device.h"
#include "backends/error.h"
#include "parallel/mpi_env.h"
#include "parallel/process_groups.h"
#include "parallel/two_plane_communicator.h"
#include "parallel/world_config.h"

namespace xfuser::runner {

std::shared_ptr<parallel::ProcessGroups> make_process_groups(const RunConfig& config,
                                                             const parallel::MpiEnvironment& mpi) {
  const c10::Device device = backends::select_device(config.device);
  XF_CHECK(config.comm_backend != "nccl" || device.is_cuda(),
           "--comm_backend nccl needs --device cuda (this run is on ", device.str(),
           "; NCCL moves CUDA tensors only)");
  const auto world_config = parallel::WorldConfig::from_degrees(
      mpi.size(), config.data_parallel_degree, config.use_cfg_parallel ? 2 : 1,
      config.pipefusion_parallel_degree, config.ulysses_degree, config.ring_degree,
      config.tensor_parallel_degree);
  if (mpi.size() <= 1) return nullptr;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(config.comm_timeout * 1000));
  // CPU tensors over MPI; on a GPU run, device tensors over NCCL (or MPI via host memory).
  auto world = parallel::make_world_communicator(config.comm_backend, device, mpi.local_size(),
                                                 backends::probe_devices().visible_gpus, timeout);
  return std::make_shared<parallel::ProcessGroups>(world_config, world);
}

}  // namespace xfuser::runner
