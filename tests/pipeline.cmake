xfuser_add_test(test_flux_pipeline.cpp)
xfuser_add_test(test_xfuser_run.cpp TIMEOUT 600 LABELS unit torch2)
xfuser_add_test(test_tools.cpp)
