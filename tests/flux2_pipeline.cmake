# FLUX.2's prompt: Mistral's chat text and tokens, and the stacked hidden states, against the
# flux2-tiny fixture (diffusers 0.36.0 / transformers 4.57.1).
xfuser_add_test(test_flux2_prompt.cpp LABELS unit fixture)
# The FLUX.2 pipeline against diffusers' final latents and images, xfuser-run on the fixture
# folder, every parallel layout against the serial run, PipeFusion, and bad inputs.
xfuser_add_test(test_flux2_pipeline.cpp TIMEOUT 900 LABELS fixture mpi)
