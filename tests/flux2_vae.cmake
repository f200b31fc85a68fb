# AutoencoderKLFlux2 (FLUX.2's VAE): diffusers 0.36.0 fixture flux2-vae-tiny-s1 (encode, decode,
# the pipeline's bn normalisation of the patchified mode), patchify layout, config / weight /
# input errors.
xfuser_add_test(test_flux2_vae.cpp LABELS unit fixture)
