# XFUSER_WITH_NCCL: build the NCCL communicator. Defaults to ON when nccl.h and libnccl are found
# (e.g. the CUDA toolkit in /usr/local/cuda). The code compiles and links without a GPU; selecting
# the NCCL backend at run time on a machine without one is a clear error.
set(XFUSER_CUDA_ROOT "/usr/local/cuda" CACHE PATH "CUDA toolkit root searched for NCCL")
find_path(XFUSER_NCCL_INCLUDE_DIR nccl.h
  HINTS ${XFUSER_CUDA_ROOT}/include $ENV{NCCL_ROOT}/include ${NCCL_ROOT}/include)
find_library(XFUSER_NCCL_LIBRARY nccl
  HINTS ${XFUSER_CUDA_ROOT}/lib64 ${XFUSER_CUDA_ROOT}/lib $ENV{NCCL_ROOT}/lib ${NCCL_ROOT}/lib)
find_path(XFUSER_CUDART_INCLUDE_DIR cuda_runtime_api.h HINTS ${XFUSER_CUDA_ROOT}/include)
find_library(XFUSER_CUDART_LIBRARY cudart HINTS ${XFUSER_CUDA_ROOT}/lib64 ${XFUSER_CUDA_ROOT}/lib)

set(_xf_nccl_default OFF)
if(XFUSER_NCCL_INCLUDE_DIR AND XFUSER_NCCL_LIBRARY AND XFUSER_CUDART_INCLUDE_DIR AND XFUSER_CUDART_LIBRARY)
  set(_xf_nccl_default ON)
endif()
option(XFUSER_WITH_NCCL "Build the NCCL communicator backend" ${_xf_nccl_default})

if(XFUSER_WITH_NCCL)
  if(NOT (XFUSER_NCCL_INCLUDE_DIR AND XFUSER_NCCL_LIBRARY AND XFUSER_CUDART_LIBRARY))
    message(FATAL_ERROR "XFUSER_WITH_NCCL=ON but nccl.h/libnccl/libcudart were not found under "
                        "XFUSER_CUDA_ROOT=${XFUSER_CUDA_ROOT} or NCCL_ROOT")
  endif()
  add_library(xfuser::nccl INTERFACE IMPORTED)
  target_include_directories(xfuser::nccl INTERFACE ${XFUSER_NCCL_INCLUDE_DIR} ${XFUSER_CUDART_INCLUDE_DIR})
  target_link_libraries(xfuser::nccl INTERFACE ${XFUSER_NCCL_LIBRARY} ${XFUSER_CUDART_LIBRARY})
  message(STATUS "xfuser: NCCL backend ON (${XFUSER_NCCL_LIBRARY})")
else()
  message(STATUS "xfuser: NCCL backend OFF")
endif()
