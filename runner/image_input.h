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
// fancy upsampling), as PIL's, and are turned upright by their EXIF orientation as diffusers'
// load_image does (ImageOps.exif_transpose; PNG eXIf orientation is not read). CMYK/YCCK JPEGs are
// an error naming the file. A missing, unreadable, truncated or non-image file is an
// xfuser::Error naming the file. Checked pixel for pixel against PIL 13 (RGB, gray, 1-bit, palette,
// palette+tRNS, RGBA, LA PNGs; 4:4:4/4:2:2/4:2:0, gray and EXIF-rotated JPEGs): identical. One
// known difference: 16-bit gray PNGs keep their high byte here, PIL's "I;16" clips to 255.
at::Tensor read_image(const std::filesystem::path& path);

}  // namespace xfuser::runner
