// FLUX under sequence and tensor parallelism: the generic DiT drivers (models/dit/dit_parallel.h)
// with FLUX's keyword inputs, for the pipeline, `xfuser forward` and the benchmarks.
#pragma once

#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "models/common/tensor_parallel.h"
#include "models/dit/dit_parallel.h"

namespace xfuser::parallel {
class Communicator;
class ProcessGroups;
}  // namespace xfuser::parallel

namespace xfuser::models::flux {

class FluxTransformer2DModel;
struct FluxInputs;

// The tensor-parallel collectives of a model over communicator `tp` (which must outlive them).
using dit::tensor_parallel_ops;

// dit::load_dit_transformer for a FluxTransformer2DModel folder: with `groups` of
// tensor-parallel degree n > 1 the model is built for tp rank r (reading only its slices of the
// weights) and its tensor-parallel ops are wired to groups->tp(); `groups` must outlive it.
// `weights`: how the weights are held (fp8 storage or FP8 GEMMs; docs/fp8.md).
std::shared_ptr<FluxTransformer2DModel> load_flux_transformer(const std::string& dir,
                                                              c10::ScalarType dtype,
                                                              const parallel::ProcessGroups* groups,
                                                              const WeightFormat& weights = {});

// dit::sequence_parallel_forward on FLUX's inputs: every rank returns the same [B, N, C] as
// model.forward(in).
at::Tensor sequence_parallel_forward(FluxTransformer2DModel& model, const FluxInputs& in,
                                     const parallel::ProcessGroups& groups);

}  // namespace xfuser::models::flux
