# HunyuanVideo-1.5 text- and image-to-video pipelines against diffusers 0.36.0 (final latents,
# decoded frames), xfuser-run on the fixture folders, every parallel layout against the serial
# run, and bad flags.
xfuser_add_test(test_hunyuan_video15_pipeline.cpp TIMEOUT 900 LABELS fixture mpi)
