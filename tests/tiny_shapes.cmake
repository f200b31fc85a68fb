# tiny-shapes, the trained embedded model: held-out captions drawn as told, a random model fails
# the same check, diffusers parity on the committed folder. Three ctest entries of one executable,
# so that its long parts (the held-out sets, the FP8 comparison) run beside the rest.
xfuser_add_test(test_tiny_shapes.cpp PART heldout TIMEOUT 900 LABELS fixture
                ARGS --gtest_filter=TinyShapes.DrawsHeldOutScenes)
xfuser_add_test(test_tiny_shapes.cpp PART fp8 TIMEOUT 900 LABELS fixture
                ARGS --gtest_filter=TinyShapes.Fp8*)
xfuser_add_test(test_tiny_shapes.cpp TIMEOUT 900 LABELS fixture
                ARGS --gtest_filter=-TinyShapes.DrawsHeldOutScenes:TinyShapes.Fp8*)
