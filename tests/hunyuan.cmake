# HunyuanVideo: the HunyuanVideoTransformer3DModel (diffusers fixtures tiny and masked, parts,
# token path, text mask semantics, `xfuser forward`).
xfuser_add_test(test_hunyuan_transformer.cpp LABELS unit fixture)
# Under the generic drivers (NP 2): tensor parallel 2, Ulysses 2 and ring 2 against one rank, and
# the clear errors for a split or masked text under sequence parallelism.
xfuser_add_test(test_hunyuan_parallel.cpp NP 2 TIMEOUT 300 LABELS fixture)
# `xfuser forward` under mpirun (spawns its own 2-rank jobs): tensor parallel 2 equals the
# fixtures, Ulysses / ring 2 equal one rank with the text whole and refuse a split text.
xfuser_add_test(test_hunyuan_run.cpp TIMEOUT 300 LABELS fixture)
xfuser_add_test(test_hunyuan_vae.cpp LABELS unit fixture)
# Patch-parallel HunyuanVideo VAE decode (NP 2 and 4) against one rank and diffusers' fixtures.
xfuser_add_test(test_hunyuan_vae_parallel.cpp NP 2 TIMEOUT 300 LABELS mpi fixture)
xfuser_add_test(test_hunyuan_vae_parallel.cpp NP 4 TIMEOUT 300 LABELS mpi fixture)
