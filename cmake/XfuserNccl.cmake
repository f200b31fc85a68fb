# The CUDA runtime and NCCL, and XFUSER_WITH_NCCL (the NCCL communicator).
#
# A CUDA libtorch (the one inside a pip-installed PyTorch, or a libtorch archive) brings its own
# CUDA runtime and NCCL. xfuser links those same files, never a second copy from a CUDA toolkit:
# two runtimes of one soname in a process means the libtorch runs on the one loaded first. They
# are found where libtorch_cuda.so finds them, in the directories of its RPATH/RUNPATH ($ORIGIN
# expanded: a pip wheel's ../../nvidia/<package>/lib) and its own lib/.
#
# A CPU libtorch (Debian's libtorch-dev) has none: NCCL and the runtime then come from the CUDA
# toolkit (XFUSER_CUDA_ROOT, default /usr/local/cuda) or NCCL_ROOT, so the NCCL communicator still
# compiles and links; choosing it at run time on a host without a GPU is a clear error.
#
# Sets XFUSER_TORCH_CUDA (the libtorch has CUDA) and the target xfuser::nccl when NCCL is on.
set(XFUSER_CUDA_ROOT "/usr/local/cuda" CACHE PATH "CUDA toolkit root searched for NCCL (CPU libtorch)")

set(XFUSER_TORCH_CUDA OFF)
if(C10_CUDA_LIBRARY AND EXISTS "${TORCH_INSTALL_PREFIX}/lib/libtorch_cuda.so")
  set(XFUSER_TORCH_CUDA ON)
endif()

# xfuser_torch_cuda_dirs(<out>): the directories libtorch_cuda.so loads its libraries from.
function(xfuser_torch_cuda_dirs out)
  set(_lib_dir "${TORCH_INSTALL_PREFIX}/lib")
  find_program(XFUSER_READELF NAMES readelf ${CMAKE_READELF})
  set(_dirs)
  if(XFUSER_READELF)
    execute_process(COMMAND ${XFUSER_READELF} -d "${_lib_dir}/libtorch_cuda.so"
      OUTPUT_VARIABLE _dyn ERROR_QUIET)
    string(REGEX MATCHALL "(RPATH|RUNPATH)[^\n]*\\[([^]\n]*)\\]" _paths "${_dyn}")
    foreach(_entry IN LISTS _paths)
      string(REGEX REPLACE ".*\\[([^]]*)\\].*" "\\1" _entry "${_entry}")
      string(REPLACE "$ORIGIN" "${_lib_dir}" _entry "${_entry}")
      string(REPLACE ":" ";" _entry "${_entry}")
      foreach(_d IN LISTS _entry)
        get_filename_component(_d "${_d}" ABSOLUTE)
        if(IS_DIRECTORY "${_d}")
          list(APPEND _dirs "${_d}")
        endif()
      endforeach()
    endforeach()
  endif()
  list(APPEND _dirs "${_lib_dir}")
  list(REMOVE_DUPLICATES _dirs)
  set(${out} ${_dirs} PARENT_SCOPE)
endfunction()

