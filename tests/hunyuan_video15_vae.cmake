# HunyuanVideo-1.5's VAE (AutoencoderKLHunyuanVideo15) against diffusers 0.36.0 (fixture
# hunyuan_video15-vae-tiny-s1: encode, decode, tiled encode / decode), slicing, config / tiling /
# input errors.
xfuser_add_test(test_hunyuan_video15_vae.cpp LABELS unit fixture)
# Patch-parallel decode: bands of latent rows over 2 and 4 ranks equal the serial decode and
# diffusers' decode of the fixture.
xfuser_add_test(test_hunyuan_video15_vae_parallel.cpp NP 2 TIMEOUT 120 LABELS mpi fixture)
xfuser_add_test(test_hunyuan_video15_vae_parallel.cpp NP 4 TIMEOUT 120 LABELS mpi fixture)
