#include "runner/image_input.h"

#include <atomic>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <ATen/ATen.h>

// jpeglib.h needs size_t and FILE declared first.
#include <jerror.h>
#include <jpeglib.h>

#include "backends/error.h"
#include "runner/outputs.h"

namespace xfuser::runner {
namespace fs = std::filesystem;

namespace {

constexpr unsigned char kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
constexpr unsigned char kJpegMagic[3] = {0xFF, 0xD8, 0xFF};

std::string read_all(const fs::path& path) {
  std::error_code ec;
  XF_CHECK(fs::exists(path, ec), "image ", path.string(), " does not exist");
  XF_CHECK(!fs::is_directory(path, ec), "image ", path.string(), " is a folder, not a file");
  std::ifstream in(path, std::ios::binary);
  XF_CHECK(in.good(), "cannot open image ", path.string(), ": ", std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  XF_CHECK(!in.bad(), "cannot read image ", path.string(), ": ", std::strerror(errno));
  return bytes;
}

bool starts_with(const std::string& bytes, const unsigned char* magic, size_t n) {
  return bytes.size() >= n && std::memcmp(bytes.data(), magic, n) == 0;
}

// libjpeg's errors jump back to decode_jpeg (its frames are C: nothing to unwind there).
struct JpegErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings are ignored (as PIL does: e.g. extraneous bytes before a marker), except a premature
// end of data: libjpeg would fill the rest with gray, PIL reports the file as truncated.
void jpeg_emit_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    (*cinfo->err->error_exit)(cinfo);
  }
}

// The EXIF orientation (1-8, tag 0x0112 of IFD0) in an APP1 "Exif" payload; 1 when absent or
// unreadable. Every read is bounds-checked: the payload is untrusted.
int exif_orientation(const uint8_t* data, size_t size) {
  if (size < 14 || std::memcmp(data, "Exif\0\0", 6) != 0) return 1;
  const uint8_t* tiff = data + 6;
  const size_t n = size - 6;
  const bool little = tiff[0] == 'I' && tiff[1] == 'I';
  if (!little && !(tiff[0] == 'M' && tiff[1] == 'M')) return 1;
  auto u16 = [&](size_t at) -> uint32_t {
    return little ? tiff[at] | (tiff[at + 1] << 8) : (tiff[at] << 8) | tiff[at + 1];
  };
  auto u32 = [&](size_t at) -> uint32_t {
    return little ? u16(at) | (u16(at + 2) << 16) : (u16(at) << 16) | u16(at + 2);
  };
  if (u16(2) != 42) return 1;
  const size_t ifd = u32(4);
  if (ifd > n || n - ifd < 2) return 1;
  const size_t entries = u16(ifd);
  for (size_t i = 0; i < entries; ++i) {
    const size_t entry = ifd + 2 + 12 * i;
    if (entry > n || n - entry < 12) return 1;
    if (u16(entry) == 0x0112) {
      const uint32_t value = u16(entry + 2) == 3 ? u16(entry + 8) : 1;  // type SHORT
      return value >= 1 && value <= 8 ? static_cast<int>(value) : 1;
    }
  }
  return 1;
}

// What PIL's ImageOps.exif_transpose does for orientation 2-8 (diffusers' load_image applies it
// before convert("RGB")): the image as it is meant to be displayed.
at::Tensor apply_orientation(const at::Tensor& image, int orientation) {
  switch (orientation) {
    case 2:  // mirrored horizontally
      return image.flip({1});
    case 3:  // rotated 180
      return image.flip({0, 1});
    case 4:  // mirrored vertically
      return image.flip({0});
    case 5:  // transposed
      return image.permute({1, 0, 2});
    case 6:  // rotate 90 clockwise to display
      return image.flip({0}).permute({1, 0, 2});
    case 7:  // transversed
      return image.flip({0, 1}).permute({1, 0, 2});
    case 8:  // rotate 90 counter-clockwise to display
      return image.flip({1}).permute({1, 0, 2});
    default:
      return image;
  }
}

// Decodes a JPEG held in memory to RGB into *pixels (and its EXIF orientation); false with
// *error set on failure. Only trivially destructible locals live between setjmp and a longjmp.
bool decode_jpeg(const std::string& bytes, std::vector<uint8_t>* pixels, int* height, int* width,
                 int* orientation, std::string* error) {
  jpeg_decompress_struct cinfo;
  JpegErrorManager err;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_error_exit;
  err.pub.emit_message = jpeg_emit_message;
  err.message[0] = '\0';
  if (setjmp(err.jump) != 0) {
    jpeg_destroy_decompress(&cinfo);
    *error = err.message;
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);
  jpeg_read_header(&cinfo, TRUE);
  // Before jpeg_start_decompress allocates anything for the frame.
  const int64_t limit = max_image_pixels();
  if (static_cast<int64_t>(cinfo.image_width) * cinfo.image_height > limit) {
    *height = static_cast<int>(cinfo.image_height);
    *width = static_cast<int>(cinfo.image_width);
    jpeg_destroy_decompress(&cinfo);
    *error = "too many pixels";
    return false;
  }
  *orientation = 1;
  for (jpeg_saved_marker_ptr m = cinfo.marker_list; m != nullptr; m = m->next) {
    if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 &&
        std::memcmp(m->data, "Exif\0\0", 6) == 0) {
      *orientation = exif_orientation(m->data, m->data_length);
      break;
    }
  }
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    *error = "CMYK JPEGs are not supported (convert the image to RGB)";
    return false;
  }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  *height = static_cast<int>(cinfo.output_height);
  *width = static_cast<int>(cinfo.output_width);
  const size_t row_bytes = static_cast<size_t>(cinfo.output_width) * 3;
  pixels->resize(row_bytes * cinfo.output_height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = pixels->data() + static_cast<size_t>(cinfo.output_scanline) * row_bytes;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

at::Tensor read_jpeg(const fs::path& path, const std::string& bytes) {
  std::vector<uint8_t> pixels;
  int height = 0, width = 0, orientation = 1;
  std::string error;
  if (!decode_jpeg(bytes, &pixels, &height, &width, &orientation, &error)) {
    if (error == "too many pixels") check_image_pixels(path, width, height, max_image_pixels());
    XF_THROW("cannot decode JPEG image ", path.string(), ": ", error);
  }
  at::Tensor image =
      at::empty({height, width, 3}, at::TensorOptions().dtype(at::kByte).device(at::kCPU));
  std::memcpy(image.data_ptr<uint8_t>(), pixels.data(), pixels.size());
  return apply_orientation(image, orientation).contiguous();
}

at::Tensor read_png_rgb(const fs::path& path, const std::string& bytes) {
  at::Tensor image = read_png(path);
  // read_png unpacks 1/2/4-bit gray to one byte per pixel without scaling (values 0..2^d - 1);
  // PIL scales them to 0..255. The IHDR chunk (always first) gives the depth and colour type.
  if (bytes.size() >= 33 && std::memcmp(bytes.data() + 12, "IHDR", 4) == 0) {
    const int depth = static_cast<unsigned char>(bytes[24]);
    const int color_type = static_cast<unsigned char>(bytes[25]);
    const int top = (1 << depth) - 1;
    if (color_type == 0 && depth < 8 && image.size(2) == 1 && image.max().item<int>() <= top) {
      image = (image * (255 / top)).to(at::kByte);  // 255 / top is exact for depths 1, 2, 4
    }
  }
  switch (image.size(2)) {
    case 1:  // gray
      return image.expand({image.size(0), image.size(1), 3}).contiguous();
    case 2:  // gray + alpha: alpha dropped
      return image.narrow(2, 0, 1).expand({image.size(0), image.size(1), 3}).contiguous();
    case 3:
      return image;
    case 4:  // RGBA: alpha dropped, nothing composited (PIL's convert("RGB"))
      return image.narrow(2, 0, 3).contiguous();
    default:
      XF_THROW("PNG image ", path.string(), " has ", image.size(2), " channels; expected 1-4");
  }
}

std::atomic<int64_t> g_max_image_pixels{kDefaultMaxImagePixels};

}  // namespace

