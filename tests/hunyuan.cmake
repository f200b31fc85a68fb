# HunyuanVideo: the HunyuanVideoTransformer3DModel (diffusers fixtures tiny and masked, parts,
# token path, text mask semantics, `xfuser forward`).
xfuser_add_test(test_hunyuan_transformer.cpp LABELS unit fixture)
# Under the generic drivers (NP 2): tensor parallel 2, Ulysses 2 and ring 2 against one rank (the
# text whole on every rank, padded text keys masked), and the clear error for a split text.
xfuser_add_test(test_hunyuan_parallel.cpp NP 2 TIMEOUT 300 LABELS fixture)
# `xfuser forward` under mpirun (spawns its own 2-rank jobs): tensor parallel 2 equals the
# fixtures, and so do Ulysses / ring 2 (the text whole on every rank).
xfuser_add_test(test_hunyuan_run.cpp TIMEOUT 300 LABELS fixture)
xfuser_add_test(test_hunyuan_vae.cpp LABELS unit fixture)
# HunyuanVideoPipeline: diffusers parity, xfuser-run's MP4, every parallel layout on 2 and 4 ranks,
# the embedded tiny-hunyuan-video.
xfuser_add_test(test_hunyuan_pipeline.cpp TIMEOUT 600 LABELS fixture mpi)
# Patch-parallel HunyuanVideo VAE decode (NP 2 and 4) against one rank and diffusers' fixtures.
xfuser_add_test(test_hunyuan_vae_parallel.cpp NP 2 TIMEOUT 300 LABELS mpi fixture)
xfuser_add_test(test_hunyuan_vae_parallel.cpp NP 4 TIMEOUT 300 LABELS mpi fixture)
