# The backend contract (compile -> override -> eager, timeline) and the hand-written kernels.
xfuser_add_test(test_backend.cpp LABELS unit fixture)
