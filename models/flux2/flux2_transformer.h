// Flux2Transformer2DModel (FLUX.2): diffusers 0.36.0's module tree, parameter names and math.
//
// Against FLUX.1 (models/flux/): no biases anywhere; no pooled text projection (the conditioning
// is the timestep + embedded guidance only); the shift/scale/gate modulation is computed ONCE per
// forward by three model-level Flux2Modulation layers (double_stream_modulation_img / _txt,
// single_stream_modulation) and shared by every block; SwiGLU feed-forwards (silu(first half) *
// second half); single blocks with one fused to_qkv_mlp_proj [q | k | v | mlp gate | mlp up] and
// one to_out over [attention | mlp]; 4-axis (t, h, w, l) RoPE with theta 2000.
//
// The forward is split for the parallel drivers (models/dit/dit.h):
//   a = embed(inputs)            x/context embeddings, temb, the shared modulation
//                                (a.extra: kModImg [B|1, 6D], kModTxt [B|1, 6D], kModSingle
//                                [B|1, 3D]), RoPE tables in [text, image] order
//   run_blocks(a, begin, end)    double blocks, then single blocks (joined [text, image])
//   out = finalize(a)            norm_out + proj_out on the image tokens
// and every attention goes through one AttentionHook, called with q/k/v [B, S, H, hd] after QK
// norms and RoPE, text tokens first.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/common/component.h"
#include "models/common/layers.h"
#include "models/common/tensor_parallel.h"
#include "models/dit/dit.h"
#include "models/flux2/flux2_config.h"

namespace xfuser::models::flux2 {

// The tensors of one forward call, under diffusers' keyword names.
struct Flux2Inputs {
  at::Tensor hidden_states;          // [B, N, in_channels] (latent tokens, then reference ones)
  at::Tensor encoder_hidden_states;  // [B, L, joint_attention_dim]
  at::Tensor timestep;               // [B] or [1]: sigma (the model multiplies by 1000)
  at::Tensor img_ids;                // [N, 4] (t, h, w, l), or [B', N, 4] (row 0 is taken)
  at::Tensor txt_ids;                // [L, 4], or [B', L, 4]
  at::Tensor guidance;               // [B] or [1]: embedded guidance scale (required)
};

class Flux2TimestepEmbedding;
class Flux2TransformerBlock;
class Flux2SingleTransformerBlock;

class Flux2Transformer2DModel : public dit::DiTTransformer {
 public:
  // Names of the shared modulation in DiTActivations::extra.
  static constexpr const char* kModImg = "double_stream_mod_img";
  static constexpr const char* kModTxt = "double_stream_mod_txt";
  static constexpr const char* kModSingle = "single_stream_mod";

  // `part`: the blocks this instance holds (a PipeFusion stage; default the whole model); the
  // timestep/guidance embedding and the three modulation layers are held by every part (every
  // stage needs them), the embedders only with part.embedders, norm_out/proj_out only with
  // part.head; parameters of the parts not held are not declared.
  // With `tp` of size n > 1 this rank holds heads [r*H/n, (r+1)*H/n) and its slices of every
  // block's linear layers: q/k/v (and add_q/k/v) and the feed-forwards' linear_in column-parallel
  // (SwiGLU's two halves sharded separately), to_out / to_add_out / linear_out row-parallel; the
  // single blocks' to_qkv_mlp_proj column-parallel per segment [q | k | v | gate | up] and
  // to_out row-parallel per segment [attention | mlp]; the modulation layers column-parallel with
  // their small outputs all-gathered. num_attention_heads and the feed-forward width must divide
  // by n. The forward then needs set_tensor_parallel_ops.
  explicit Flux2Transformer2DModel(Flux2Config config, dit::DiTPart part = {},
                                   TensorParallel tp = {});
  ~Flux2Transformer2DModel() override;

  std::string class_name() const override { return "Flux2Transformer2DModel"; }
  // "forward": inputs under Flux2Inputs' names; output {"sample": [B, N, patch^2 * out_channels]}.
  using dit::DiTTransformer::call;

