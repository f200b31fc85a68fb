# Qwen2Tokenizer folders without tokenizer.json (vocab.json + merges.txt + tokenizer_config.json)
# against transformers 4.57.1's slow Qwen2Tokenizer.
xfuser_add_test(test_qwen2_slow_tokenizer.cpp LABELS unit fixture)
