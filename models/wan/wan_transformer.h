// WanTransformer3DModel (Wan 2.1 T2V and I2V, diffusers v0.33.1): diffusers' module tree,
// parameter names and math, as a dit::DiTTransformer.
//
// Token level (models/dit/dit.h): DiTInputs.tokens are the latents [B, C, F, H, W] cut into
// (pt, ph, pw) patches (patchify), token_ids each token's (f, h, w) on the patch grid
// (token_ids). embed() is the Conv3d patch_embedding as a matmul over patches, and the rotary
// tables are computed per token from token_ids, so any subset of the tokens embeds exactly as in
// the full video. Every block: self-attention over the image tokens (attn1: QK RMS norm across all
// heads, 3-axis RoPE), cross-attention to the text (attn2, no gate; I2V adds a second attention
// of the same queries to the image-embedding tokens through add_k_proj / add_v_proj), and a
// gated feed-forward; the modulation (scale_shift_table + timestep_proj) is in float32. As
// diffusers' _keep_in_fp32_modules, time_embedder, every scale_shift_table and the norm1/2/3
// parameters (blocks' norm2, image_embedder's norms) load in float32 whatever the model dtype.
//
// Text attention is dit::TextAttention::kCross: the text is whole on every rank and every part
// (PipeFusion stage) computes the conditioning itself (condition_embedder is on every part).
//
// Attention layer indices given to the hook: attn1 of block i is layer i (cross = false,
// text_tokens = 0); attn2's text attention is layer num_layers + i and its image attention
// (I2V) 2 * num_layers + i (both cross = true).
//
// Tensor parallelism (degree n) splits by whole heads: to_q/k/v, add_k/v_proj and ffn.net.0.proj
// column-parallel, to_out.0 and ffn.net.2 row-parallel; the QK RMSNorm normalises over ALL
// heads, so each rank's sum of squares over its heads is all-reduced inside the norm (one small
// [B, S, 1] all-reduce per norm). The embedders, the modulation and the head are replicated.
//
// DiTInputs.extra["encoder_hidden_states_image"] [B, L_img, image_dim] carries the I2V image
// embeddings (required when added_kv_proj_dim is set; 257 tokens for Wan 2.1's CLIP image). The
// blocks take the context's first L_img tokens as the image's, whatever L_img is: diffusers 0.42
// splits at L - 512 (the text is padded to 512 tokens), v0.33.1 at 257; both agree with this for
// Wan's checkpoints at the default max_sequence_length of 512.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/dit/dit.h"
#include "models/wan/wan_config.h"

namespace xfuser::models::wan {

class WanBlock;
class WanConditionEmbedder;

class WanTransformer3DModel : public dit::DiTTransformer {
 public:
  // `part`: the blocks this instance holds; parameters of the parts not held are not declared
  // (load with LoadOptions::allow_unexpected). With `tp` of size n > 1 this rank holds heads
  // [r*H/n, (r+1)*H/n) and its slices of every block's linear layers; the forward then needs
  // set_tensor_parallel_ops.
  explicit WanTransformer3DModel(WanConfig config, dit::DiTPart part = {}, TensorParallel tp = {});
  ~WanTransformer3DModel() override;

  std::string class_name() const override { return "WanTransformer3DModel"; }
  // "forward": hidden_states [B, C, F, H, W], timestep [B] or [1] (int64 or float),
  // encoder_hidden_states [B, L, text_dim], encoder_hidden_states_image [B, L_img, image_dim]
  // (I2V) -> {"sample": [B, out_C, F, H, W]}.
  using dit::DiTTransformer::call;  // forward_outputs(forward(parse_forward_inputs(inputs)))

  const WanConfig& config() const { return config_; }

