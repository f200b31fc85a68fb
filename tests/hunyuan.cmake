# HunyuanVideo: the HunyuanVideoTransformer3DModel (diffusers fixtures tiny and masked, parts,
# token path, text mask semantics, `xfuser forward`).
xfuser_add_test(test_hunyuan_transformer.cpp LABELS unit fixture)
