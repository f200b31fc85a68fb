// The parallel drivers of every DiT family (models/dit/dit.h), written once:
//   - loading a transformer for this rank (tensor-parallel slices, a PipeFusion stage's blocks);
//   - sequence parallelism (Ulysses, ring, USP) of one forward on global inputs;
//   - classifier-free guidance, on one rank (both branches) or over the cfg group.
// PipeFusion is in models/dit/dit_pipefusion.h.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "models/dit/dit.h"

namespace xfuser::parallel {
class Communicator;
class ProcessGroups;
}  // namespace xfuser::parallel

namespace xfuser::models::dit {

// The tensor-parallel collectives of a model over communicator `tp` (which must outlive them).
TensorParallelOps tensor_parallel_ops(parallel::Communicator& tp);

// Loads a transformer component folder (config.json + safetensors) of any registered DiT class.
// With `groups` of tensor-parallel degree n > 1 the model is built for tp rank r (reading only
// its slices of the weights) and its tensor-parallel ops are wired to groups->tp(); `groups`
// must outlive it. A `part` other than the whole model reads only that part's tensors.
// `expected_class` (if not empty) must match the folder's class. The weights are copied to
// `device` as they are read, and held as `weights` says (its kind and format; which parameters
// it selects is the model's: dit_weight_format). FP8 GEMMs refuse tensor parallelism: a
// row-parallel layer's per-token and per-channel scales would be taken over a part of each row.
// `row_part` of `row_parts`: FSDP's row sharding (LoadOptions::row_part), refused with tensor
// parallelism. `lora`: LoRA adapters of the transformer (models/common/lora.h), checked against
// the whole model also when `part` is one PipeFusion stage.
std::shared_ptr<DiTTransformer> load_dit_transformer(
    const std::string& dir, c10::ScalarType dtype, const parallel::ProcessGroups* groups,
    const DiTPart& part = {}, const std::string& expected_class = "",
    c10::Device device = c10::Device(c10::kCPU), const WeightFormat& weights = {}, int row_part = 0,
    int row_parts = 1, std::shared_ptr<const ComponentLora> lora = nullptr);

// `kind` and `format` with the parameters they select in `model`:
// - fp8 storage: every Linear, Conv and Embedding layer whose module name (or an enclosing
//   module's) does not match, as Python's re.search, diffusers' default skip patterns
//   (pos_embed, patch_embed, norm, ^proj_in$, ^proj_out$) or the model's own
//   (DiTTransformer::layerwise_casting_skip_patterns): what diffusers'
//   enable_layerwise_casting casts;
// - fp8 GEMMs: the Linear weights inside the transformer blocks (block_list_prefixes), as xDiT's
//   fp8_gemm_module_list; embedders, modulation outside the blocks and the head keep the load
//   dtype.
WeightFormat dit_weight_format(const DiTTransformer& model, const WeightFormat& kind_and_format);

// An unloaded whole model of the folder's class (shapes only: nothing is allocated), for
// planning (PipeFusion stages, memory estimates, validation).
std::shared_ptr<DiTTransformer> describe_dit_transformer(const std::string& dir);

// The transformer on GLOBAL inputs, split over the sequence-parallel group of `groups`
// (ulysses x ring): this rank keeps image-token chunk r (chunks padded to equal length) and
// either text chunk r (joint attention, when the text length divides the degree) or the whole
// text; USP attention makes every self/joint attention exact over the global sequence
// (cross-attention to the text runs locally: the text is whole on every rank); the output
// chunks are gathered, so every rank returns the same [B, N, C] as model.forward(in). With an
// SP degree of 1 it is forward(in). A tensor-parallel model gets its ops wired to groups.tp().
at::Tensor sequence_parallel_forward(DiTTransformer& model, const DiTInputs& in,
                                     const parallel::ProcessGroups& groups);

// One model evaluation: sequence_parallel_forward with groups, else model.forward.
at::Tensor dit_forward(DiTTransformer& model, const DiTInputs& in,
                       const parallel::ProcessGroups* groups);

class StepCache;

// The step cache of one denoising step: evaluations go through `cache` (models/dit/step_cache.h)
// under the name of the transformer (its folder: "transformer", "transformer_2"); no cache:
// every evaluation runs.
struct StepCacheUse {
  StepCache* cache = nullptr;
  std::string model_name = "transformer";
  int step = 0;
};

// dit_forward through the step cache for guidance branch `branch` ("cond", "uncond", "batch").
// The ranks that decide together: the sequence-parallel and tensor-parallel groups, and the cfg
// group too when `across_cfg` (the branches are one batch, split over the cfg group).
at::Tensor cached_forward(DiTTransformer& model, const DiTInputs& in,
                          const parallel::ProcessGroups* groups, const StepCacheUse& use,
                          const std::string& branch, bool across_cfg = false);

// Classifier-free guidance: noise = neg + scale * (pos - neg) (diffusers' order and
// arithmetic), where pos / neg are the model outputs on `positive` / `negative` (same tokens,
// other text conditioning). With a cfg degree of 2 in `groups`, cfg rank 0 evaluates the
// negative branch and rank 1 the positive one and the two outputs are all-gathered; otherwise
// both run here (batched when `batched`, as diffusers' pipelines concatenate [neg, pos]).
// With a step cache the branches keep their own cache state ("cond", "uncond") unless batched
// ("batch": one decision for both, also when the cfg group splits them).
at::Tensor guided_noise(DiTTransformer& model, const DiTInputs& positive, const DiTInputs& negative,
                        double scale, const parallel::ProcessGroups* groups, bool batched = false,
                        const StepCacheUse& cache = {});

// [neg; pos] along the batch for every per-sample input (the pipelines' CFG batch).
DiTInputs concat_branches(const DiTInputs& negative, const DiTInputs& positive);

}  // namespace xfuser::models::dit
