// Image input (image-to-video, img2img): PNG or JPEG files decoded to RGB.
#pragma once

#include <cstdint>
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
// The declared width x height (from the PNG's IHDR or the JPEG's frame header) is checked against
// max_image_pixels() before any pixel is decoded or allocated: a tiny file that declares a huge
// picture (a decompression bomb) is an error naming the file and both sizes.
at::Tensor read_image(const std::filesystem::path& path);

// The largest picture (width x height) read_image and read_png decode: PIL's decompression-bomb
// limit, 2 x Image.MAX_IMAGE_PIXELS = 178956970 (a 13377 x 13377 picture, 537 MB as RGB), unless a
// program raises or lowers it (xfuser-run's --max_input_pixels). Process-wide.
inline constexpr int64_t kDefaultMaxImagePixels = 178956970;
int64_t max_image_pixels();
void set_max_image_pixels(int64_t pixels);

// Throws, naming the file, the flag and the sizes, when width x height exceeds `limit`.
void check_image_pixels(const std::filesystem::path& path, int64_t width, int64_t height,
                        int64_t limit);

}  // namespace xfuser::runner
