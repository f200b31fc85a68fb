// PipeFusion for FLUX: the generic driver (models/dit/dit_pipefusion.h, which documents the
// schedule) with FLUX's keyword inputs and block names.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "models/dit/dit_pipefusion.h"
#include "models/flux/flux_transformer.h"

namespace xfuser::parallel {
class ProcessGroups;
}

namespace xfuser::models::flux {

using dit::balanced_stage_layers;
using dit::image_psnr;
using dit::pipefusion_patch_rows;
using dit::pipefusion_stage_part;

// Parameters of each transformer block in forward order (double blocks, then single blocks),
// and of the parts outside the blocks: [embedders, time_text_embed, norm_out + proj_out].
std::vector<int64_t> flux_block_parameters(const FluxConfig& config);
std::vector<int64_t> flux_other_parameters(const FluxConfig& config);

// dit::pipefusion_stage_layers for a FLUX config (the FLUX double block holds 2.4x a single
// block's parameters, so equal block counts would leave stage 0 with 2/3 of the weights at pp 2).
std::vector<int64_t> pipefusion_stage_layers(const FluxConfig& config, int stages,
                                             const std::vector<int64_t>& explicit_counts);

// dit::PipeFusion on FLUX's keyword inputs.
class FluxPipeFusion {
 public:
  using CombineFn = dit::PipeFusion::CombineFn;
  using StepFn = dit::PipeFusion::StepFn;

  FluxPipeFusion(FluxTransformer2DModel& model, const parallel::ProcessGroups& groups,
                 int64_t token_rows, int64_t token_cols, int patches, int warmup_steps,
                 int num_steps)
      : pipe_(model, groups, token_rows, token_cols, patches, warmup_steps, num_steps) {}

  // `in`: the model inputs of the whole image (hidden_states unused, see dit::PipeFusion::step).
  void step(int index, const FluxInputs& in, int branches, const CombineFn& combine,
            const StepFn& step_fn, at::Tensor& latents) {
    pipe_.step(index, FluxTransformer2DModel::to_dit(in), branches, combine, step_fn, latents);
  }

  int patches() const { return pipe_.patches(); }
  int warmup_steps() const { return pipe_.warmup_steps(); }
  int stage() const { return pipe_.stage(); }

 private:
  dit::PipeFusion pipe_;
};

}  // namespace xfuser::models::flux
