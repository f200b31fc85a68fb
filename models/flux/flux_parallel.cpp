#include "models/flux/flux_parallel.h"

#include "backends/error.h"
#include "models/flux/flux_transformer.h"

namespace xfuser::models::flux {

std::shared_ptr<FluxTransformer2DModel> load_flux_transformer(const std::string& dir,
                                                              c10::ScalarType dtype,
                                                              const parallel::ProcessGroups* groups,
                                                              const WeightFormat& weights) {
  auto model = std::dynamic_pointer_cast<FluxTransformer2DModel>(dit::load_dit_transformer(
      dir, dtype, groups, {}, "FluxTransformer2DModel", c10::Device(c10::kCPU), weights));
  XF_CHECK(model != nullptr, dir, ": the FluxTransformer2DModel factory built another class");
  return model;
}

at::Tensor sequence_parallel_forward(FluxTransformer2DModel& model, const FluxInputs& in,
                                     const parallel::ProcessGroups& groups) {
  return dit::sequence_parallel_forward(model, FluxTransformer2DModel::to_dit(in), groups);
}

}  // namespace xfuser::models::flux
