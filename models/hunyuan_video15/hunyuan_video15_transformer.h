// HunyuanVideo15Transformer3DModel (diffusers 0.36.0, HunyuanVideo-1.5 text- and image-to-video):
// diffusers' module tree, parameter names and math, as a dit::DiTTransformer. The token refiner,
// the patch embedding, the rotary tables and the dual-stream block are HunyuanVideo 1.0's
// (models/hunyuan_video/hunyuan_video_blocks.h): same module trees and names.
//
// Inputs (call("forward"), diffusers' names): hidden_states [B, in_channels, F, H, W] (the
// pipelines concatenate [latents | image-condition latents | mask] on the channels; zeros for
// t2v), timestep [B] or [1], encoder_hidden_states [B, L1, text_embed_dim] (Qwen2.5-VL) with
// encoder_attention_mask [B, L1], encoder_hidden_states_2 [B, L2, text_embed_2_dim] (ByT5 glyphs)
// with encoder_attention_mask_2 [B, L2], image_embeds [B, N3, image_embed_dim] (SigLIP; all zeros
// = t2v), timestep_r [B] or [1] (only with use_meanflow). Masks are 0/1 (any real or bool dtype).
//
// Token level (models/dit/dit.h): DiTInputs.tokens are the (pt, p, p) patches of hidden_states
// (HunyuanVideoTransformer3DModel::patchify), token_ids their (f, h, w); text / text_mask the
// Qwen stream; extra[kTextEmbeds2] / extra[kTextMask2] (bool) the glyph stream,
// extra[kImageEmbeds] the image embeddings, extra[kTimestepR] timestep_r.
//
//   embed       time_embed (Timesteps(256) -> timestep_embedder [+ timestep_embedder_r of
//               timestep_r]); x_embedder; context_embedder (the token refiner of the Qwen text,
//               pairs of valid tokens only) + cond_type_embed[0]; context_embedder_2 (the ByT5
//               projector: LayerNorm, 3 linears with GELU) + cond_type_embed[1]; image_embedder
//               (LayerNorm, linear, GELU, linear, LayerNorm) + cond_type_embed[2], times 0 and
//               masked when image_embeds is all zeros over the whole batch (t2v), else all
//               valid. Then diffusers' reordering per batch row: [valid image, valid glyph, valid
//               Qwen, padded image, padded glyph (zeros), padded Qwen (zeros)] is the text
//               stream, of which the first L = max_b count_b tokens are kept (below); the
//               rotary tables of the image tokens.
//   blocks      transformer_blocks (HunyuanVideo's double-stream block: one joint attention over
//               [image, text], QK RMSNorm, RoPE on the image rows).
//   finalize    norm_out (AdaLayerNormContinuous) + proj_out on the image tokens.
//
// Masks. diffusers masks the joint attention pairwise (query and key both valid) after the
// reordering, so a row's valid text tokens are its first count_b = N3' + sum(mask_2) + sum(mask)
// text tokens. Here the image queries and the valid text queries see exactly the image keys and
// those first count_b text keys (a key mask, AttentionCall::text_key_mask [B, L]); the padded
// text queries, fully masked in diffusers, see the same keys here: their rows only ever act as
// masked keys, so the image output is the same (and stays finite). The text columns padded in
// every row (from max_b count_b on) are therefore dropped: exact, and the blocks never see t2v's
// image tokens or a batch's common padding. No mask when every row counts the same valid tokens.
//
// Parallelism. dit::TextAttention::kJointImageFirst with text_whole(): the token refiner and the
// reordering work on the whole text, so the sequence-parallel drivers keep the text stream
// replicated on every rank and pass the key mask of the replicated text. Tensor parallelism
// (degree n) splits the blocks by whole heads as HunyuanVideo does (q/k/v and the modulation
// linears column-parallel, to_out / to_add_out / ff.net.2 row-parallel); the embedders, the
// token refiner and the head are replicated. PipeFusion sends text_tokens(in) text rows between
// stages and takes no text mask: it runs batches whose rows count the same valid tokens (one
// prompt a branch, e.g. under CFG parallel); other batches are refused by its attention.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/dit/dit.h"
#include "models/hunyuan_video15/hunyuan_video15_config.h"

namespace xfuser::models::hunyuan_video {
class HunyuanVideoTokenRefiner;
class HunyuanVideoPatchEmbed;
class HunyuanVideoTransformerBlock;
}  // namespace xfuser::models::hunyuan_video

