#include "models/flux/flux_pipefusion.h"

namespace xfuser::models::flux {

std::vector<int64_t> flux_block_parameters(const FluxConfig& config) {
  // The module tree declares shapes only (nothing is allocated before load()).
  return FluxTransformer2DModel(config).block_parameters();
}

std::vector<int64_t> flux_other_parameters(const FluxConfig& config) {
  return FluxTransformer2DModel(config).other_parameters();
}

std::vector<int64_t> pipefusion_stage_layers(const FluxConfig& config, int stages,
                                             const std::vector<int64_t>& explicit_counts) {
  return dit::pipefusion_stage_layers(flux_block_parameters(config), flux_other_parameters(config),
                                      stages, explicit_counts, "double + single");
}

}  // namespace xfuser::models::flux
