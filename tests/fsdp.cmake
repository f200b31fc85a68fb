# FSDP: the sharder's row chunks, gathers, prefetch order, bookkeeping and lockstep check (1, 2
# and 3 ranks: even and uneven splits), then every tiny pipeline sharded under Ulysses, CFG,
# ring and data parallelism against one rank without it.
xfuser_add_test(test_fsdp.cpp TIMEOUT 60 LABELS unit torch2 MPI_MAIN)
xfuser_add_test(test_fsdp.cpp NP 2 TIMEOUT 60 LABELS mpi torch2)
xfuser_add_test(test_fsdp.cpp NP 3 TIMEOUT 60)
xfuser_add_test(test_fsdp_parallel.cpp MPI_MAIN NP 2 LABELS fixture TIMEOUT 900)
xfuser_add_test(test_fsdp_parallel.cpp NP 4 LABELS fixture TIMEOUT 900)
# The memory plan from configs alone (xfuser-run --dry_run), against the plan from the weights.
xfuser_add_test(test_memory_plan.cpp LABELS fixture TIMEOUT 300)
# Two simulated hosts (network namespaces, Open MPI over TCP): the group layout across hosts.
xfuser_add_test(test_two_hosts.cpp LABELS mpi TIMEOUT 300)
