# HunyuanVideo: the HunyuanVideoTransformer3DModel (diffusers fixtures tiny and masked, parts,
# token path, text mask semantics, `xfuser forward`).
xfuser_add_test(test_hunyuan_transformer.cpp LABELS unit fixture)
# Under the generic drivers (NP 2): tensor parallel 2, Ulysses 2 and ring 2 against one rank, and
# the clear errors for a split or masked text under sequence parallelism.
xfuser_add_test(test_hunyuan_parallel.cpp NP 2 TIMEOUT 300 LABELS fixture)
