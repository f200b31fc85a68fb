// HunyuanVideoTransformer3DModel (diffusers v0.33.1, text-to-video; image_condition_type null or
// "latent_concat"): diffusers' module tree, parameter names and math, as a dit::DiTTransformer.
//
// Token level (models/dit/dit.h): DiTInputs.tokens are the latents [B, C, F, H, W] cut into
// (pt, p, p) patches (patchify), token_ids each token's (f, h, w) on the patch grid; the rotary
// tables (HunyuanVideoRotaryPosEmbed: 3 axes of rope_axes_dim, theta rope_theta, float32
// frequencies) are computed per token from token_ids, so any subset of the tokens embeds exactly
// as in the full video. DiTInputs.text is encoder_hidden_states [B, L, text_embed_dim],
// text_mask the encoder_attention_mask [B, L] (bool; undefined = every text token valid), pooled
// the pooled_projections, guidance the embedded guidance; extra["text_tokens"] ([1] int64 in host
// memory, set by parse_forward_inputs and the pipeline) the whole text's length, so that a text
// split over sequence-parallel ranks is an error (the token refiner needs the whole text; see
// "Parallelism" below).
//
//   embed       x_embedder (Conv3d as a matmul over patches); time_text_embed (timestep +
//               pooled text + guidance); context_embedder (HunyuanVideoTokenRefiner: the masked
//               mean of the text -> its own time+text embedding, proj_in, refiner blocks whose
//               self-attention sees text pairs (i, j) both valid, plus key 0 for every query, as
//               diffusers builds it); the rotary tables of the image tokens.
//   blocks      transformer_blocks (double stream: AdaLayerNormZero on both streams, one joint
//               attention over [image, text] with QK RMSNorm and RoPE on the image rows only),
//               then single_transformer_blocks on the joined [image, text] sequence.
//   finalize    norm_out (AdaLayerNormContinuous) + proj_out on the image tokens.
//
// The text mask in the blocks follows diffusers exactly: for batch row b the keys attended are the
// first N + sum(encoder_attention_mask[b]) of the [image, text] sequence, i.e. text keys
// j < count_b whatever the mask's pattern (a [B, S] key mask; queries are never masked). When
// every row counts all L tokens no mask is passed. The text is never truncated here (a pipeline
// may drop the text rows >= max_b count_b beforehand: that is exact for the image output).
//
// Text attention is dit::TextAttention::kJointImageFirst. The token refiner's attention (text
// only, under its pairwise mask) runs on the local backends op, not through the hook: it is part
// of the text embedding, which needs the whole text (its masked mean and self-attention are not
// per token). Attention layer indices given to the hook: double block i -> i, single block j ->
// num_layers + j.
//
// Parallelism. Tensor parallelism (degree n) splits the blocks by whole heads as FLUX does (q/k/v
// and the modulation linears column-parallel, to_out / to_add_out / ff.net.2 / proj_out
// row-parallel); the embedders, the token refiner and the head are replicated. Sequence
// parallelism (models/dit/dit_parallel.cpp) keeps the text whole on every rank (text_whole():
// TextMode::kReplicated whatever its length) and passes the masked text keys as
// AttentionCall::text_key_mask, which UspAttention applies to the replicated text keys (the image
// keys are all real). A text split over the ranks (a caller of embed that shards it) is refused
// (check_inputs / embed). PipeFusion keeps the text whole too but takes no text mask: a pipeline
// drops the padded text rows first (exact), which leaves no mask when the prompts of a batch have
// the same token count.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/dit/dit.h"
#include "models/hunyuan_video/hunyuan_video_config.h"

namespace xfuser::models::hunyuan_video {

class HunyuanVideoTokenRefiner;
class HunyuanVideoPatchEmbed;
class HunyuanVideoConditionEmbedding;
class HunyuanVideoTransformerBlock;
class HunyuanVideoSingleTransformerBlock;

class HunyuanVideoTransformer3DModel : public dit::DiTTransformer {
 public:
  // `part`: the blocks this instance holds (blocks in forward order: double, then single);
  // parameters of the parts not held are not declared (load with LoadOptions::allow_unexpected).
  // time_text_embed is on every part. With `tp` of size n > 1 this rank holds heads
  // [r*H/n, (r+1)*H/n) and its slices of every block's linear layers; the forward then needs
  // set_tensor_parallel_ops.
  explicit HunyuanVideoTransformer3DModel(HunyuanVideoConfig config, dit::DiTPart part = {},
                                          TensorParallel tp = {});
  ~HunyuanVideoTransformer3DModel() override;

  std::string class_name() const override { return "HunyuanVideoTransformer3DModel"; }
  // "forward": hidden_states [B, C, F, H, W], timestep [B] or [1] (int64 or float),
  // encoder_hidden_states [B, L, text_embed_dim], encoder_attention_mask [B, L] (0/1, any real
  // dtype), pooled_projections [B, pooled_projection_dim], guidance [B] or [1] (with
  // guidance_embeds) -> {"sample": [B, out_C, F, H, W]}.
  using dit::DiTTransformer::call;  // forward_outputs(forward(parse_forward_inputs(inputs)))

  const HunyuanVideoConfig& config() const { return config_; }

