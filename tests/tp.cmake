# Tensor parallelism and the patch-parallel VAE, against one rank (helper "tp").
xfuser_add_test(test_tensor_parallel.cpp NP 2 TIMEOUT 300)
xfuser_add_test(test_tensor_parallel.cpp NP 4 TIMEOUT 300)
xfuser_add_test(test_parallel_vae.cpp NP 2 TIMEOUT 300)
xfuser_add_test(test_parallel_vae.cpp NP 4 TIMEOUT 300)
