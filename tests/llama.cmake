xfuser_add_test(test_llama_encoder.cpp LABELS unit fixture)
