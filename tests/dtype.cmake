# Compute dtypes end to end: xfuser-run on the embedded tiny FLUX in fp32, bf16 and fp16 (CPU).
xfuser_add_test(test_dtype_run.cpp TIMEOUT 300)
