# AutoencoderKLWan (the Wan 2.1 video VAE): diffusers fixture wan_vae-tiny-s1 (chunked encode,
# frame-by-frame decode), slicing, causality of the feature cache, config and input errors.
xfuser_add_test(test_wan_vae.cpp LABELS unit fixture)
