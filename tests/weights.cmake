xfuser_add_test(test_safetensors.cpp LABELS unit fixture torch2)
xfuser_add_test(test_component_folder.cpp LABELS unit fixture)
