#include "models/flux2/flux2_vae.h"

#include <memory>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/common/component.h"
#include "models/weights/component_folder.h"

namespace xfuser::models::flux2 {

using nlohmann::json;

int64_t AutoencoderKLFlux2Config::bn_channels() const {
  int64_t n = kl.latent_channels;
  for (auto p : patch_size) n *= p;
  return n;
}

AutoencoderKLFlux2Config AutoencoderKLFlux2Config::from_json(const json& j,
                                                             const std::string& path) {
  const std::string where = path.empty() ? std::string("(memory)") : path;
  XF_CHECK(j.is_object(), "config ", where, " is not a JSON object");
  // diffusers' AutoencoderKLFlux2 defaults, overridden by the file's keys.
  json merged = {
      {"in_channels", 3},
      {"out_channels", 3},
      {"down_block_types", std::vector<std::string>(4, "DownEncoderBlock2D")},
      {"up_block_types", std::vector<std::string>(4, "UpDecoderBlock2D")},
      {"block_out_channels", std::vector<int64_t>{128, 256, 512, 512}},
      {"layers_per_block", 2},
      {"act_fn", "silu"},
      {"latent_channels", 32},
      {"norm_num_groups", 32},
      {"sample_size", 1024},
      {"force_upcast", true},
      {"use_quant_conv", true},
      {"use_post_quant_conv", true},
      {"mid_block_add_attention", true},
  };
  merged.update(j);
  AutoencoderKLFlux2Config c;
  c.kl = vae::AutoencoderKLConfig::from_json(merged, path);  // with decoder_block_out_channels
  c.batch_norm_eps = cfg(j, "batch_norm_eps", c.batch_norm_eps, path);
  c.batch_norm_momentum = cfg(j, "batch_norm_momentum", c.batch_norm_momentum, path);
  c.patch_size = cfg(j, "patch_size", c.patch_size, path);
  XF_CHECK(c.patch_size.size() == 2 && c.patch_size[0] > 0 && c.patch_size[1] > 0, "config ", where,
           ": patch_size must be two positive integers");
  XF_CHECK(c.batch_norm_eps >= 0.0, "config ", where, ": batch_norm_eps must be >= 0, got ",
           c.batch_norm_eps);
  return c;
}

AutoencoderKLFlux2::AutoencoderKLFlux2(AutoencoderKLFlux2Config config)
    : vae::AutoencoderKL(config.kl), flux2_config_(std::move(config)) {
  const int64_t n = flux2_config_.bn_channels();
  bn_mean_ = &param("bn.running_mean", {n});
  bn_var_ = &param("bn.running_var", {n});
}

void AutoencoderKLFlux2::load(const TensorSource& source, c10::ScalarType dtype,
                              const std::string& prefix, const LoadOptions& options) {
  LoadOptions opts = options;
  // BatchNorm2d's step counter (int64, training only).
  opts.ignore_unexpected_prefixes.push_back("bn.num_batches_tracked");
  vae::AutoencoderKL::load(source, dtype, prefix, opts);
}

at::Tensor AutoencoderKLFlux2::bn_running_mean() const {
  XF_CHECK(bn_mean_->loaded(), "AutoencoderKLFlux2: bn.running_mean read before load()");
  return bn_mean_->value();
}

at::Tensor AutoencoderKLFlux2::bn_running_var() const {
  XF_CHECK(bn_var_->loaded(), "AutoencoderKLFlux2: bn.running_var read before load()");
  return bn_var_->value();
}

at::Tensor AutoencoderKLFlux2::bn_std() const {
  return at::sqrt(bn_running_var() + flux2_config_.batch_norm_eps);
}

at::Tensor AutoencoderKLFlux2::patchify(const at::Tensor& x) const {
  const int64_t ph = flux2_config_.patch_size[0], pw = flux2_config_.patch_size[1];
  XF_CHECK(x.defined() && x.dim() == 4 && x.size(1) == flux2_config_.kl.latent_channels &&
               x.size(2) % ph == 0 && x.size(3) % pw == 0,
           "AutoencoderKLFlux2.patchify: latents have shape ",
           x.defined() ? shape_string(x.sizes()) : std::string("(undefined)"), ", expected [B, ",
           flux2_config_.kl.latent_channels, ", h, w] with h divisible by ", ph,
           " and w divisible by ", pw);
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  return x.reshape({b, c, h / ph, ph, w / pw, pw})
      .permute({0, 1, 3, 5, 2, 4})
      .reshape({b, c * ph * pw, h / ph, w / pw});
}

void AutoencoderKLFlux2::check_patchified(const char* what, const at::Tensor& x) const {
  XF_CHECK(x.defined() && x.dim() == 4 && x.size(1) == flux2_config_.bn_channels(),
           "AutoencoderKLFlux2.", what, ": latents have shape ",
           x.defined() ? shape_string(x.sizes()) : std::string("(undefined)"), ", expected [B, ",
           flux2_config_.bn_channels(), ", h, w] (patchified)");
}

at::Tensor AutoencoderKLFlux2::unpatchify(const at::Tensor& x) const {
  check_patchified("unpatchify", x);
  const int64_t ph = flux2_config_.patch_size[0], pw = flux2_config_.patch_size[1];
  const int64_t b = x.size(0), c = x.size(1) / (ph * pw), h = x.size(2), w = x.size(3);
  return x.reshape({b, c, ph, pw, h, w})
      .permute({0, 1, 4, 2, 5, 3})
      .reshape({b, c, h * ph, w * pw});
}

at::Tensor AutoencoderKLFlux2::normalize_latents(const at::Tensor& x) const {
  check_patchified("normalize_latents", x);
  // diffusers: mean cast to the latents' dtype; std computed in the buffers' dtype.
  at::Tensor mean = bn_running_mean().view({1, -1, 1, 1}).to(x.device(), x.scalar_type());
  at::Tensor std = bn_std().view({1, -1, 1, 1}).to(x.device());
  return (x - mean) / std;
}

at::Tensor AutoencoderKLFlux2::denormalize_latents(const at::Tensor& x) const {
  check_patchified("denormalize_latents", x);
  at::Tensor mean = bn_running_mean().view({1, -1, 1, 1}).to(x.device(), x.scalar_type());
  at::Tensor std = bn_std().view({1, -1, 1, 1}).to(x.device(), x.scalar_type());
  return x * std + mean;
}

void register_flux2_vae_components() {
  ComponentRegistry::add("AutoencoderKLFlux2", [](const json& config, const std::string& path) {
    return std::make_shared<AutoencoderKLFlux2>(AutoencoderKLFlux2Config::from_json(config, path));
  });
}

}  // namespace xfuser::models::flux2
