# HunyuanVideo-1.5: the HunyuanVideo15Transformer3DModel (diffusers 0.36.0 fixtures: t2v, i2v,
# meanflow; the text streams' reordering and masks, parts, config and input errors).
xfuser_add_test(test_hunyuan_video15_transformer.cpp LABELS unit fixture)
# Under the generic drivers (NP 2 and 4): tensor parallel 2, Ulysses 2, ring 2 and Ulysses 2 x
# ring 2 against one rank (the text whole on every rank, the padded text keys masked).
xfuser_add_test(test_hunyuan_video15_parallel.cpp NP 2 TIMEOUT 300 LABELS fixture mpi)
xfuser_add_test(test_hunyuan_video15_parallel.cpp NP 4 TIMEOUT 300 LABELS fixture mpi)
