# tokenizer.json byte-level BPE tokenizers (Llama 3, Qwen2, tekken) against tokenizers 0.19.1.
xfuser_add_test(test_bpe_tokenizer.cpp LABELS unit fixture)
