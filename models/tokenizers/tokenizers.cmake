# Included from models/CMakeLists.txt (same directory scope as xfuser_models).
#
# libxfuser_spm: the SentencePiece shim (spm_shim/spm_shim.h explains why it exists). Linked
# against sentencepiece only, never torch, and dlopen()ed by the T5 tokenizer at run time from
# <exe dir>/../lib, $XFUSER_SPM_SHIM or the build path below.
add_library(xfuser_spm SHARED ${CMAKE_CURRENT_SOURCE_DIR}/tokenizers/spm_shim/spm_shim.cpp)
target_include_directories(xfuser_spm PRIVATE ${CMAKE_SOURCE_DIR})
target_compile_options(xfuser_spm PRIVATE -Wall -Wextra -Wno-unused-parameter)
target_link_libraries(xfuser_spm PRIVATE PkgConfig::SENTENCEPIECE)
set_target_properties(xfuser_spm PROPERTIES CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON)
if(XFUSER_SANITIZE OR XFUSER_FUZZ)
  target_compile_options(xfuser_spm PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
    $<$<BOOL:${XFUSER_FUZZ}>:-fsanitize=fuzzer-no-link>)
  target_link_options(xfuser_spm PRIVATE -fsanitize=address,undefined)
endif()

# The tokenizers need the shim built (not linked) and ICU for CLIP's text normalisation (NFC,
# full lower-casing, Unicode general categories) and for the regexes of tokenizer.json's Split
# pre-tokenizers (ICU::i18n: icu::RegexPattern).
find_package(ICU REQUIRED COMPONENTS uc i18n)
add_dependencies(xfuser_models xfuser_spm)
target_link_libraries(xfuser_models PUBLIC ICU::i18n ICU::uc ${CMAKE_DL_LIBS})
set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/tokenizers/spm_library.cpp PROPERTIES
  COMPILE_DEFINITIONS "XFUSER_SPM_SHIM_BUILD_PATH=\"$<TARGET_FILE:xfuser_spm>\""
  SKIP_PRECOMPILE_HEADERS ON)
