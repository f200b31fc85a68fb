# Every family through the generic DiT path: whole pipelines against diffusers (the committed
# tiny pipeline folders and references), every parallel layout of tiny-sd3 against one rank.
xfuser_add_test(test_pipeline_parity.cpp LABELS unit fixture torch2)
xfuser_add_test(test_parallel_dit.cpp NP 2 TIMEOUT 300)
xfuser_add_test(test_parallel_dit.cpp NP 4 TIMEOUT 300)
xfuser_add_test(test_sd3_run.cpp LABELS unit fixture TIMEOUT 300)
