# tiny-shapes-video, the trained embedded video model: held-out captions moved as told, a random
# model fails the same check, the checker equals world.py's, diffusers parity on the committed
# folder. One ctest entry per held-out set and one for the rest, all of one executable, so that
# the held-out sets run beside each other and beside the rest.
foreach(set canonical free unknown)
  xfuser_add_test(test_tiny_shapes_video.cpp PART heldout_${set} TIMEOUT 900 LABELS fixture
                  ARGS --gtest_filter=TinyShapesVideo/HeldOutSet.MovesAsCaptioned/${set})
endforeach()
xfuser_add_test(test_tiny_shapes_video.cpp TIMEOUT 900 LABELS fixture
                ARGS --gtest_filter=-TinyShapesVideo/HeldOutSet.*)
