# Grouped point-to-point (Communicator::batch_p2p) over MPI: one rank, 2 and 4 ranks.
xfuser_add_test(test_batch_p2p.cpp TIMEOUT 60 MPI_MAIN)
xfuser_add_test(test_batch_p2p.cpp NP 2 TIMEOUT 60)
xfuser_add_test(test_batch_p2p.cpp NP 4 TIMEOUT 60)
