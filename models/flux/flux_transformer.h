// FluxTransformer2DModel (FLUX.1): diffusers' module tree, parameter names and math.
//
// The forward is split so that parallel strategies can drive it without the model knowing:
//   state = embed(inputs)                       x/context embeddings, temb, RoPE tables
//   run_double_blocks(state, begin, end)        transformer_blocks[begin, end)
//   run_single_blocks(state, begin, end)        single_transformer_blocks[begin, end)
//   sample = finalize(state)                    norm_out + proj_out on the image tokens
// and every attention goes through one AttentionHook (default: the local backends op), called
// with q/k/v [B, S, H, hd] after QK norms and RoPE, text tokens first.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/common/component.h"
#include "models/common/layers.h"
#include "models/common/tensor_parallel.h"
#include "models/dit/dit.h"
#include "models/flux/flux_config.h"

namespace xfuser::models::flux {

// The tensors of one forward call, under diffusers' keyword names.
struct FluxInputs {
  at::Tensor hidden_states;          // [B, N, in_channels]
  at::Tensor encoder_hidden_states;  // [B, L, joint_attention_dim]
  at::Tensor pooled_projections;     // [B, pooled_projection_dim]
  at::Tensor timestep;               // [B] or [1]: sigma (the model multiplies by 1000)
  at::Tensor img_ids;                // [N, n_axes] float (deprecated [B', N, n_axes]: first taken)
  at::Tensor txt_ids;                // [L, n_axes] float (deprecated [B', L, n_axes])
  at::Tensor guidance;               // [B] or [1]; required with guidance_embeds, else ignored
};

// The activations between stages of the forward (models/dit/dit.h): the image stream [B, N, D]
// during the double blocks, the joint [text, image] sequence [B, L + N, D] once `joined` (the
// single blocks); RoPE tables [L + N, hd] rows in [text, image] order.
using FluxState = dit::DiTActivations;

class FluxTransformerBlock;
class FluxSingleTransformerBlock;

// The part of the model one instance holds (a PipeFusion stage); the default is the whole model.
// Blocks are counted in forward order: double blocks 0..num_layers-1, then single blocks.
// time_text_embed is always held (every stage needs temb); parameters of the parts not held are
// not declared, so load() with LoadOptions::allow_unexpected reads only this part's tensors.
using FluxModelPart = dit::DiTPart;

class FluxTransformer2DModel : public dit::DiTTransformer {
 public:
  // `part`: the blocks this instance holds (a PipeFusion stage; default the whole model).
  // With `tp` of size n > 1 this rank holds heads [r*H/n, (r+1)*H/n) and its slices of every
  // block's linear layers (models/common/tensor_parallel.h); num_attention_heads must divide
  // by n. The forward then needs set_tensor_parallel_ops (the all-reduce / all-gather of the
  // tensor-parallel group); the attention hook sees this rank's H/n heads.
  explicit FluxTransformer2DModel(FluxConfig config, FluxModelPart part = {},
                                  TensorParallel tp = {});
  ~FluxTransformer2DModel() override;

  std::string class_name() const override { return "FluxTransformer2DModel"; }
  // "forward": inputs under FluxInputs' names; output {"sample": [B, N, patch^2 * out_channels]}.
  using dit::DiTTransformer::call;  // forward_outputs(forward(parse_forward_inputs(inputs)))

  const FluxConfig& config() const { return config_; }
  // Dtype of the loaded parameters (the compute dtype); an error before loading.
  c10::ScalarType dtype() const override;
  std::vector<std::string> layerwise_casting_skip_patterns() const override {
    return {"pos_embed", "norm"};
  }
  std::vector<std::string> block_list_prefixes() const override {
    return {"transformer_blocks.", "single_transformer_blocks."};
  }
  // diffusers' FLUX_MAG_RATIOS (FLUX.1-dev, 28 steps).
  std::vector<double> published_mag_ratios() const override;
  // transformer_blocks.0.norm1's modulated image input (TeaCache4FLUX's signal).
  at::Tensor teacache_input(const dit::DiTActivations& a) const override;