  int64_t num_blocks() const override { return config_.num_layers + config_.num_single_layers; }
  int64_t num_heads() const override { return config_.num_attention_heads; }
  int64_t hidden_size() const override { return config_.inner_dim(); }
  bool joined_at(int64_t block) const override { return block >= config_.num_layers; }
  dit::TextAttention text_attention() const override {
    return dit::TextAttention::kJointImageFirst;
  }
  // The token refiner embeds the text as a whole: the drivers keep it on every rank.
  bool text_whole() const override { return true; }
  std::vector<int64_t> block_parameters() const override;
  // {x_embedder + context_embedder, time_text_embed, norm_out + proj_out}.
  std::vector<int64_t> other_parameters() const override;
  c10::ScalarType dtype() const override;
  std::vector<std::string> layerwise_casting_skip_patterns() const override {
    return {"x_embedder", "context_embedder", "norm"};
  }
  std::vector<std::string> block_list_prefixes() const override {
    return {"transformer_blocks.", "single_transformer_blocks."};
  }
  // transformer_blocks.0.norm1's modulated image input (TeaCache4HunyuanVideo's signal).
  at::Tensor teacache_input(const dit::DiTActivations& a) const override;

  void check_inputs(const dit::DiTInputs& in) const override;
  // call("forward")'s named tensors as token inputs (patchified, with token ids), checked.
  dit::DiTInputs parse_forward_inputs(const TensorMap& inputs) const override;
  // The token output [B, N, out_C*pt*p*p] back as {"sample": [B, out_C, F, H, W]} (F, H, W
  // from the inputs' hidden_states).
  TensorMap forward_outputs(const at::Tensor& tokens, const TensorMap& inputs) const override;
  // hidden [B, n, D] and context [B, L, D] (with the embedders), temb [B|1, D], rope of the
  // image tokens [n, head_dim], extra["text_key_mask"] [B, L] bool (only when a text key is
  // masked).
  dit::DiTActivations embed(const dit::DiTInputs& in) const override;
  void run_blocks(dit::DiTActivations& a, int64_t begin, int64_t end) const override;
  at::Tensor finalize(const dit::DiTActivations& a) const override;  // [B, n, out_C*pt*p*p]

  // Input names call("forward") accepts, in diffusers' order.
  static const std::vector<std::string>& input_names();

  // [B, C, F, H, W] -> [B, F'H'W', C*pt*p*p]: token (f, i, j) (row-major over the grid) holds
  // latents[:, c, f*pt + a, i*p + y, j*p + x] at ((c*pt + a)*p + y)*p + x (the order of the
  // Conv3d weight [D, C, pt, p, p]).
  static at::Tensor patchify(const at::Tensor& latents, int64_t patch_t, int64_t patch);
  // [B, F'H'W', C*pt*p*p] -> [B, C, F'pt, H'p, W'p]: diffusers' final reshape to
  // [B, F', H', W', C, pt, p, p], permute(0, 4, 1, 5, 2, 6, 3, 7) and flattens.
  static at::Tensor unpatchify(const at::Tensor& tokens, int64_t frames, int64_t height,
                               int64_t width, int64_t patch_t, int64_t patch, int64_t channels);
  // [F'H'W', 3] float32 (f, h, w) of each token of the grid (row-major); `options` gives the
  // device.
  static at::Tensor token_ids(int64_t frames, int64_t height, int64_t width,
                              const at::TensorOptions& options);
  // HunyuanVideoRotaryPosEmbed for tokens at `ids` [N, 3]: per axis i get_1d_rotary_pos_embed(
  // axes_dim[i], ids[:, i], theta, use_real=True) in float32 (diffusers' default freqs_dtype),
  // concatenated: cos/sin [N, sum(axes_dim)] float32.
  static RotaryTables rope(const at::Tensor& ids, const std::vector<int64_t>& axes_dim,
                           double theta);

 private:
  HunyuanVideoConfig config_;
  std::shared_ptr<HunyuanVideoPatchEmbed> x_embedder_;
  std::shared_ptr<HunyuanVideoTokenRefiner> context_embedder_;
  std::shared_ptr<HunyuanVideoConditionEmbedding> time_text_embed_;
  std::vector<std::shared_ptr<HunyuanVideoTransformerBlock>> blocks_;  // null outside the part
  std::vector<std::shared_ptr<HunyuanVideoSingleTransformerBlock>> single_blocks_;
  std::shared_ptr<AdaLayerNormContinuous> norm_out_;
  std::shared_ptr<Linear> proj_out_;
};

// DiTInputs.extra["text_tokens"] for a text stream [B, L, C]: [1] int64 holding L, in host
// memory (the checks read it; a read of device memory would synchronise every step).
at::Tensor text_tokens_tensor(const at::Tensor& text);

// Factory for the registries: HunyuanVideoConfig::from_json(config) -> an unloaded model for a
// part and a tensor-parallel rank.
std::shared_ptr<dit::DiTTransformer> make_hunyuan_video_transformer(const nlohmann::json& config,
                                                                    const std::string& config_path,
                                                                    dit::DiTPart part,
                                                                    TensorParallel tp);

}  // namespace xfuser::models::hunyuan_video
