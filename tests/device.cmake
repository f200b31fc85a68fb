# --device auto|cpu|cuda: the decision (every branch, from probes), and xfuser-run / xfuser
# forward on this build (one rank and mpirun -np 2): cuda without one is an error on every rank.
xfuser_add_test(test_device.cpp TIMEOUT 300)