  // The DiT interface (models/dit/dit.h). Attention layer indices: double block i -> i, single
  // block j -> num_layers + j.
  int64_t num_blocks() const override { return config_.num_layers + config_.num_single_layers; }
  int64_t num_heads() const override { return config_.num_attention_heads; }
  int64_t hidden_size() const override { return config_.inner_dim(); }
  bool joined_at(int64_t block) const override { return block >= config_.num_layers; }
  dit::TextAttention text_attention() const override { return dit::TextAttention::kJointTextFirst; }
  std::vector<int64_t> block_parameters() const override;
  // {x_embedder + context_embedder, time_text_embed, norm_out + proj_out}
  std::vector<int64_t> other_parameters() const override;
  void check_inputs(const dit::DiTInputs& in) const override { check_inputs(from_dit(in)); }
  dit::DiTActivations embed(const dit::DiTInputs& in) const override { return embed(from_dit(in)); }
  // Blocks [begin, end) in forward order (double, then single).
  void run_blocks(dit::DiTActivations& a, int64_t begin, int64_t end) const override;
  using dit::DiTTransformer::forward;
  dit::DiTInputs parse_forward_inputs(const TensorMap& inputs) const override {
    return to_dit(parse_inputs(inputs));
  }
  TensorMap forward_outputs(const at::Tensor& tokens, const TensorMap&) const override {
    return {{"sample", tokens}};
  }

  // FLUX's keyword inputs <-> the DiT token inputs (tokens = hidden_states, token_ids = img_ids,
  // text = encoder_hidden_states, text_ids = txt_ids, pooled = pooled_projections; deprecated
  // 3-D ids take their first row).
  static dit::DiTInputs to_dit(const FluxInputs& in);
  static FluxInputs from_dit(const dit::DiTInputs& in);

  // Input names call("forward") accepts, in diffusers' order.
  static const std::vector<std::string>& input_names();
  // Maps named tensors to FluxInputs; unknown or missing names are errors.
  FluxInputs parse_inputs(const TensorMap& inputs) const;
  // Shape checks with errors naming the input and the expected shape.
  void check_inputs(const FluxInputs& in) const;

  // Without the embedders (a later pipeline stage) hidden and context stay undefined: the
  // caller fills them from the previous stage's activations.
  FluxState embed(const FluxInputs& in) const;
  void run_double_blocks(FluxState& state, int64_t begin, int64_t end) const;
  void run_single_blocks(FluxState& state, int64_t begin, int64_t end) const;
  at::Tensor finalize(const FluxState& state) const override;  // [B, N, patch^2 * out_channels]
  // embed -> all blocks -> finalize.
  at::Tensor forward(const FluxInputs& in) const;

 private:
  FluxConfig config_;
  std::shared_ptr<Linear> x_embedder_, context_embedder_, proj_out_;
  std::shared_ptr<TimestepEmbedding> timestep_embedder_, guidance_embedder_;
  std::shared_ptr<PixArtAlphaTextProjection> text_embedder_;
  std::vector<std::shared_ptr<FluxTransformerBlock>> blocks_;
  std::vector<std::shared_ptr<FluxSingleTransformerBlock>> single_blocks_;
  std::shared_ptr<AdaLayerNormContinuous> norm_out_;
};

// Factory for the ComponentRegistry: FluxConfig::from_json(config) -> an unloaded model.
std::shared_ptr<Component> make_flux_transformer(const nlohmann::json& config,
                                                 const std::string& config_path);
// Factory for the DiTRegistry (a part and a tensor-parallel rank).
std::shared_ptr<dit::DiTTransformer> make_flux_dit(const nlohmann::json& config,
                                                   const std::string& config_path,
                                                   dit::DiTPart part, TensorParallel tp);

}  // namespace xfuser::models::flux
