# UniPCMultistepScheduler (Wan 2.1 / 2.2) against diffusers v0.33.1 trajectories.
xfuser_add_test(test_unipc.cpp LABELS unit fixture)
