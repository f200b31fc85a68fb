# FLUX: the attention op, the FluxTransformer2DModel and the `xfuser forward` tool.
xfuser_add_test(test_attention.cpp LABELS unit torch2)
xfuser_add_test(test_flux_transformer.cpp LABELS unit fixture)
xfuser_add_test(test_forward_tool.cpp LABELS unit fixture)
# FLUX.1-Kontext against diffusers' FluxKontextPipeline (a ~1 MP reference encode: not a unit test).
xfuser_add_test(test_kontext.cpp TIMEOUT 600 LABELS fixture)
