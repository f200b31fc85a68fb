xfuser_add_test(test_usp_attention.cpp NP 2)
xfuser_add_test(test_usp_attention.cpp NP 4)
