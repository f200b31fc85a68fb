xfuser_add_test(test_safetensors.cpp LABELS unit fixture)
xfuser_add_test(test_component_folder.cpp LABELS unit fixture)
