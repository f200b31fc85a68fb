// Registers the VAE component classes (AutoencoderKL) with the ComponentRegistry.
#pragma once

namespace xfuser::models {

// Adds "AutoencoderKL"; called from register_builtin_components().
void register_vae();

}  // namespace xfuser::models
