# NVTX ranges from Spans, through a minimal NVTX tool injected as nsys would (no GPU needed).
if(XFUSER_WITH_NVTX)
  add_library(xfuser_test_nvtx_recorder SHARED nvtx_recorder.cpp)
  target_include_directories(xfuser_test_nvtx_recorder PRIVATE ${XFUSER_NVTX_INCLUDE_DIR})
  set_target_properties(xfuser_test_nvtx_recorder PROPERTIES CXX_VISIBILITY_PRESET default)
  xfuser_add_test(test_nvtx.cpp TIMEOUT 300 LABELS unit torch2)
  target_compile_definitions(test_nvtx PRIVATE
    XFUSER_TEST_NVTX_RECORDER="$<TARGET_FILE:xfuser_test_nvtx_recorder>")
  add_dependencies(test_nvtx xfuser_test_nvtx_recorder xfuser-run)
endif()
