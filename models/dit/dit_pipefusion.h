// PipeFusion for every DiT family (../shared/reference/xdit-parallel-spec.md section 3): the
// transformer's blocks split into contiguous pipeline stages, one per rank of the pp group, and
// the image tokens into patches (bands of token rows) that flow through the stages one after
// the other.
//
// Per denoising step i:
//   - warm-up steps (i < warmup_steps): one patch = the whole image, so the step is exact;
//   - later steps: M patches. Stage s runs its blocks on patch p while stage s+1 runs patch p-1.
//     Each self/joint attention layer keeps a K/V buffer of ALL image tokens ([2, B, N, H, hd],
//     K then V, natural token order); patch p writes its fresh K/V rows into it and attends to
//     its own fresh text K/V and the whole buffer (in the family's text/image order): patches
//     < p are from this step, patches > p from the previous one ("stale"). Text K/V are never
//     cached: the text stream travels with every patch through the stages and is recomputed for
//     it. Cross-attention calls (k/v = the text only) run locally, uncached.
//   - stage 0 embeds the patch's tokens and sends the activations ([text, patch] in the family's
//     order, or the joined sequence; the image stream alone for cross-attention families) to
//     stage 1 (isend, tag kPipeActivation); every later stage has posted the receives of all
//     patches of the step at its start (prefetch);
//   - the last stage runs the head, the noise combination (CFG) and the scheduler step on the
//     patch, and sends the new latent patch back to stage 0 (tag kPipeLatent) for the next step;
//     after the last step it broadcasts the final latents over the pp group, so every rank holds
//     them for decoding.
// Inside a stage the patch's tokens are further split over the sp group (ulysses x ring ranks,
// parallel/sequence_shard.h); an attention layer all-gathers the fresh K/V of the patch over the
// sp group, so every sp rank holds the whole buffer (all heads) and attends its own queries.
// Reference tokens (DiTInputs::reference_tokens: input pictures in the image stream, after the
// generated tokens) are not patched: they travel with every patch, like the text, their K/V are
// fresh for each patch and never cached, and their outputs are dropped. Patch p's image stream
// is [its generated rows, all reference tokens], so the keys are [text, buffer, references]:
// the serial order.
// With warmup_steps >= num_inference_steps (or one patch) the result equals the serial one.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "models/dit/dit.h"
#include "parallel/communicator.h"

namespace xfuser::parallel {
class ProcessGroups;
}

namespace xfuser::models::dit {

// The contiguous split of blocks with `costs` into `stages` stages (each >= 1 block) that
// minimises the largest stage cost; `first_extra` / `last_extra` are added to the first / last
// stage. Returns the block count per stage.
std::vector<int64_t> balanced_stage_layers(const std::vector<int64_t>& costs, int stages,
                                           int64_t first_extra = 0, int64_t last_extra = 0);

// Blocks per stage for `model` (any part: its whole-model block and parameter counts are used):
// `explicit_counts` (--pipefusion_layers; each >= 1, summing to the model's blocks, one per
// stage) or, when empty, balanced by parameters (the stage holding the most weights decides
// whether the model fits). `blocks_what` names the blocks in errors ("double + single").
std::vector<int64_t> pipefusion_stage_layers(const DiTTransformer& model, int stages,
                                             const std::vector<int64_t>& explicit_counts,
                                             const std::string& blocks_what = "");
// The same from per-block and other parameter counts ({embedders, ..., head}).
std::vector<int64_t> pipefusion_stage_layers(const std::vector<int64_t>& block_parameters,
                                             const std::vector<int64_t>& other_parameters,
                                             int stages,
                                             const std::vector<int64_t>& explicit_counts,
                                             const std::string& blocks_what = "");

// The model part stage `stage` holds: its block range; stage 0 also the embedders, the last
// stage the head.
DiTPart pipefusion_stage_part(const std::vector<int64_t>& stage_layers, int stage);

// [begin, end) token-row ranges of `patches` contiguous patches over `rows` rows (balanced: the
// first rows % patches patches get one more row). Requires 1 <= patches <= rows.
std::vector<std::pair<int64_t, int64_t>> pipefusion_patch_rows(int64_t rows, int patches);

// PSNR in dB of two uint8 images (any equal shapes): 10 log10(255^2 / MSE); +inf if equal.
double image_psnr(const at::Tensor& a, const at::Tensor& b);

// Parameter counts of a module tree by name prefix: for each block list prefix
// ("transformer_blocks.") the count of each block index, concatenated in the given order.
std::vector<int64_t> parameters_per_block(
    const Module& model, const std::vector<std::pair<std::string, int64_t>>& prefixes_and_counts);
// The parameters whose names start with any of `prefixes`.
int64_t parameters_with_prefix(const Module& model, const std::vector<std::string>& prefixes);

class PipeFusion {
 public:
  // Model output of one patch [B', n, C] (B' = the model batch) -> noise prediction [B, n, C]
  // for the latents (true CFG combination, over the cfg group with CFG parallel).
  using CombineFn = std::function<at::Tensor(const at::Tensor& model_output)>;
  // The tokens a scheduler step covers: [begin, end) of the image's `total` tokens (a PipeFusion
  // patch, or the whole image).
  struct TokenRange {
    int64_t begin = 0, end = 0, total = 0;
    bool whole() const { return begin == 0 && end == total; }
  };
  // (noise prediction [B, n, C], latents [B, n, C], their tokens) -> the next latents of the
  // patch. `latents` is the step's own copy: a scheduler may keep it (multistep history).
  using StepFn = std::function<at::Tensor(const at::Tensor& noise, const at::Tensor& latents,
                                          const TokenRange& range)>;

