# SD3 / SD3.5: the SD3Transformer2DModel (diffusers fixtures, parts, token path, `xfuser forward`),
# its tensor parallelism against one rank, and the tiny StableDiffusion3Pipeline folder.
xfuser_add_test(test_sd3_transformer.cpp LABELS unit fixture)
xfuser_add_test(test_sd3_tensor_parallel.cpp NP 2 TIMEOUT 300)
xfuser_add_test(test_sd3_tiny.cpp)
xfuser_add_test(test_sd3_sequence_parallel.cpp NP 2 TIMEOUT 300)
