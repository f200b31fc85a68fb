// The diffusion-transformer interface every family's transformer implements, so the parallel
// drivers (sequence parallel, tensor parallel, CFG parallel, PipeFusion: models/dit/) are
// written once for all families.
//
// A forward works on TOKENS: the pipeline patchifies the latents (FLUX: 2x2 packing; SD3: p x p
// patches; video families: (pt, ph, pw) patches) into [B, N, C] and gives every token a position
// row (token_ids). Every per-token operation of a DiT (patch embedding, positional embedding,
// norms, MLPs, modulation) then works on any subset of the tokens, which is what lets the
// drivers shard the sequence (Ulysses/ring) or run patches of it (PipeFusion) without the model
// knowing. Only attention mixes tokens, and every attention goes through one hook.
//
//   a = embed(inputs)             patch/text embeddings, conditioning, positional tables
//   run_blocks(a, begin, end)     blocks [begin, end) in forward order
//   out = finalize(a)             final norm + projection on the image tokens [B, n, C_out]
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/common/component.h"
#include "models/common/layers.h"
#include "models/common/tensor_parallel.h"

namespace xfuser::models::dit {

class BlockCacheCall;  // models/dit/step_cache.h

// The token-level inputs of one transformer forward.
struct DiTInputs {
  at::Tensor tokens;     // [B, N, C_in] patchified latents
  at::Tensor token_ids;  // [N, A] float: each token's position (FLUX img_ids; SD3 (row, col))
  at::Tensor text;       // [B, L, C_text] encoder_hidden_states
  at::Tensor text_ids;   // [L, A] float (FLUX txt_ids), or undefined
  at::Tensor text_mask;  // [B, L] bool (true: attend), or undefined
  at::Tensor pooled;     // [B, P] pooled text projection, or undefined
  at::Tensor timestep;   // [B]: as the family's forward takes it (FLUX: sigma; SD3: t)
  at::Tensor guidance;   // [B]: embedded (distilled) guidance, or undefined
  TensorMap extra;       // family-specific conditioning (image embeddings, ...)
  // The last `reference_tokens` rows of tokens / token_ids are image-stream tokens that condition
  // the generated ones and are not denoised (FLUX.1-Kontext's and FLUX.2's input pictures): they
  // follow the generated tokens, the pipeline drops their outputs, and PipeFusion sends them
  // with every patch instead of splitting them into patches.
  int64_t reference_tokens = 0;
};

// The activations between the stages of a forward.
struct DiTActivations {
  // Image stream [B, n, D]; the joint sequence [B, L + n, D] (in the family's order) once
  // `joined` (FLUX's single blocks).
  at::Tensor hidden;
  at::Tensor context;       // text stream [B, L, D]; undefined once joined
  at::Tensor temb;          // conditioning, [B, D] (or the family's shape)
  RotaryTables rope;        // per-token tables in the joint order, or undefined (no RoPE)
  int64_t text_tokens = 0;  // L
  bool joined = false;
  TensorMap extra;  // family-specific activations
};

// The part of the model one instance holds (a PipeFusion stage); the default is the whole model.
// Blocks are counted in forward order over all the model's block lists.
struct DiTPart {
  int64_t block_begin = 0;
  int64_t block_end = -1;  // one past the last block; -1: through the last block
  bool embedders = true;   // patch and text embedders
  bool head = true;        // final norm and projection
};

// How a family's attention treats the text, for the sequence-parallel drivers.
enum class TextAttention {
  kJointTextFirst,   // one attention over [text, image] (FLUX)
  kJointImageFirst,  // one attention over [image, text] (SD3, HunyuanVideo)
  kCross,            // self-attention over the image + cross-attention to the text (Wan)
};

class DiTTransformer : public Component {
 public:
  DiTTransformer(DiTPart part, TensorParallel tp) : part_(part), tp_(tp) {}

