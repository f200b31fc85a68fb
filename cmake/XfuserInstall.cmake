# `cmake --install`: headers, static libraries, the SentencePiece shim, the tools, and a CMake
# package so an outside project can do
#
#   find_package(xfuser 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE xfuser::xfuser)
#
# Layout under the prefix: include/xfuser/<folder>/*.h, <libdir>/libxfuser_*.a,
# <libdir>/libxfuser_spm.so, bin/xfuser-run, bin/xfuser, <libdir>/cmake/xfuser/.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(XFUSER_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/xfuser)

# xfuser::xfuser: the whole C++ API (the runner and everything below it).
add_library(xfuser_api INTERFACE)
target_link_libraries(xfuser_api INTERFACE xfuser_runner)
add_library(xfuser::xfuser ALIAS xfuser_api)

set(_xf_exported xfuser_api xfuser_runner xfuser_models xfuser_parallel xfuser_backends
    xfuser_profiling xfuser_options)
set_target_properties(xfuser_api PROPERTIES EXPORT_NAME xfuser)
foreach(t xfuser_runner xfuser_models xfuser_parallel xfuser_backends xfuser_profiling
          xfuser_options)
  string(REPLACE "xfuser_" "" _xf_short ${t})
  set_target_properties(${t} PROPERTIES EXPORT_NAME ${_xf_short})  # xfuser::runner, ...
endforeach()

install(TARGETS ${_xf_exported} EXPORT xfuserTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION include/xfuser)
# The shim is dlopen()ed, never linked: installed beside the libraries, not exported.
install(TARGETS xfuser_spm LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})

# The tools find the shim in <prefix>/<libdir> through their RUNPATH, and a non-system libtorch,
# its CUDA runtime and NCCL through theirs, named explicitly: INSTALL_RPATH_USE_LINK_PATH skips
# link directories inside the source or build tree (a venv made in the checkout, as CI does), and
# libtorch_cuda.so is linked as a linker flag, which it never sees. Without them the installed
# tool would load a system libtorch of another version, or none.
set(_xf_rpath "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
foreach(_xf_lib "${c10_LIBRARY}" "${XFUSER_CUDART_LIBRARY}"
                "${XFUSER_NCCL_LIBRARY}")
  if(_xf_lib AND EXISTS "${_xf_lib}")
    get_filename_component(_xf_dir "${_xf_lib}" DIRECTORY)
    if(NOT _xf_dir IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES
       AND NOT _xf_dir IN_LIST CMAKE_PLATFORM_IMPLICIT_LINK_DIRECTORIES)
      list(APPEND _xf_rpath "${_xf_dir}")
    endif()
  endif()
endforeach()
list(REMOVE_DUPLICATES _xf_rpath)
set_target_properties(xfuser-run xfuser PROPERTIES
  INSTALL_RPATH "${_xf_rpath}" INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS xfuser-run xfuser RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

foreach(dir backends models parallel profiling runner)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/ DESTINATION include/xfuser/${dir}
    FILES_MATCHING PATTERN "*.h")
endforeach()

# The link to the system's {fmt} that goes ahead of a PyTorch wheel's own copy (CMakeLists.txt).
if(XFUSER_FMT_FIRST)
  install(DIRECTORY ${XFUSER_FMT_FIRST}/ DESTINATION include/xfuser/fmt_first)
endif()

# The trained tiny pipelines (models/common/trained_pipeline.cpp finds them here once installed).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/models/flux/tiny_shapes/
  DESTINATION ${CMAKE_INSTALL_DATADIR}/xfuser/tiny_shapes)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/models/wan/tiny_shapes_video/
  DESTINATION ${CMAKE_INSTALL_DATADIR}/xfuser/tiny_shapes_video)

install(EXPORT xfuserTargets NAMESPACE xfuser:: DESTINATION ${XFUSER_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/xfuserConfig.cmake.in
  ${PROJECT_BINARY_DIR}/xfuserConfig.cmake INSTALL_DESTINATION ${XFUSER_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/xfuserConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/xfuserConfig.cmake
  ${PROJECT_BINARY_DIR}/xfuserConfigVersion.cmake DESTINATION ${XFUSER_INSTALL_CMAKEDIR})
