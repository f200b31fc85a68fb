# Text side: tokenizers (CLIP BPE, T5 SentencePiece through the shim) and the flow-match scheduler.
xfuser_add_test(test_tokenizers.cpp LABELS unit fixture torch2)
xfuser_add_test(test_scheduler.cpp LABELS unit fixture)
