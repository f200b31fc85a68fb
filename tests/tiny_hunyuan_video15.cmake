# The tiny HunyuanVideo-1.5 folders `xfuser make-tiny --arch hunyuan-video15 / hunyuan-video15-i2v`
# write (models/hunyuan_video15/tiny_hunyuan_video15.h): layout, tokenizers, determinism, and
# xfuser-run on both folders and on the embedded tiny-hunyuan-video15.
xfuser_add_test(test_tiny_hunyuan_video15.cpp LABELS fixture)
