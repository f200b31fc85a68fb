xfuser_add_test(test_parallel_flux.cpp NP 2 TIMEOUT 300)
xfuser_add_test(test_parallel_flux.cpp NP 4 TIMEOUT 300)
