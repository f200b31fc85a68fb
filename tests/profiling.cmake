xfuser_add_test(test_profiling.cpp)
# Runs xfuser-run (one rank, and two through mpirun) and `xfuser trace merge`.
xfuser_add_test(test_profile_run.cpp LABELS mpi TIMEOUT 600)
