# CPU offload: the offloader's residency rules and bookkeeping (and real moves on the checked
# device in the torch 2.x build), then every tiny pipeline with model and with sequential offload
# against the same run without it.
xfuser_add_test(test_offload.cpp LABELS unit torch2)
xfuser_add_test(test_offload_pipelines.cpp LABELS fixture TIMEOUT 900)
xfuser_add_test(test_offload_parallel.cpp MPI_MAIN NP 2 LABELS fixture TIMEOUT 900)