  // `model` holds this rank's stage (pipefusion_stage_part); the image is token_rows x
  // token_cols tokens (row-major). patches: 1 <= patches <= token_rows; warmup_steps >= 1 when
  // patches > 1.
  PipeFusion(DiTTransformer& model, const parallel::ProcessGroups& groups, int64_t token_rows,
             int64_t token_cols, int patches, int warmup_steps, int num_steps);
  ~PipeFusion();
  PipeFusion(const PipeFusion&) = delete;
  PipeFusion& operator=(const PipeFusion&) = delete;

  // Denoising step `index` on this rank's stage. `in`: the model inputs of the whole image with
  // the model batch B' = branches * B (`tokens` unused: the patches come from `latents`,
  // repeated `branches` times along the batch; channels of in.tokens [B', N, C + Cc] past the
  // latents' C are per-token conditioning appended to every patch; with
  // in.reference_tokens = R > 0, in.tokens
  // [B', N + R, C] holds the reference tokens in its last R rows and in.token_ids [N + R, A]
  // their ids). `latents` [B, N, C]: read by stage 0, updated
  // by the last stage; after the last step every rank holds the final latents.
  void step(int index, const DiTInputs& in, int branches, const CombineFn& combine,
            const StepFn& step_fn, at::Tensor& latents);

  int patches() const { return patches_; }
  int warmup_steps() const { return warmup_steps_; }
  int stage() const { return stage_; }

 private:
  struct Patch;
  struct Pending {
    int64_t begin = 0, end = 0;  // token range
    at::Tensor buffer;
    std::unique_ptr<parallel::Work> work;
  };
  at::Tensor attend(const Patch& patch, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v, const AttentionCall& call);
  void wait_sends();

  DiTTransformer& model_;
  const parallel::ProcessGroups& groups_;
  int64_t rows_, cols_;
  int patches_, warmup_steps_, num_steps_;
  int stage_, stages_;
  // The latents' path from the last stage to stage 0 where it must not share the pp group's
  // stream (NCCL); null on MPI, where the pp group carries them under their own tag. Declared
  // before the pending operations on it, so it outlives them.
  std::unique_ptr<parallel::Communicator> latent_comm_;
  bool latent_path_connected_ = false;  // stage 0 and the last stage exchanged on latent_comm_
  std::map<int64_t, at::Tensor> kv_;    // layer -> [2, B', N, H, hd]
  std::deque<Pending> latents_in_;      // stage 0: latent patches of the previous step
  std::vector<Pending> sends_;          // pending isends of this step
};

using TokenRange = PipeFusion::TokenRange;

}  // namespace xfuser::models::dit
