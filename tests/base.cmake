xfuser_add_test(test_error.cpp)
xfuser_add_test(test_module.cpp)
xfuser_add_test(test_nccl.cpp)
xfuser_add_test(test_run_config.cpp)
