# TwoPlaneCommunicator (host plane MPI, device plane NCCL or staged through host memory) and
# make_world_communicator: one rank and two. On a GPU host the two ranks share cuda:0 and check
# the staged device path against the host path (label gpu).
xfuser_add_test(test_two_plane.cpp TIMEOUT 60 LABELS unit gpu torch2 MPI_MAIN)
xfuser_add_test(test_two_plane.cpp NP 2 TIMEOUT 60 LABELS unit gpu torch2)