namespace xfuser::models::hunyuan_video15 {

class HunyuanVideo15ByT5TextProjection;
class HunyuanVideo15ImageProjection;

class HunyuanVideo15Transformer3DModel : public dit::DiTTransformer {
 public:
  // Names of the family's inputs in DiTInputs::extra.
  static constexpr const char* kTextEmbeds2 = "encoder_hidden_states_2";
  static constexpr const char* kTextMask2 = "encoder_attention_mask_2";
  static constexpr const char* kImageEmbeds = "image_embeds";
  static constexpr const char* kTimestepR = "timestep_r";
  // The text key mask in DiTActivations::extra ([B, L] bool; only when a text key is masked).
  static constexpr const char* kTextKeyMask = "text_key_mask";

  // `part`: the blocks this instance holds; the embedders (x, image, both text ones, cond_type)
  // only with part.embedders, norm_out/proj_out only with part.head, time_embed on every part.
  // With `tp` of size n > 1 this rank holds heads [r*H/n, (r+1)*H/n) and its slices of every
  // block's linear layers (num_attention_heads and the feed-forward width must divide by n); the
  // forward then needs set_tensor_parallel_ops.
  explicit HunyuanVideo15Transformer3DModel(HunyuanVideo15Config config, dit::DiTPart part = {},
                                            TensorParallel tp = {});
  ~HunyuanVideo15Transformer3DModel() override;

  std::string class_name() const override { return "HunyuanVideo15Transformer3DModel"; }
  // "forward": the inputs above -> {"sample": [B, out_channels, F, H, W]}.
  using dit::DiTTransformer::call;

  const HunyuanVideo15Config& config() const { return config_; }

  int64_t num_blocks() const override { return config_.num_layers; }
  int64_t num_heads() const override { return config_.num_attention_heads; }
  int64_t hidden_size() const override { return config_.inner_dim(); }
  dit::TextAttention text_attention() const override {
    return dit::TextAttention::kJointImageFirst;
  }
  // The token refiner and the reordering of the three streams need the whole text.
  bool text_whole() const override { return true; }
  // max_b count_b: the valid tokens of the row that has the most (the text stream embed() keeps).
  int64_t text_tokens(const dit::DiTInputs& in) const override;
  std::vector<int64_t> block_parameters() const override;
  // {x_embedder + image_embedder + context_embedder(_2) + cond_type_embed, time_embed,
  //  norm_out + proj_out}.
  std::vector<int64_t> other_parameters() const override;
  c10::ScalarType dtype() const override;
  std::vector<std::string> layerwise_casting_skip_patterns() const override {
    return {"x_embedder", "context_embedder", "norm"};
  }
  std::vector<std::string> block_list_prefixes() const override { return {"transformer_blocks."}; }

  void check_inputs(const dit::DiTInputs& in) const override;
  // call("forward")'s named tensors as token inputs (patchified, with token ids), checked.
  dit::DiTInputs parse_forward_inputs(const TensorMap& inputs) const override;
  // The token output [B, N, out_C*pt*p*p] back as {"sample": [B, out_C, F, H, W]}.
  TensorMap forward_outputs(const at::Tensor& tokens, const TensorMap& inputs) const override;
  // hidden [B, n, D] and context [B, L, D] (the reordered text stream, L = max_b count_b valid
  // tokens; with the embedders), temb
  // [B|1, D], rope of the image tokens [n, head_dim], extra[kTextKeyMask] [B, L] bool (only when
  // a text key is masked). Without the embedders text_tokens is still set (from the inputs).
  dit::DiTActivations embed(const dit::DiTInputs& in) const override;
  void run_blocks(dit::DiTActivations& a, int64_t begin, int64_t end) const override;
  at::Tensor finalize(const dit::DiTActivations& a) const override;  // [B, n, out_C*pt*p*p]

  // Input names call("forward") accepts, in diffusers' order.
  static const std::vector<std::string>& input_names();

 private:
  HunyuanVideo15Config config_;
  std::shared_ptr<hunyuan_video::HunyuanVideoPatchEmbed> x_embedder_;
  std::shared_ptr<HunyuanVideo15ImageProjection> image_embedder_;
  std::shared_ptr<hunyuan_video::HunyuanVideoTokenRefiner> context_embedder_;
  std::shared_ptr<HunyuanVideo15ByT5TextProjection> context_embedder_2_;
  std::shared_ptr<TimestepEmbedding> timestep_embedder_, timestep_embedder_r_;
  ParamSlot* cond_type_embed_ = nullptr;  // [3, D]
  std::vector<std::shared_ptr<hunyuan_video::HunyuanVideoTransformerBlock>> blocks_;
  std::shared_ptr<AdaLayerNormContinuous> norm_out_;
  std::shared_ptr<Linear> proj_out_;
};

// Factory for the registries: HunyuanVideo15Config::from_json(config) -> an unloaded model for a
// part and a tensor-parallel rank.
std::shared_ptr<dit::DiTTransformer> make_hunyuan_video15_transformer(
    const nlohmann::json& config, const std::string& config_path, dit::DiTPart part,
    TensorParallel tp);

}  // namespace xfuser::models::hunyuan_video15
