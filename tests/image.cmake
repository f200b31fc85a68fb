xfuser_add_test(test_image_preprocess.cpp LABELS unit fixture)
xfuser_add_test(test_clip_vision.cpp LABELS unit fixture)
xfuser_add_test(test_siglip_vision.cpp LABELS unit fixture)
