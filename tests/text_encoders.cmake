xfuser_add_test(test_text_encoders.cpp LABELS unit fixture torch2)
