# tiny-shapes, the trained embedded model: held-out captions drawn as told, a random model fails
# the same check, diffusers parity on the committed folder.
xfuser_add_test(test_tiny_shapes.cpp TIMEOUT 900 LABELS fixture)
