xfuser_add_test(test_profiling.cpp LABELS unit torch2)
# Runs xfuser-run (one rank, and two through mpirun) and `xfuser trace merge`.
xfuser_add_test(test_profile_run.cpp LABELS mpi torch2 TIMEOUT 600)
