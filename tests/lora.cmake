# LoRA adapters: every family against diffusers' load_lora_weights / fuse_lora, the unfused
# per-generation scales, tensor-parallel slicing, bad adapters; every parallel layout with an
# adapter against one rank.
xfuser_add_test(test_lora.cpp LABELS fixture TIMEOUT 600)
xfuser_add_test(test_lora_parallel.cpp NP 2 TIMEOUT 600 MPI_MAIN)
