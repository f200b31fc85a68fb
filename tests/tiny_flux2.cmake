# The tiny Flux2Pipeline folder `xfuser make-tiny --arch flux2` writes (models/flux2/tiny_flux2.h):
# components load, the tokenizer encodes FLUX.2 prompts, determinism, a finite forward.
xfuser_add_test(test_tiny_flux2.cpp LABELS unit)
