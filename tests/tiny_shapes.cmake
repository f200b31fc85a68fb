# tiny-shapes, the trained embedded model: held-out captions drawn as told, a random model fails
# the same check, diffusers parity on the committed folder. One ctest entry per held-out set, one
# for the FP8 comparison and one for the rest, all of one executable, so that the long parts run
# beside each other and beside the rest.
foreach(set single free multi counts unknown)
  xfuser_add_test(test_tiny_shapes.cpp PART heldout_${set} TIMEOUT 900 LABELS fixture
                  ARGS --gtest_filter=TinyShapes/HeldOutSet.DrawsHeldOutScenes/${set})
endforeach()
xfuser_add_test(test_tiny_shapes.cpp PART fp8 TIMEOUT 900 LABELS fixture
                ARGS --gtest_filter=TinyShapes.Fp8*)
xfuser_add_test(test_tiny_shapes.cpp TIMEOUT 900 LABELS fixture
                ARGS --gtest_filter=-TinyShapes/HeldOutSet.*:TinyShapes.Fp8*)