  int64_t num_blocks() const override { return config_.num_layers; }
  int64_t num_heads() const override { return config_.num_attention_heads; }
  int64_t hidden_size() const override { return config_.inner_dim(); }
  dit::TextAttention text_attention() const override { return dit::TextAttention::kCross; }
  std::vector<int64_t> block_parameters() const override;
  // {patch_embedding, condition_embedder, norm_out/proj_out/scale_shift_table}.
  std::vector<int64_t> other_parameters() const override;
  c10::ScalarType dtype() const override;
  std::vector<std::string> layerwise_casting_skip_patterns() const override {
    return {"patch_embedding",
            "condition_embedder",
            "norm",
            "rope",
            "time_embedder",
            "scale_shift_table",
            "norm1",
            "norm2",
            "norm3"};
  }
  std::vector<std::string> block_list_prefixes() const override { return {"blocks."}; }

  void check_inputs(const dit::DiTInputs& in) const override;
  // call("forward")'s named tensors as token inputs (patchified, with token ids), checked.
  dit::DiTInputs parse_forward_inputs(const TensorMap& inputs) const override;
  // The token output [B, N, pt*ph*pw*out_C] back as {"sample": [B, out_C, F, H, W]} (F, H, W
  // from the inputs' hidden_states).
  TensorMap forward_outputs(const at::Tensor& tokens, const TensorMap& inputs) const override;
  // hidden [B, n, D] (with the embedders), context [B, (L_img +) L, D] (always: the image
  // embeddings first for I2V, as diffusers concatenates), temb [B|1, D],
  // extra["timestep_proj"] [B|1, 6, D], extra["context_image"] [B, L_img, D] (I2V: the image
  // part of the context, which tells the blocks where the text starts), rope per token.
  dit::DiTActivations embed(const dit::DiTInputs& in) const override;
  void run_blocks(dit::DiTActivations& a, int64_t begin, int64_t end) const override;
  at::Tensor finalize(const dit::DiTActivations& a) const override;  // [B, n, pt*ph*pw*out_C]

  // Input names call("forward") accepts, in diffusers' order.
  static const std::vector<std::string>& input_names();

  // [B, C, F, H, W] -> [B, F'H'W', C*pt*ph*pw]: token (f, i, j) (row-major over the grid) holds
  // latents[:, c, f*pt + a, i*ph + y, j*pw + x] at ((c*pt + a)*ph + y)*pw + x (the order of
  // diffusers' Conv3d weight [D, C, pt, ph, pw]).
  static at::Tensor patchify(const at::Tensor& latents, const std::vector<int64_t>& patch);
  // [B, F'H'W', pt*ph*pw*C] -> [B, C, F'pt, H'ph, W'pw]: diffusers' final reshape to
  // [B, F', H', W', pt, ph, pw, C], permute(0, 7, 1, 4, 2, 5, 3, 6) and flattens.
  static at::Tensor unpatchify(const at::Tensor& tokens, int64_t frames, int64_t height,
                               int64_t width, const std::vector<int64_t>& patch, int64_t channels);
  // [F'H'W', 3] float32 (f, h, w) of each token of the grid (row-major); `options` gives the
  // device.
  static at::Tensor token_ids(int64_t frames, int64_t height, int64_t width,
                              const at::TensorOptions& options);

 private:
  WanConfig config_;
  class PatchEmbedding;
  std::shared_ptr<PatchEmbedding> patch_embedding_;
  std::shared_ptr<WanConditionEmbedder> condition_embedder_;
  std::vector<std::shared_ptr<WanBlock>> blocks_;  // null outside the part
  std::shared_ptr<Linear> proj_out_;
  ParamSlot* scale_shift_table_ = nullptr;  // [1, 2, D], with the head
};

// Factory for the registries: WanConfig::from_json(config) -> an unloaded model for a part.
std::shared_ptr<dit::DiTTransformer> make_wan_transformer(const nlohmann::json& config,
                                                          const std::string& config_path,
                                                          dit::DiTPart part, TensorParallel tp);

}  // namespace xfuser::models::wan
