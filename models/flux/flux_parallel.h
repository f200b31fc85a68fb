// FLUX under sequence and tensor parallelism, shared by the pipeline and `xfuser forward` under
// mpirun.
#pragma once

#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "models/common/tensor_parallel.h"

namespace xfuser::parallel {
class Communicator;
class ProcessGroups;
}  // namespace xfuser::parallel

namespace xfuser::models::flux {

class FluxTransformer2DModel;
struct FluxInputs;

// The tensor-parallel collectives of a model over communicator `tp` (which must outlive them).
TensorParallelOps tensor_parallel_ops(parallel::Communicator& tp);

// Loads a FluxTransformer2DModel component folder (config.json + safetensors). With `groups`
// of tensor-parallel degree n > 1 the model is built for tp rank r (reading only its slices of
// the weights) and its tensor-parallel ops are wired to groups->tp(); `groups` must outlive it.
std::shared_ptr<FluxTransformer2DModel> load_flux_transformer(
    const std::string& dir, c10::ScalarType dtype, const parallel::ProcessGroups* groups);

// The transformer on GLOBAL inputs, split over the sequence-parallel group of `groups`
// (ulysses x ring): this rank keeps image-token chunk r (chunks padded to equal length) and
// either text chunk r (when the text length divides the degree) or the whole text; USP attention
// makes every attention exact over the global sequence; the output chunks are gathered, so every
// rank returns the same [B, N, C] as model.forward(in). With an SP degree of 1 it is forward(in).
// A tensor-parallel model (built for groups.tp()) gets its ops wired to groups.tp() first; the
// attention hook then sees this rank's heads.
at::Tensor sequence_parallel_forward(FluxTransformer2DModel& model, const FluxInputs& in,
                                     const parallel::ProcessGroups& groups);

}  // namespace xfuser::models::flux
