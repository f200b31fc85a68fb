# GPU checks (label gpu): each test skips itself, naming why, on a host without a CUDA libtorch
# and a visible GPU, so the default run stays green here. On a GPU host: ctest -L gpu.
xfuser_add_test(test_gpu.cpp TIMEOUT 900 LABELS gpu torch2)
set_tests_properties(test_gpu PROPERTIES SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
