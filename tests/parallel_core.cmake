# Parallel core: the process mesh (WorldConfig, ProcessGroups) and the MPI communicator, run
# without mpiexec (a world of 1) and on 2 and 4 ranks.
xfuser_add_test(test_world_config.cpp)
xfuser_add_test(test_mpi_communicator.cpp TIMEOUT 60 MPI_MAIN)
xfuser_add_test(test_mpi_communicator.cpp NP 2 TIMEOUT 60)
xfuser_add_test(test_mpi_communicator.cpp NP 4 TIMEOUT 60)
# The watchdog of asynchronous communicators, with stand-in operations (no GPU needed).
xfuser_add_test(test_watchdog.cpp TIMEOUT 60)
