# FLUX.2's prompt: Mistral's chat text and tokens, and the stacked hidden states, against the
# flux2-tiny fixture (diffusers 0.36.0 / transformers 4.57.1).
xfuser_add_test(test_flux2_prompt.cpp LABELS unit fixture)
