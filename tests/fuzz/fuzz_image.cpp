// libFuzzer target: the picture readers (runner/image_input.h: PNG through libpng, JPEG through
// libjpeg, EXIF orientation). The input is the file's bytes. Malformed input may only raise a
// named xfuser::Error; the pixel limit is lowered so that a header declaring a large picture is
// refused before decoding (the decompression-bomb guard) instead of exhausting the fuzzer's
// memory; a picture that decodes must have the size its header allows and 3 channels.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include <ATen/ATen.h>

#include "runner/image_input.h"
#include "tests/fuzz/fuzz_common.h"

namespace {
constexpr int64_t kFuzzMaxPixels = 1 << 20;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path =
      (std::filesystem::temp_directory_path() / ("xfuser-fuzz-image-" + std::to_string(::getpid())))
          .string();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  xfuser::runner::set_max_image_pixels(kFuzzMaxPixels);
  xfuser::fuzz::expect_named_errors_only([&] {
    const at::Tensor image = xfuser::runner::read_image(path);
    if (image.dim() != 3 || image.size(2) != 3 || image.scalar_type() != at::kByte ||
        image.size(0) * image.size(1) > kFuzzMaxPixels) {
      std::abort();
    }
  });
  return 0;
}
