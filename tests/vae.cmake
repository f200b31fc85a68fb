xfuser_add_test(test_vae.cpp LABELS fixture)
