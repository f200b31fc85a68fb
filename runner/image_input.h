// Image input (image-to-video, img2img): PNG or JPEG files decoded to RGB.
#pragma once

#include <filesystem>

namespace at {
class Tensor;
}

namespace xfuser::runner {

// Reads a PNG (read_png of runner/outputs.h) or a JPEG (libjpeg), chosen by the file's magic
// bytes, not its extension, as uint8 [H, W, 3] RGB on the CPU, as PIL's Image.open(path)
// .convert("RGB") gives it: gray (and 1/2/4-bit gray) expands to 3 channels, alpha is dropped
// (nothing composited), palette images expand; JPEGs decode with libjpeg's defaults (islow DCT,
// fancy upsampling), as PIL's. CMYK/YCCK JPEGs are an error naming the file. A missing,
// unreadable, truncated or non-image file is an xfuser::Error naming the file. EXIF orientation
// is not applied.
at::Tensor read_image(const std::filesystem::path& path);

}  // namespace xfuser::runner
