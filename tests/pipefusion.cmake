# PipeFusion (FLUX): stage partition, partial loading and flags on one rank; the pipeline
# against the serial result on 2 ranks (pp 2) and 4 ranks (pp 2 x ulysses/ring/cfg 2).
xfuser_add_test(test_pipefusion.cpp TIMEOUT 300)
xfuser_add_test(test_pipefusion.cpp NP 2 TIMEOUT 600)
xfuser_add_test(test_pipefusion.cpp NP 4 TIMEOUT 600)
# xfuser-run under mpirun with PipeFusion flags (spawns mpirun itself).
xfuser_add_test(test_pipefusion_run.cpp TIMEOUT 600)
