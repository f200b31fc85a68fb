#include "models/vae/autoencoder_kl.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/vae/vae_blocks.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::vae {
namespace {

using nlohmann::json;

// diffusers' blend_v / blend_h, in place on `b` like diffusers (later tiles read the blended
// neighbours): b[..., y, :] = a[..., -e + y, :] * (1 - y/e) + b[..., y, :] * (y/e), y < e.
void blend(const at::Tensor& a, at::Tensor& b, int64_t extent, int64_t dim) {
  extent = std::min({a.size(dim), b.size(dim), extent});
  if (extent <= 0) return;
  std::vector<double> ramp(extent);
  for (int64_t y = 0; y < extent; ++y) ramp[y] = static_cast<double>(y) / extent;
  std::vector<int64_t> shape(4, 1);
  shape[dim] = extent;
  at::Tensor w = at::tensor(ramp, at::kDouble).view(shape);  // y / e
  at::Tensor w_keep = (1.0 - w).to(at::kFloat);              // 1 - y / e, rounded once like torch
  at::Tensor w_take = w.to(at::kFloat);
  at::Tensor a_tail = a.narrow(dim, a.size(dim) - extent, extent).to(at::kFloat);
  at::Tensor b_head = b.narrow(dim, 0, extent);
  at::Tensor mixed = a_tail * w_keep + b_head.to(at::kFloat) * w_take;
  b_head.copy_(mixed);
}

// Cuts x [B, C, H, W] into overlapping tiles of up to `tile` x `tile` starting every `stride`
// rows/columns (diffusers' tiled_encode/tiled_decode grid) and maps each through `fn`.
template <typename Fn>
std::vector<std::vector<at::Tensor>> map_tiles(const at::Tensor& x, int64_t tile, int64_t stride,
                                               Fn fn) {
  std::vector<std::vector<at::Tensor>> rows;
  for (int64_t i = 0; i < x.size(2); i += stride) {
    std::vector<at::Tensor> row;
    for (int64_t j = 0; j < x.size(3); j += stride) {
      at::Tensor t =
          x.narrow(2, i, std::min(tile, x.size(2) - i)).narrow(3, j, std::min(tile, x.size(3) - j));
      row.push_back(fn(t).contiguous());
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// Blends each tile with its upper and left neighbours (in place, in diffusers' order), crops
// every tile to row_limit and stitches the grid: the second half of tiled_encode/tiled_decode.
at::Tensor blend_tiles(std::vector<std::vector<at::Tensor>>& rows, int64_t blend_extent,
                       int64_t row_limit) {
  std::vector<at::Tensor> result_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<at::Tensor> result_row;
    for (size_t j = 0; j < rows[i].size(); ++j) {
      at::Tensor& tile = rows[i][j];
      if (i > 0) blend(rows[i - 1][j], tile, blend_extent, 2);
      if (j > 0) blend(rows[i][j - 1], tile, blend_extent, 3);
      result_row.push_back(tile.narrow(2, 0, std::min(row_limit, tile.size(2)))
                               .narrow(3, 0, std::min(row_limit, tile.size(3))));
    }
    result_rows.push_back(at::cat(result_row, 3));
  }
  return at::cat(result_rows, 2);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Config.

AutoencoderKLConfig AutoencoderKLConfig::from_json(const json& j, const std::string& path) {
  const std::string where = path.empty() ? std::string("(memory)") : path;
  XF_CHECK(j.is_object(), "config ", where, " is not a JSON object");
  AutoencoderKLConfig c;
  c.in_channels = cfg(j, "in_channels", c.in_channels, path);
  c.out_channels = cfg(j, "out_channels", c.out_channels, path);
  c.down_block_types = cfg(j, "down_block_types", c.down_block_types, path);
  c.up_block_types = cfg(j, "up_block_types", c.up_block_types, path);
  c.block_out_channels = cfg(j, "block_out_channels", c.block_out_channels, path);
  // AutoencoderKLFlux2 (diffusers >= 0.42): null or absent is block_out_channels.
  if (auto it = j.find("decoder_block_out_channels"); it != j.end() && !it->is_null()) {
    c.decoder_block_out_channels =
        cfg(j, "decoder_block_out_channels", c.decoder_block_out_channels, path);
  }
  c.layers_per_block = cfg(j, "layers_per_block", c.layers_per_block, path);
  c.act_fn = cfg(j, "act_fn", c.act_fn, path);
  c.latent_channels = cfg(j, "latent_channels", c.latent_channels, path);
  c.norm_num_groups = cfg(j, "norm_num_groups", c.norm_num_groups, path);
  // An int, or a list whose first entry diffusers uses for the tile sizes.
  const json sample_size = cfg(j, "sample_size", json(c.sample_size), path);
  if (sample_size.is_array()) {
    auto sizes = cfg<std::vector<int64_t>>(j, "sample_size", {}, path);
    XF_CHECK(!sizes.empty(), "config ", where, ": sample_size is an empty list");
    c.sample_size = sizes[0];
  } else {
    c.sample_size = cfg(j, "sample_size", c.sample_size, path);
  }
  c.scaling_factor = cfg(j, "scaling_factor", c.scaling_factor, path);
  c.shift_factor = cfg(j, "shift_factor", c.shift_factor, path);
  c.latents_mean = cfg(j, "latents_mean", c.latents_mean, path);
  c.latents_std = cfg(j, "latents_std", c.latents_std, path);
  c.force_upcast = cfg(j, "force_upcast", c.force_upcast, path);
  c.use_quant_conv = cfg(j, "use_quant_conv", c.use_quant_conv, path);
  c.use_post_quant_conv = cfg(j, "use_post_quant_conv", c.use_post_quant_conv, path);
  c.mid_block_add_attention = cfg(j, "mid_block_add_attention", c.mid_block_add_attention, path);

  const size_t n = c.block_out_channels.size();
  XF_CHECK(n > 0, "config ", where, ": block_out_channels is empty");
  XF_CHECK(c.down_block_types.size() == n && c.up_block_types.size() == n, "config ", where,
           ": down_block_types (", c.down_block_types.size(), ") and up_block_types (",
           c.up_block_types.size(), ") need one entry per block_out_channels entry (", n, ")");
  for (const auto& t : c.down_block_types) {
    XF_CHECK(t == "DownEncoderBlock2D", "config ", where, ": down block type '", t,
             "' is not supported by AutoencoderKL (only DownEncoderBlock2D)");
  }
  for (const auto& t : c.up_block_types) {
    XF_CHECK(t == "UpDecoderBlock2D", "config ", where, ": up block type '", t,
             "' is not supported by AutoencoderKL (only UpDecoderBlock2D)");
  }
  for (auto ch : c.block_out_channels) {
    XF_CHECK(ch > 0 && c.norm_num_groups > 0 && ch % c.norm_num_groups == 0, "config ", where,
             ": block_out_channels entry ", ch, " is not divisible by norm_num_groups ",
             c.norm_num_groups);
  }
  if (!c.decoder_block_out_channels.empty()) {
    XF_CHECK(c.decoder_block_out_channels.size() == n, "config ", where,
             ": decoder_block_out_channels has ", c.decoder_block_out_channels.size(),
             " entries; the decoder's up blocks need one each (", n, ", as block_out_channels)");
    for (auto ch : c.decoder_block_out_channels) {
      XF_CHECK(ch > 0 && ch % c.norm_num_groups == 0, "config ", where,
               ": decoder_block_out_channels entry ", ch, " is not divisible by norm_num_groups ",
               c.norm_num_groups);
    }
  }
  XF_CHECK(c.in_channels > 0 && c.out_channels > 0 && c.latent_channels > 0 &&
               c.layers_per_block > 0 && c.sample_size > 0,
           "config ", where, ": in_channels, out_channels, latent_channels, layers_per_block and ",
           "sample_size must be positive");
  activation_from_name(c.act_fn);  // throws for an unknown act_fn
  return c;
}

// ---------------------------------------------------------------------------------------------
// Model.

AutoencoderKL::AutoencoderKL(AutoencoderKLConfig config) : config_(std::move(config)) {
  CoderConfig enc;
  enc.in_channels = config_.in_channels;
  enc.out_channels = config_.latent_channels;
  enc.block_out_channels = config_.block_out_channels;
  enc.layers_per_block = config_.layers_per_block;
  enc.norm_num_groups = config_.norm_num_groups;
  enc.act = activation_from_name(config_.act_fn);
  enc.mid_block_add_attention = config_.mid_block_add_attention;
  CoderConfig dec = enc;
  dec.in_channels = config_.latent_channels;
  dec.out_channels = config_.out_channels;
  if (!config_.decoder_block_out_channels.empty()) {
    dec.block_out_channels = config_.decoder_block_out_channels;
  }

  encoder_ = child("encoder", std::make_shared<Encoder>(enc));
  decoder_ = child("decoder", std::make_shared<Decoder>(dec));
  const int64_t lc = config_.latent_channels;
  if (config_.use_quant_conv) {
    quant_conv_ = child("quant_conv", std::make_shared<Conv2d>(2 * lc, 2 * lc, 1));
  }
  if (config_.use_post_quant_conv) {
    post_quant_conv_ = child("post_quant_conv", std::make_shared<Conv2d>(lc, lc, 1));
  }
  tile_sample_min_size_ = config_.sample_size;
  tile_latent_min_size_ = static_cast<int64_t>(static_cast<double>(config_.sample_size) /
                                               static_cast<double>(spatial_scale()));
}

int64_t AutoencoderKL::spatial_scale() const {
  return int64_t{1} << (config_.block_out_channels.size() - 1);
}

c10::ScalarType AutoencoderKL::dtype() const {
  const at::Tensor& w = decoder_->conv_in_weight();
  XF_CHECK(w.defined(), "AutoencoderKL used before its weights were loaded");
  return w.scalar_type();
}

void AutoencoderKL::set_tile_sizes(int64_t sample_min_size, int64_t latent_min_size,
                                   double overlap_factor) {
  XF_CHECK(
      sample_min_size > 0 && latent_min_size > 0 && overlap_factor >= 0.0 && overlap_factor < 1.0,
      "AutoencoderKL tile sizes must be positive and the overlap factor in [0, 1); got sample ",
      sample_min_size, ", latent ", latent_min_size, ", overlap ", overlap_factor);
  tile_sample_min_size_ = sample_min_size;
  tile_latent_min_size_ = latent_min_size;
  tile_overlap_factor_ = overlap_factor;
}

// --- encode ------------------------------------------------------------------------------------

at::Tensor AutoencoderKL::encode_moments(const at::Tensor& x) const {
  if (use_tiling_ && (x.size(3) > tile_sample_min_size_ || x.size(2) > tile_sample_min_size_)) {
    return tiled_encode_moments(x);
  }
  return encode_full(x);
}

at::Tensor AutoencoderKL::encode_full(const at::Tensor& x, const SpatialContext* ctx) const {
  at::Tensor h = encoder_->forward(x, ctx);  // [B, 2*latent, h, w]
  return quant_conv_ ? quant_conv_->forward(h, 1, 0) : h;
}

at::Tensor AutoencoderKL::tiled_encode_moments(const at::Tensor& x) const {
  const auto overlap_size =
      static_cast<int64_t>(static_cast<double>(tile_sample_min_size_) * (1 - tile_overlap_factor_));
  const auto blend_extent =
      static_cast<int64_t>(static_cast<double>(tile_latent_min_size_) * tile_overlap_factor_);
  const int64_t row_limit = tile_latent_min_size_ - blend_extent;
  XF_CHECK(overlap_size > 0, "tiled encode: tile stride int(", tile_sample_min_size_, " * (1 - ",
           tile_overlap_factor_, ")) is 0");
  auto rows = map_tiles(x, tile_sample_min_size_, overlap_size, [&](const at::Tensor& tile) {
    at::Tensor h = encoder_->forward(tile);
    return quant_conv_ ? quant_conv_->forward(h, 1, 0) : h;
  });
  return blend_tiles(rows, blend_extent, row_limit);
}

DiagonalGaussian AutoencoderKL::encode(const at::Tensor& x) const {
  at::Tensor moments;
  if (use_slicing_ && x.size(0) > 1) {
    std::vector<at::Tensor> parts;
    for (const auto& s : x.split(1)) parts.push_back(encode_moments(s));
    moments = at::cat(parts);
  } else {
    moments = encode_moments(x);
  }
  return posterior(moments);
}

DiagonalGaussian AutoencoderKL::posterior(const at::Tensor& moments) {
  DiagonalGaussian post;
  auto halves = moments.chunk(2, 1);  // [B, latent, h, w] each
  post.mean = halves[0];
  at::Tensor logvar = halves[1].to(at::kFloat).clamp(-30.0, 20.0);
  post.std = at::exp(0.5 * logvar).to(moments.scalar_type());
  post.logvar = logvar.to(moments.scalar_type());
  return post;
}

// --- decode ------------------------------------------------------------------------------------

at::Tensor AutoencoderKL::decode_full(const at::Tensor& z, const SpatialContext* ctx) const {
  at::Tensor h = post_quant_conv_ ? post_quant_conv_->forward(z, 1, 0) : z;
  return decoder_->forward(h, ctx);
}

at::Tensor AutoencoderKL::decode_one(const at::Tensor& z) const {
  if (use_tiling_ && (z.size(3) > tile_latent_min_size_ || z.size(2) > tile_latent_min_size_)) {
    return tiled_decode(z);
  }
  return decode_full(z);
}

at::Tensor AutoencoderKL::tiled_decode(const at::Tensor& z) const {
  const auto overlap_size =
      static_cast<int64_t>(static_cast<double>(tile_latent_min_size_) * (1 - tile_overlap_factor_));
  const auto blend_extent =
      static_cast<int64_t>(static_cast<double>(tile_sample_min_size_) * tile_overlap_factor_);
  const int64_t row_limit = tile_sample_min_size_ - blend_extent;
  XF_CHECK(overlap_size > 0, "tiled decode: tile stride int(", tile_latent_min_size_, " * (1 - ",
           tile_overlap_factor_, ")) is 0");
  // Overlapping latent tiles of tile_latent_min_size, decoded separately.
  auto rows = map_tiles(z, tile_latent_min_size_, overlap_size,
                        [&](const at::Tensor& tile) { return decode_full(tile); });
  return blend_tiles(rows, blend_extent, row_limit);
}

at::Tensor AutoencoderKL::decode(const at::Tensor& z) const {
  if (use_slicing_ && z.size(0) > 1) {
    std::vector<at::Tensor> parts;
    for (const auto& s : z.split(1)) parts.push_back(decode_one(s));
    return at::cat(parts);
  }
  return decode_one(z);
}

// --- call --------------------------------------------------------------------------------------

void AutoencoderKL::check_input(const std::string& method, const std::string& name,
                                const at::Tensor& t, int64_t channels) const {
  XF_CHECK(t.defined(), "AutoencoderKL.", method, ": input '", name, "' is undefined");
  XF_CHECK(t.dim() == 4 && t.size(1) == channels && t.size(0) > 0 && t.size(2) > 0 && t.size(3) > 0,
           "AutoencoderKL.", method, ": input '", name, "' has shape ", shape_string(t.sizes()),
           ", expected [B, ", channels, ", H, W]");
  XF_CHECK(t.is_floating_point(), "AutoencoderKL.", method, ": input '", name,
           "' must be a floating-point tensor, got ", t.scalar_type());
}

uint64_t AutoencoderKL::activation_bytes(const ActivationQuery& q) const {
  if (q.method == "encode") {
    // The encoder's first level: block_out_channels[0] channels at full resolution (measured:
    // bench/run_plan_check).
    return vae::decoder_peak_bytes(static_cast<uint64_t>(q.batch * q.height * q.width),
                                   config_.block_out_channels.front(), 3.4 * q.bytes + 8.3, 0, 0,
                                   q.batch, q.cpu);
  }
  if (q.method != "decode") return 0;
  // A tile at a time with tiling, into the whole image in fp32.
  int64_t h = q.height, w = q.width;
  uint64_t output = 0;
  if (q.tiled && (h > tile_sample_min_size_ || w > tile_sample_min_size_)) {
    h = std::min(h, tile_sample_min_size_);
    w = std::min(w, tile_sample_min_size_);
    output = 2 * static_cast<uint64_t>(q.batch * config_.out_channels * q.height * q.width) * 4;
  }
  const auto& c = config_.block_out_channels;
  const int64_t channels = c.size() > 1 ? std::max(c[0], c[1]) : c[0];
  // ~4 maps in the compute dtype and 8 bytes of fp32 GroupNorm temporaries per element
  // (measured: bench/run_plan_check).
  return decoder_peak_bytes(static_cast<uint64_t>(q.batch * h * w), channels, 4.15 * q.bytes + 8.0,
                            0, 0, q.batch, q.cpu) +
         output;
}

TensorMap AutoencoderKL::call(const std::string& method, const TensorMap& inputs) {
  XF_CONTEXT("AutoencoderKL.", method);
  c10::InferenceMode guard;
  const std::string input_name = method == "decode" ? "z" : "sample";
  XF_CHECK(method == "decode" || method == "encode" || method == "forward",
           "AutoencoderKL has no method '", method, "' (known: forward, encode, decode)");
  for (const auto& [name, tensor] : inputs) {
    XF_CHECK(name == input_name, "AutoencoderKL.", method, ": unknown input '", name,
             "' (accepted: ", input_name, ")");
  }
  auto it = inputs.find(input_name);
  XF_CHECK(it != inputs.end(), "AutoencoderKL.", method, ": missing input '", input_name, "'");
  const int64_t channels = method == "decode" ? config_.latent_channels : config_.in_channels;
  check_input(method, input_name, it->second, channels);
  at::Tensor x = it->second.to(dtype());

  if (method == "decode") return {{"sample", decode(x)}};
  DiagonalGaussian post = encode(x);
  if (method == "encode") {
    return {
        {"latent_dist_mean", post.mean}, {"latent_dist_std", post.std}, {"sample", post.mode()}};
  }
  return {{"sample", decode(post.mode())}};
}

}  // namespace xfuser::models::vae