  const Flux2Config& config() const { return config_; }
  c10::ScalarType dtype() const override;
  std::vector<std::string> layerwise_casting_skip_patterns() const override {
    return {"pos_embed", "norm"};
  }
  std::vector<std::string> block_list_prefixes() const override {
    return {"transformer_blocks.", "single_transformer_blocks."};
  }

  // The DiT interface. Attention layer indices: double block i -> i, single block j ->
  // num_layers + j.
  int64_t num_blocks() const override { return config_.num_layers + config_.num_single_layers; }
  int64_t num_heads() const override { return config_.num_attention_heads; }
  int64_t hidden_size() const override { return config_.inner_dim(); }
  bool joined_at(int64_t block) const override { return block >= config_.num_layers; }
  dit::TextAttention text_attention() const override { return dit::TextAttention::kJointTextFirst; }
  std::vector<int64_t> block_parameters() const override;
  // {x_embedder + context_embedder, time_guidance_embed + the modulation layers,
  //  norm_out + proj_out}
  std::vector<int64_t> other_parameters() const override;
  void check_inputs(const dit::DiTInputs& in) const override { check_inputs(from_dit(in)); }
  dit::DiTActivations embed(const dit::DiTInputs& in) const override { return embed(from_dit(in)); }
  void run_blocks(dit::DiTActivations& a, int64_t begin, int64_t end) const override;
  at::Tensor finalize(const dit::DiTActivations& a) const override;  // [B, N, patch^2 * out]
  using dit::DiTTransformer::forward;
  dit::DiTInputs parse_forward_inputs(const TensorMap& inputs) const override {
    return to_dit(parse_inputs(inputs));
  }
  TensorMap forward_outputs(const at::Tensor& tokens, const TensorMap&) const override {
    return {{"sample", tokens}};
  }

  // FLUX.2's keyword inputs <-> the DiT token inputs (tokens = hidden_states, token_ids =
  // img_ids, text = encoder_hidden_states, text_ids = txt_ids; 3-D ids take their first row).
  static dit::DiTInputs to_dit(const Flux2Inputs& in);
  static Flux2Inputs from_dit(const dit::DiTInputs& in);

  // Input names call("forward") accepts, in diffusers' order.
  static const std::vector<std::string>& input_names();
  // Maps named tensors to Flux2Inputs; unknown or missing names are errors.
  Flux2Inputs parse_inputs(const TensorMap& inputs) const;
  // Shape checks with errors naming the input and the expected shape.
  void check_inputs(const Flux2Inputs& in) const;

  // Without the embedders (a later pipeline stage) hidden and context stay undefined: the
  // caller fills them from the previous stage's activations.
  dit::DiTActivations embed(const Flux2Inputs& in) const;
  void run_double_blocks(dit::DiTActivations& a, int64_t begin, int64_t end) const;
  void run_single_blocks(dit::DiTActivations& a, int64_t begin, int64_t end) const;
  at::Tensor forward(const Flux2Inputs& in) const;

 private:
  Flux2Config config_;
  std::shared_ptr<Linear> x_embedder_, context_embedder_, proj_out_;
  std::shared_ptr<Flux2TimestepEmbedding> timestep_embedder_, guidance_embedder_;
  std::shared_ptr<ColumnParallelLinear> mod_img_, mod_txt_, mod_single_;
  std::vector<std::shared_ptr<Flux2TransformerBlock>> blocks_;
  std::vector<std::shared_ptr<Flux2SingleTransformerBlock>> single_blocks_;
  std::shared_ptr<AdaLayerNormContinuous> norm_out_;
};

// Factory for the DiTRegistry (a part and a tensor-parallel rank) from config.json.
std::shared_ptr<dit::DiTTransformer> make_flux2_dit(const nlohmann::json& config,
                                                    const std::string& config_path,
                                                    dit::DiTPart part, TensorParallel tp);

}  // namespace xfuser::models::flux2
