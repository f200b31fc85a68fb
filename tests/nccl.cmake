# test_nccl is registered in base.cmake; it checks the library against the configuration.
if(XFUSER_WITH_NCCL)
  target_compile_definitions(test_nccl PRIVATE XFUSER_EXPECT_NCCL=1)
else()
  target_compile_definitions(test_nccl PRIVATE XFUSER_EXPECT_NCCL=0)
endif()
