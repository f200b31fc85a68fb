// SD3Transformer2DModel (SD3, SD3.5): diffusers' module tree, parameter names and math, as a
// dit::DiTTransformer.
//
// Token level (models/dit/dit.h): DiTInputs.tokens are the latents cut into p x p patches
// (patchify), token_ids each token's (row, col) in the M x M position table after diffusers'
// centre crop (token_ids). embed() is the PatchEmbed conv as a matmul over patches plus the
// table rows gathered by token_ids, so any subset of the tokens embeds exactly as in the full
// image. The blocks are JointTransformerBlocks: one joint attention over [image, text] (the
// opposite of FLUX), SD3.5's RMS QK norms, dual-attention layers (attn2: self-attention over the
// image tokens) and a last block that keeps no text stream (context_pre_only). No RoPE.
//
// Attention layer indices given to the hook: the joint attention of block i is layer i; the
// attn2 of the k-th dual-attention block (in block order) is layer num_layers + k.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/dit/dit.h"
#include "models/sd3/sd3_config.h"

namespace xfuser::models::sd3 {

class SD3JointBlock;

class SD3Transformer2DModel : public dit::DiTTransformer {
 public:
  // `part`: the blocks this instance holds; parameters of the parts not held are not declared
  // (load with LoadOptions::allow_unexpected). With `tp` of size n > 1 this rank holds heads
  // [r*H/n, (r+1)*H/n) and its slices of every block's linear layers; the forward then needs
  // set_tensor_parallel_ops.
  explicit SD3Transformer2DModel(SD3Config config, dit::DiTPart part = {}, TensorParallel tp = {});
  ~SD3Transformer2DModel() override;

  std::string class_name() const override { return "SD3Transformer2DModel"; }
  // "forward": hidden_states [B, C, H, W], encoder_hidden_states [B, L, joint_attention_dim],
  // pooled_projections [B, pooled_projection_dim], timestep [B] or [1] (int64 or float, t =
  // sigma * 1000) -> {"sample": [B, out_channels, H, W]}.
  using dit::DiTTransformer::call;  // forward_outputs(forward(parse_forward_inputs(inputs)))

  const SD3Config& config() const { return config_; }

  int64_t num_blocks() const override { return config_.num_layers; }
  int64_t num_heads() const override { return config_.num_attention_heads; }
  int64_t hidden_size() const override { return config_.inner_dim(); }
  dit::TextAttention text_attention() const override {
    return dit::TextAttention::kJointImageFirst;
  }
  std::vector<int64_t> block_parameters() const override;
  // {pos_embed (conv + table) and context_embedder, time_text_embed, norm_out and proj_out}.
  std::vector<int64_t> other_parameters() const override;
  c10::ScalarType dtype() const override;
  std::vector<std::string> layerwise_casting_skip_patterns() const override {
    return {"pos_embed", "norm"};
  }
  std::vector<std::string> block_list_prefixes() const override { return {"transformer_blocks."}; }

  void check_inputs(const dit::DiTInputs& in) const override;
  // call("forward")'s named tensors as token inputs (patchified, with token ids), checked: the
  // names, the 4-D latents, the patch multiple and the table size.
  dit::DiTInputs parse_forward_inputs(const TensorMap& inputs) const override;
  // The token output [B, n, p*p*out_C] back as {"sample": [B, out_C, H, W]} (H, W from the
  // inputs' hidden_states).
  TensorMap forward_outputs(const at::Tensor& tokens, const TensorMap& inputs) const override;
  dit::DiTActivations embed(const dit::DiTInputs& in) const override;
  void run_blocks(dit::DiTActivations& a, int64_t begin, int64_t end) const override;
  at::Tensor finalize(const dit::DiTActivations& a) const override;  // [B, n, p*p*out_C]

  // Input names call("forward") accepts, in diffusers' order.
  static const std::vector<std::string>& input_names();

  // [B, C, H, W] -> [B, (H/p)(W/p), C*p*p]: token (i, j) holds latents[:, c, i*p + y, j*p + x]
  // at c*p*p + y*p + x (the order diffusers' PatchEmbed conv weight [D, C, p, p] sees).
  static at::Tensor patchify(const at::Tensor& latents, int64_t patch);
  // [B, h*w, p*p*C] -> [B, C, h*p, w*p]: diffusers' final reshape to [B, h, w, p, p, C] and
  // einsum("nhwpqc->nchpwq"); note the channel is the fastest index here, unlike patchify.
  static at::Tensor unpatchify(const at::Tensor& tokens, int64_t grid_h, int64_t grid_w,
                               int64_t patch, int64_t channels);
  // [h*w, 2] float32 (row, col) of each token of an h x w grid (row-major) in the M x M table
  // after diffusers' centre crop: row = (M - h)/2 + i, col = (M - w)/2 + j. `options` gives the
  // device; the grid must fit in the table.
  static at::Tensor token_ids(int64_t grid_h, int64_t grid_w, int64_t pos_embed_max_size,
                              const at::TensorOptions& options);
  // diffusers' PatchEmbed table get_2d_sincos_pos_embed(dim, M, base_size): [M*M, dim] float32,
  // row r*M + c = [sincos(c * base/M) || sincos(r * base/M)], each [sin || cos] over
  // 1/10000^(k/(dim/4)), computed in float64. The value of the stored pos_embed.pos_embed.
  static at::Tensor sincos_pos_table(int64_t dim, int64_t max_size, int64_t base_size,
                                     const at::TensorOptions& options);

 private:
  SD3Config config_;
  class PatchEmbed;
  std::shared_ptr<PatchEmbed> pos_embed_;
  std::shared_ptr<TimestepEmbedding> timestep_embedder_;
  std::shared_ptr<PixArtAlphaTextProjection> text_embedder_;
  std::shared_ptr<Linear> context_embedder_, proj_out_;
  std::vector<std::shared_ptr<SD3JointBlock>> blocks_;  // null outside the part
  std::vector<int64_t> attn2_layer_;                    // per block: attn2's layer index or -1
  std::shared_ptr<AdaLayerNormContinuous> norm_out_;
};

// Factory for the registries: SD3Config::from_json(config) -> an unloaded model for a part and a
// tensor-parallel rank.
std::shared_ptr<dit::DiTTransformer> make_sd3_transformer(const nlohmann::json& config,
                                                          const std::string& config_path,
                                                          dit::DiTPart part, TensorParallel tp);

}  // namespace xfuser::models::sd3
