# runner/video.h (H.264 MP4 output) and runner/image_input.h (PNG/JPEG input).
xfuser_add_test(test_video.cpp LABELS unit)
