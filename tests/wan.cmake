# Wan 2.1 / 2.2: the WanTransformer3DModel (diffusers fixtures T2V and I2V, parts, token path,
# `xfuser forward`), and under the generic drivers: Ulysses 2, ring 2 and tensor parallel 2
# against one rank.
xfuser_add_test(test_wan_transformer.cpp LABELS unit fixture)
xfuser_add_test(test_wan_sequence_parallel.cpp NP 2 TIMEOUT 300 LABELS fixture)
# The Wan 2.1 T2V pipeline end to end: parity with diffusers' WanPipeline (test_pipeline_parity),
# prompt cleaning, MP4 output, every parallel layout on 2 and 4 ranks against serial.
xfuser_add_test(test_wan_prompt.cpp LABELS unit)
xfuser_add_test(test_wan_run.cpp TIMEOUT 600 LABELS fixture mpi)