int64_t max_image_pixels() { return g_max_image_pixels.load(); }

void set_max_image_pixels(int64_t pixels) {
  XF_CHECK(pixels >= 1, "--max_input_pixels must be >= 1 (got ", pixels, ")");
  g_max_image_pixels = pixels;
}

void check_image_pixels(const fs::path& path, int64_t width, int64_t height, int64_t limit) {
  XF_CHECK(width * height <= limit, "image ", path.string(), " declares ", width, "x", height,
           " = ", width * height, " pixels, more than the limit of ", limit,
           " (a decompression-bomb guard, as PIL's; raise it with --max_input_pixels if the "
           "picture is real)");
}

at::Tensor read_image(const fs::path& path) {
  XF_CONTEXT("reading image ", path.string());
  const std::string bytes = read_all(path);
  if (starts_with(bytes, kPngMagic, sizeof(kPngMagic))) return read_png_rgb(path, bytes);
  if (starts_with(bytes, kJpegMagic, sizeof(kJpegMagic))) return read_jpeg(path, bytes);
  XF_THROW("image ", path.string(), " is neither a PNG nor a JPEG file (",
           bytes.empty() ? std::string("it is empty") : "unknown leading bytes",
           "); only PNG and JPEG images are read");
}

}  // namespace xfuser::runner
