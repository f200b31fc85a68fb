# AutoencoderKLWan (the Wan 2.1 video VAE): diffusers fixture wan_vae-tiny-s1 (chunked encode,
# frame-by-frame decode), slicing, causality of the feature cache, config and input errors.
xfuser_add_test(test_wan_vae.cpp LABELS unit fixture)
# Patch-parallel decode of AutoencoderKLWan: bands of latent rows over 2 and 4 ranks equal the
# serial decode on both fixtures; as one process, xfuser-run tiny-wan with --use_parallel_vae
# under mpirun -np 2 writes the same frames as without.
xfuser_add_test(test_wan_vae_parallel.cpp NP 2 TIMEOUT 300 LABELS mpi fixture)
xfuser_add_test(test_wan_vae_parallel.cpp NP 4 TIMEOUT 300 LABELS mpi fixture)
xfuser_add_test(test_wan_vae_parallel.cpp TIMEOUT 300 LABELS fixture)
