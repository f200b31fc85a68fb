# --device auto|cpu|cuda: the decision (every branch, from probes), and xfuser-run / xfuser
# forward on this build (one rank and mpirun -np 2): cuda without one is an error on every rank.
xfuser_add_test(test_device.cpp TIMEOUT 300 LABELS unit torch2)
# Every component fixture and tiny pipeline run on the checked device (tests/checked_device.h):
# a tensor made on the CPU among device tensors fails there as on a GPU.
xfuser_add_test(test_checked_device.cpp LABELS unit fixture torch2 TIMEOUT 600)
