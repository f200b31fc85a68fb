# FLUX.2: the Flux2Transformer2DModel (diffusers 0.36.0 fixtures, parts and block ranges, tensor
# parallel slices, config / weight / input errors).
xfuser_add_test(test_flux2_transformer.cpp LABELS unit fixture)
