# FP8 weights: the codec (against libtorch's own conversion in the torch 2.x build), the weight
# formats, FP8 GEMMs, and fp8 storage against diffusers' layerwise casting for every family.
xfuser_add_test(test_fp8.cpp TIMEOUT 300 LABELS unit torch2)
