# AutoencoderKLFlux2 (FLUX.2's VAE): diffusers 0.36.0 fixture flux2-vae-tiny-s1 (encode, decode,
# the pipeline's bn normalisation of the patchified mode), patchify layout, config / weight /
# input errors.
xfuser_add_test(test_flux2_vae.cpp LABELS unit fixture)
# Patch-parallel decode of AutoencoderKLFlux2: bands of latent rows over 2 and 4 ranks equal the
# serial decode and diffusers' decode of the fixture.
xfuser_add_test(test_flux2_vae_parallel.cpp NP 2 TIMEOUT 120 LABELS mpi fixture)
xfuser_add_test(test_flux2_vae_parallel.cpp NP 4 TIMEOUT 120 LABELS mpi fixture)
