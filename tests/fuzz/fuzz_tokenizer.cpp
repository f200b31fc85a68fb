// libFuzzer target: a tokenizer on arbitrary bytes (invalid UTF-8, control characters, added
// tokens, very long words). Built twice (tests/fuzz/CMakeLists.txt):
//   fuzz_clip_tokenizer  XFUSER_FUZZ_TOKENIZER="tok-clip": CLIP byte-level BPE (ICU normalisation)
//   fuzz_t5_tokenizer    XFUSER_FUZZ_TOKENIZER="tok-t5": T5 over SentencePiece, through the shim
// Both are torch-free, so the SentencePiece shim loads without RTLD_DEEPBIND (which ASan refuses)
// and without libtorch's protobuf in the process: nothing for sentencepiece's protobuf to clash
// with. The shim itself is built with ASan/UBSan and fuzzer coverage.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "models/tokenizers/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

std::unique_ptr<xfuser::models::tokenizers::Tokenizer> g_tokenizer;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const auto dir =
      xfuser::fuzz::require_fixture(std::string("transformers-v4.44.2/") + XFUSER_FUZZ_TOKENIZER);
  g_tokenizer = xfuser::models::tokenizers::load_tokenizer(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  xfuser::fuzz::expect_named_errors_only([&] {
    const auto ids = g_tokenizer->encode_ids(text);
    for (int64_t id : ids) {
      if (id < 0 || id >= g_tokenizer->size()) std::abort();  // every id names a vocab entry
    }
    const auto enc = g_tokenizer->encode(text, 77);
    if (enc.input_ids.size() != 77 || enc.attention_mask.size() != 77) std::abort();
  });
  return 0;
}
