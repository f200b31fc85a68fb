# Build speed: unity batches and ccache (docs/development.md has the measurements).
#
# Unity build. Every translation unit pays for loading the precompiled libtorch headers (~2 s)
# and for instantiating the same ATen, nlohmann-json and spdlog templates again; compiled in
# batches of 8 sources, the libraries and tools build in about half the compiler time. Sources of
# one target share a batch, so names at namespace scope must be unique within a target (anonymous
# namespaces included). -DXFUSER_UNITY=OFF compiles each file on its own (each then proves it
# includes what it uses). Single-source targets (the tests) are unaffected.
#
# The batch files are written here rather than by CMake's UNITY_BUILD, whose batch files include
# each source by its absolute path (before CMake 3.32): a second clone of the project would then
# miss ccache for every batch. These include each source relative to the project root, which is
# on every target's include path. Sources with properties of their own (definitions, options,
# include folders, no precompiled header) compile on their own. xfuser_target_setup defers the
# call to the end of the target's folder, after those properties are set.
set(XFUSER_UNITY_BATCH 8)
function(xfuser_unity target)
  if(NOT XFUSER_UNITY)
    return()
  endif()
  get_target_property(_sources ${target} SOURCES)
  set(_batchable "")
  set(_kept "")
  foreach(_src IN LISTS _sources)
    get_filename_component(_abs "${_src}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    get_source_file_property(_defs "${_src}" COMPILE_DEFINITIONS)
    get_source_file_property(_opts "${_src}" COMPILE_OPTIONS)
    get_source_file_property(_incs "${_src}" INCLUDE_DIRECTORIES)
    get_source_file_property(_flags "${_src}" COMPILE_FLAGS)
    get_source_file_property(_skip "${_src}" SKIP_UNITY_BUILD_INCLUSION)
    get_source_file_property(_nopch "${_src}" SKIP_PRECOMPILE_HEADERS)
    # Sources of the project only, not generated ones (a build folder may lie inside the project).
    string(FIND "${_abs}" "${CMAKE_SOURCE_DIR}/" _under)
    string(FIND "${_abs}" "${CMAKE_BINARY_DIR}/" _generated)
    if(_abs MATCHES "\\.cpp$" AND _under EQUAL 0 AND NOT _generated EQUAL 0 AND NOT _defs
       AND NOT _opts AND NOT _incs AND NOT _flags AND NOT _skip AND NOT _nopch)
      list(APPEND _batchable "${_abs}")
    else()
      list(APPEND _kept "${_src}")
    endif()
  endforeach()
  list(LENGTH _batchable _n)
  if(_n LESS 2)
    return()
  endif()
  set(_batches "")
  set(_content "")
  set(_count 0)
  math(EXPR _last "${_n} - 1")
  foreach(_i RANGE ${_last})
    list(GET _batchable ${_i} _abs)
    file(RELATIVE_PATH _rel "${CMAKE_SOURCE_DIR}" "${_abs}")
    string(APPEND _content "#include \"${_rel}\"\n")
    set_source_files_properties("${_abs}" PROPERTIES HEADER_FILE_ONLY ON)
    math(EXPR _count "${_count} + 1")
    if(_count EQUAL XFUSER_UNITY_BATCH OR _i EQUAL _last)  # a full batch, or the rest
      list(LENGTH _batches _index)
      set(_file "${CMAKE_CURRENT_BINARY_DIR}/unity/${target}_${_index}.cpp")
      file(CONFIGURE OUTPUT "${_file}"
           CONTENT "// Unity batch of ${target} (cmake/XfuserBuildSpeed.cmake)\n${_content}" @ONLY)
      list(APPEND _batches "${_file}")
      set(_content "")
      set(_count 0)
    endif()
  endforeach()
  # The sources stay listed (headers only, for IDEs and CMake's dependency scanning of batches).
  set_property(TARGET ${target} PROPERTY SOURCES ${_kept} ${_batchable} ${_batches})
endfunction()

# ccache (Debian package ccache), in its default directory under the user's cache
# (~/.cache/ccache, or $CCACHE_DIR), so every build folder and every clone on the machine shares
# it. CCACHE_BASEDIR makes paths under this source folder relative in the hash, so a second clone
# reuses the first one's objects (error messages shorten __FILE__ at run time, so objects do not
# depend on where the clone lives). The sloppiness is what ccache needs to cache compilations that
# use a GCC precompiled header (its manual, "Precompiled headers"). A launcher set by the caller
# (-DCMAKE_CXX_COMPILER_LAUNCHER=...) wins.
if(XFUSER_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(XFUSER_CCACHE_PROGRAM ccache)
  if(XFUSER_CCACHE_PROGRAM)
    set(CMAKE_CXX_COMPILER_LAUNCHER ${CMAKE_COMMAND} -E env
        CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}
        CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
        ${XFUSER_CCACHE_PROGRAM})
    message(STATUS "xfuser: compiling through ${XFUSER_CCACHE_PROGRAM}")
  else()
    message(STATUS "xfuser: ccache not found (Debian: apt install ccache); compiling without it")
  endif()
endif()
