# tiny-shapes-video, the trained embedded video model: held-out captions moved as told, a random
# model fails the same check, the checker equals world.py's, diffusers parity on the committed
# folder. Two ctest entries of one executable, so that the held-out sets run beside the rest.
xfuser_add_test(test_tiny_shapes_video.cpp PART heldout TIMEOUT 900 LABELS fixture
                ARGS --gtest_filter=TinyShapesVideo.MovesAsCaptioned)
xfuser_add_test(test_tiny_shapes_video.cpp TIMEOUT 900 LABELS fixture
                ARGS --gtest_filter=-TinyShapesVideo.MovesAsCaptioned)