# xfuser_first_lib(<out> <glob> <dirs...>): the first file matching <glob> in the directories.
function(xfuser_first_lib out pattern)
  foreach(_d IN LISTS ARGN)
    file(GLOB _hits LIST_DIRECTORIES false "${_d}/${pattern}")
    list(FILTER _hits EXCLUDE REGEX "\\.a$")
    if(_hits)
      list(SORT _hits)
      list(GET _hits 0 _hit)
      set(${out} "${_hit}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

if(XFUSER_TORCH_CUDA)
  xfuser_torch_cuda_dirs(_xf_cuda_dirs)
  # libcudart.so.13 (wheels), libcudart-<hash>.so.12 (libtorch archives).
  xfuser_first_lib(_xf_cudart "libcudart.so.[0-9]*" ${_xf_cuda_dirs})
  if(NOT _xf_cudart)
    xfuser_first_lib(_xf_cudart "libcudart-*.so*" ${_xf_cuda_dirs})
  endif()
  xfuser_first_lib(_xf_nccl "libnccl.so*" ${_xf_cuda_dirs})
  if(NOT _xf_cudart)
    message(FATAL_ERROR "The libtorch in ${TORCH_INSTALL_PREFIX} has CUDA, but no libcudart was "
                        "found where libtorch_cuda.so loads it from: ${_xf_cuda_dirs}")
  endif()
  # Torch's own config links the CUDA toolkit's runtime and NVRTC (find_package(CUDAToolkit));
  # point those at the libtorch's copies so the process holds one runtime.
  if(TARGET CUDA::cudart)
    set_target_properties(CUDA::cudart PROPERTIES IMPORTED_LOCATION "${_xf_cudart}")
  endif()
  if(CUDA_NVRTC_LIB)
    list(REMOVE_ITEM TORCH_LIBRARIES "${CUDA_NVRTC_LIB}")
  endif()
  list(TRANSFORM TORCH_LIBRARIES REPLACE "^.*/libcudart\\.so$" "${_xf_cudart}")
  set(XFUSER_CUDART_LIBRARY "${_xf_cudart}" CACHE FILEPATH "CUDA runtime (the libtorch's)" FORCE)
  # Headers: the wheel's nvidia/<package>/include beside the lib/, else the toolkit the Torch
  # config already required (same major version as the runtime).
  get_filename_component(_xf_cudart_dir "${_xf_cudart}" DIRECTORY)
  find_path(XFUSER_CUDART_INCLUDE_DIR cuda_runtime_api.h NO_DEFAULT_PATH
    HINTS "${_xf_cudart_dir}/../include" ${CUDAToolkit_INCLUDE_DIRS} ${XFUSER_CUDA_ROOT}/include)
  if(_xf_nccl)
    set(XFUSER_NCCL_LIBRARY "${_xf_nccl}" CACHE FILEPATH "NCCL (the libtorch's)" FORCE)
    get_filename_component(_xf_nccl_dir "${_xf_nccl}" DIRECTORY)
    find_path(XFUSER_NCCL_INCLUDE_DIR nccl.h NO_DEFAULT_PATH
      HINTS "${_xf_nccl_dir}/../include" $ENV{NCCL_ROOT}/include ${NCCL_ROOT}/include
            ${XFUSER_CUDA_ROOT}/include)
  else()
    # A libtorch with NCCL linked in statically: NCCL_ROOT names the matching release.
    find_path(XFUSER_NCCL_INCLUDE_DIR nccl.h HINTS $ENV{NCCL_ROOT}/include ${NCCL_ROOT}/include)
    find_library(XFUSER_NCCL_LIBRARY nccl HINTS $ENV{NCCL_ROOT}/lib ${NCCL_ROOT}/lib)
  endif()
else()
  find_path(XFUSER_NCCL_INCLUDE_DIR nccl.h
    HINTS ${XFUSER_CUDA_ROOT}/include $ENV{NCCL_ROOT}/include ${NCCL_ROOT}/include)
  find_library(XFUSER_NCCL_LIBRARY nccl
    HINTS ${XFUSER_CUDA_ROOT}/lib64 ${XFUSER_CUDA_ROOT}/lib $ENV{NCCL_ROOT}/lib ${NCCL_ROOT}/lib)
  find_path(XFUSER_CUDART_INCLUDE_DIR cuda_runtime_api.h HINTS ${XFUSER_CUDA_ROOT}/include)
  find_library(XFUSER_CUDART_LIBRARY cudart HINTS ${XFUSER_CUDA_ROOT}/lib64 ${XFUSER_CUDA_ROOT}/lib)
endif()

set(_xf_nccl_default OFF)
if(XFUSER_NCCL_INCLUDE_DIR AND XFUSER_NCCL_LIBRARY AND XFUSER_CUDART_INCLUDE_DIR AND XFUSER_CUDART_LIBRARY)
  set(_xf_nccl_default ON)
endif()
option(XFUSER_WITH_NCCL "Build the NCCL communicator backend" ${_xf_nccl_default})

if(XFUSER_WITH_NCCL)
  if(NOT (XFUSER_NCCL_INCLUDE_DIR AND XFUSER_NCCL_LIBRARY AND XFUSER_CUDART_INCLUDE_DIR
          AND XFUSER_CUDART_LIBRARY))
    message(FATAL_ERROR "XFUSER_WITH_NCCL=ON but nccl.h/libnccl/libcudart were not found "
                        "(libtorch CUDA: ${XFUSER_TORCH_CUDA}; XFUSER_CUDA_ROOT=${XFUSER_CUDA_ROOT}; "
                        "NCCL_ROOT): found '${XFUSER_NCCL_INCLUDE_DIR}' '${XFUSER_NCCL_LIBRARY}' "
                        "'${XFUSER_CUDART_LIBRARY}'")
  endif()
  add_library(xfuser::nccl INTERFACE IMPORTED)
  target_include_directories(xfuser::nccl INTERFACE ${XFUSER_NCCL_INCLUDE_DIR} ${XFUSER_CUDART_INCLUDE_DIR})
  target_link_libraries(xfuser::nccl INTERFACE ${XFUSER_NCCL_LIBRARY} ${XFUSER_CUDART_LIBRARY})
  message(STATUS "xfuser: NCCL backend ON (${XFUSER_NCCL_LIBRARY}, ${XFUSER_CUDART_LIBRARY})")
else()
  message(STATUS "xfuser: NCCL backend OFF")
endif()
message(STATUS "xfuser: libtorch CUDA ${XFUSER_TORCH_CUDA}")
