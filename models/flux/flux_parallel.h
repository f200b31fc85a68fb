// FLUX under sequence parallelism, shared by the pipeline and `xfuser forward` under mpirun.
#pragma once

#include <ATen/core/Tensor.h>

namespace xfuser::parallel {
class ProcessGroups;
}

namespace xfuser::models::flux {

class FluxTransformer2DModel;
struct FluxInputs;

// The transformer on GLOBAL inputs, split over the sequence-parallel group of `groups`
// (ulysses x ring): this rank keeps image-token chunk r (chunks padded to equal length) and
// either text chunk r (when the text length divides the degree) or the whole text; USP attention
// makes every attention exact over the global sequence; the output chunks are gathered, so every
// rank returns the same [B, N, C] as model.forward(in). With an SP degree of 1 it is forward(in).
at::Tensor sequence_parallel_forward(FluxTransformer2DModel& model, const FluxInputs& in,
                                     const parallel::ProcessGroups& groups);

}  // namespace xfuser::models::flux