  // ---- what the drivers need to know ----
  // All blocks of the model in forward order (not only the part held).
  virtual int64_t num_blocks() const = 0;
  // Attention heads of the whole model (tensor parallel splits them by whole heads).
  virtual int64_t num_heads() const = 0;
  // Width D of the activations between blocks (what a PipeFusion stage sends to the next).
  virtual int64_t hidden_size() const = 0;
  // Whether the activations entering block `block` are joined into one sequence (FLUX's single
  // blocks); otherwise they are the image stream plus the text stream.
  virtual bool joined_at(int64_t block) const { return false; }
  virtual TextAttention text_attention() const = 0;
  // Whether the text must be whole on every rank under sequence parallelism and PipeFusion (the
  // model embeds it with operations over the whole text, e.g. HunyuanVideo's token refiner);
  // otherwise a joint-attention text whose length divides by the degree is split over the ranks.
  virtual bool text_whole() const { return false; }
  // Rows of the text stream embed() makes of `in` (what PipeFusion sends between stages with the
  // image rows): in.text's length, unless the family's text embedding changes it (HunyuanVideo-1.5
  // joins three streams and drops their common padding).
  virtual int64_t text_tokens(const DiTInputs& in) const {
    return in.text.defined() ? in.text.size(1) : 0;
  }
  // Parameter count of each block (forward order) and of the parts outside the blocks
  // {embedders, conditioning, head}: PipeFusion balances its stages by them.
  virtual std::vector<int64_t> block_parameters() const = 0;
  virtual std::vector<int64_t> other_parameters() const = 0;
  // Dtype of the loaded parameters (the compute dtype); an error before loading.
  virtual c10::ScalarType dtype() const = 0;
  // diffusers' layerwise-casting skip patterns of the class: its _skip_layerwise_casting_patterns
  // and _keep_in_fp32_modules (regular expressions, searched in module names; dit_weight_format).
  virtual std::vector<std::string> layerwise_casting_skip_patterns() const = 0;
  // The name prefixes of the block lists ("transformer_blocks.", ...): FP8 GEMMs quantize the
  // Linear layers under them.
  virtual std::vector<std::string> block_list_prefixes() const = 0;

  // ---- the forward, split ----
  // Shape checks naming the input and the expected shape.
  virtual void check_inputs(const DiTInputs& in) const = 0;
  // Without the embedders (a later PipeFusion stage) hidden and context stay undefined: the
  // caller fills them from the previous stage's activations.
  virtual DiTActivations embed(const DiTInputs& in) const = 0;
  virtual void run_blocks(DiTActivations& a, int64_t begin, int64_t end) const = 0;
  virtual at::Tensor finalize(const DiTActivations& a) const = 0;  // [B, n, C_out]
  // embed -> the blocks held -> finalize.
  at::Tensor forward(const DiTInputs& in) const;

  // `xfuser forward` under mpirun: call("forward")'s keyword inputs (diffusers' names) as token
  // inputs (checked), and the token output [B, N, C_out] back as call("forward")'s outputs.
  virtual DiTInputs parse_forward_inputs(const TensorMap& inputs) const = 0;
  virtual TensorMap forward_outputs(const at::Tensor& tokens, const TensorMap& inputs) const = 0;
  // Component::call for every DiT: "forward" = forward_outputs(forward(parse_forward_inputs)).
  TensorMap call(const std::string& method, const TensorMap& inputs) override;

  // The part held, with block_end resolved.
  const DiTPart& part() const { return part_; }
  const TensorParallel& tensor_parallel() const { return tp_; }

  // Routes every attention call; an empty hook restores the local backends op.
  void set_attention_hook(AttentionHook hook) { attention_hook_ = std::move(hook); }
  // While set, forward() has `call` run (or serve from the step cache) the blocks between embed
  // and finalize; nullptr: the blocks run. The caller keeps `call` alive while it is set.
  void set_block_cache(BlockCacheCall* call) { block_cache_ = call; }
  BlockCacheCall* block_cache() const { return block_cache_; }
  // MagCache's published magnitude ratios of this model (one per step of the published
  // calibration run); empty: none published, --cache_mag_ratios or --cache_calibrate needed.
  virtual std::vector<double> published_mag_ratios() const { return {}; }
  // TeaCache's signal: the first block's modulated image input [B, n, D] for activations `a`
  // fresh from embed(); a model without one refuses (the default).
  virtual at::Tensor teacache_input(const DiTActivations& a) const;
  // The collectives of the tensor-parallel group (unused at degree 1).
  void set_tensor_parallel_ops(TensorParallelOps ops) { tp_ops_ = std::move(ops); }

 protected:
  // The hook, or the local op.
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const AttentionCall& call) const;
  // Resolves part_.block_end and checks the range (constructors of derived classes call it).
  void resolve_part();
  const TensorParallelOps& tp_ops() const { return tp_ops_; }

  DiTPart part_;
  TensorParallel tp_;

 private:
  AttentionHook attention_hook_;
  TensorParallelOps tp_ops_;
  BlockCacheCall* block_cache_ = nullptr;
};

// Builds an unloaded transformer of `class_name` for a part and a tensor-parallel rank from its
// parsed config.json.
using DiTFactory = std::function<std::shared_ptr<DiTTransformer>(
    const nlohmann::json& config, const std::string& config_path, DiTPart part, TensorParallel tp)>;

// Class name ("FluxTransformer2DModel", "SD3Transformer2DModel") -> factory. Families register
// their transformers here (and as components, through register_dit_component).
class DiTRegistry {
 public:
  static void add(const std::string& class_name, DiTFactory factory);
  static const DiTFactory* find(const std::string& class_name);
  static std::vector<std::string> known_classes();
};

// Registers `class_name` both as a DiT and as a Component (whole model, tensor-parallel size 1).
void register_dit_component(const std::string& class_name, DiTFactory factory);

}  // namespace xfuser::models::dit
