// Video output (runner/video.h: H.264 MP4 through FFmpeg) and image input (runner/image_input.h:
// PNG and JPEG to RGB).
#include <png.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

#include "backends/error.h"
#include "runner/image_input.h"
#include "runner/outputs.h"
#include "runner/video.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using namespace xfuser::runner;
using xfuser::testing::expect_error_containing;
using xfuser::testing::TempDir;

// Smooth gradients that move over time: [F, H, W, 3] uint8.
at::Tensor moving_gradients(int64_t frames, int64_t height, int64_t width) {
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor t = at::arange(frames, opts).view({frames, 1, 1});
  const at::Tensor y = at::arange(height, opts).view({1, height, 1});
  const at::Tensor x = at::arange(width, opts).view({1, 1, width});
  const double pi = 3.14159265358979;
  const at::Tensor r = 128 + 90 * at::sin(2 * pi * (x / width + t / frames));
  const at::Tensor g = 40 + 170 * (y / height) + 0 * t + 0 * x;
  const at::Tensor b = 128 + 80 * at::cos(2 * pi * ((x + y) / (width + height) - t / frames));
  return at::stack({r.expand({frames, height, width}), g.expand({frames, height, width}),
                    b.expand({frames, height, width})},
                   3)
      .round()
      .clamp(0, 255)
      .to(at::kByte);
}

std::vector<std::string> folder_entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

double mean_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().mean().item<double>();
}
int max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kInt) - b.to(at::kInt)).abs().max().item<int>();
}

const std::string kPrompt = "a cat on a \xe6\x97\xa5\xe6\x9c\xac\xe3\x81\xae caf\xc3\xa9 table";

// ---- video ----------------------------------------------------------------------------------

TEST(Video, RoundTripKeepsSizeRateCodecMetadataAndPixels) {
  TempDir dir;
  const at::Tensor frames = moving_gradients(9, 48, 64);
  const std::map<std::string, std::string> metadata = {
      {"comment", "prompt: " + kPrompt + "\nseed: 42\nsteps: 30"}, {"prompt", kPrompt}};
  write_mp4(dir / "v.mp4", frames, 16.0, metadata);
  EXPECT_EQ(folder_entries(dir.path()), std::vector<std::string>{"v.mp4"});  // no temp file

  const VideoInfo info = read_video_info(dir / "v.mp4");
  EXPECT_EQ(info.frames, 9);
  EXPECT_EQ(info.width, 64);
  EXPECT_EQ(info.height, 48);
  EXPECT_NEAR(info.fps, 16.0, 1e-9);
  EXPECT_EQ(info.codec, "h264");
  EXPECT_EQ(info.pixel_format, "yuv420p");
  for (const auto& [key, value] : metadata) {
    ASSERT_EQ(info.metadata.count(key), 1u) << key;
    EXPECT_EQ(info.metadata.at(key), value) << key;
  }

  const at::Tensor back = read_video_frames(dir / "v.mp4");
  ASSERT_EQ(back.sizes(), frames.sizes());
  EXPECT_EQ(back.scalar_type(), at::kByte);
  const double mad = mean_abs_diff(back, frames);
  const int mx = max_abs_diff(back, frames);
  EXPECT_LT(mad, 3.0);
  EXPECT_LT(mx, 40);
  // Every frame is near its own input, not just the clip on average (order and count kept).
  for (int64_t f = 0; f < frames.size(0); ++f) {
    EXPECT_LT(mean_abs_diff(back[f], frames[f]), 3.0) << "frame " << f;
    if (f > 0) {
      EXPECT_GT(mean_abs_diff(back[f], frames[f - 1]), 3 * mad) << "frame " << f;
    }
  }
}

TEST(Video, SolidColoursDecodeToThemselves) {
  // Whole-frame colours check the colour matrix and range round trip (a BT.601 / BT.709 or
  // limited / full range mix-up moves red or blue by 10 or more).
  TempDir dir;
  const std::vector<std::array<int, 3>> colours = {{255, 0, 0},     {0, 255, 0}, {0, 0, 255},
                                                   {255, 255, 255}, {0, 0, 0},   {200, 120, 40}};
  at::Tensor frames = at::empty({static_cast<int64_t>(colours.size()), 16, 16, 3}, at::kByte);
  for (size_t i = 0; i < colours.size(); ++i) {
    for (int c = 0; c < 3; ++c) frames[i].select(2, c).fill_(colours[i][c]);
  }
  write_mp4(dir / "c.mp4", frames, 8.0);
  const at::Tensor back = read_video_frames(dir / "c.mp4");
  ASSERT_EQ(back.sizes(), frames.sizes());
  EXPECT_LE(max_abs_diff(back, frames), 3);
}

TEST(Video, AnyStridesAndFractionalFps) {
  TempDir dir;
  const at::Tensor frames = moving_gradients(5, 32, 48);
  // The same frames as a non-contiguous view ([F, 3, H, W] permuted).
  const at::Tensor strided = frames.permute({0, 3, 1, 2}).contiguous().permute({0, 2, 3, 1});
  ASSERT_FALSE(strided.is_contiguous());
  write_mp4(dir / "a.mp4", frames, 23.976);
  write_mp4(dir / "b.mp4", strided, 23.976);
  const VideoInfo info = read_video_info(dir / "b.mp4");
  EXPECT_EQ(info.frames, 5);
  EXPECT_NEAR(info.fps, 23.976, 1e-3);
  EXPECT_TRUE(at::equal(read_video_frames(dir / "a.mp4"), read_video_frames(dir / "b.mp4")));

  write_mp4(dir / "c.mp4", frames, 24000.0 / 1001.0);
  EXPECT_NEAR(read_video_info(dir / "c.mp4").fps, 24000.0 / 1001.0, 1e-6);
  write_mp4(dir / "one.mp4", frames.narrow(0, 0, 1), 16.0);  // a single frame is a video too
  EXPECT_EQ(read_video_info(dir / "one.mp4").frames, 1);
}

TEST(Video, BadInputsAreClearErrorsAndLeaveNoFile) {
  TempDir dir;
  const fs::path out = dir / "bad.mp4";
  const at::Tensor good = moving_gradients(3, 16, 16);
  expect_error_containing([&] { write_mp4(out, moving_gradients(3, 15, 16), 16.0); },
                          {out.string(), "15x16", "even"});
  expect_error_containing([&] { write_mp4(out, moving_gradients(3, 16, 17), 16.0); },
                          {out.string(), "16x17", "even"});
  expect_error_containing([&] { write_mp4(out, good.to(at::kFloat), 16.0); },
                          {out.string(), "uint8", "Float", "[3, 16, 16, 3]"});
  expect_error_containing([&] { write_mp4(out, good[0], 16.0); },
                          {out.string(), "[F, H, W, 3]", "[16, 16, 3]"});
  expect_error_containing([&] { write_mp4(out, good.narrow(3, 0, 1), 16.0); },
                          {out.string(), "[3, 16, 16, 1]"});
  expect_error_containing([&] { write_mp4(out, good.narrow(0, 0, 0), 16.0); },
                          {out.string(), "[0, 16, 16, 3]"});
  for (double fps : {0.0, -16.0, std::nan("")}) {
    expect_error_containing([&] { write_mp4(out, good, fps); }, {out.string(), "fps"});
  }
  expect_error_containing(
      [&] {
        write_mp4(out, good, 16.0, {{"", "x"}});
      },
      {out.string(), "metadata"});
  EXPECT_TRUE(fs::is_empty(dir.path())) << folder_entries(dir.path()).size();

  // A folder that cannot hold files: the path under a regular file (root ignores permissions).
  write_text(dir / "file", "x");
  const fs::path under_file = dir / "file" / "v.mp4";
  expect_error_containing([&] { write_mp4(under_file, good, 16.0); },
                          {under_file.string(), "cannot create"});
  const fs::path missing = dir / "missing" / "v.mp4";
  expect_error_containing([&] { write_mp4(missing, good, 16.0); }, {missing.string()});
  EXPECT_EQ(folder_entries(dir.path()), std::vector<std::string>{"file"});
}

TEST(Video, ExistingFileIsReplacedOnlyOnSuccess) {
  TempDir dir;
  const fs::path out = dir / "v.mp4";
  write_text(out, "old");
  EXPECT_THROW(write_mp4(out, moving_gradients(3, 15, 16), 16.0), xfuser::Error);
  EXPECT_EQ(read_text(out), "old");
  write_mp4(out, moving_gradients(3, 16, 16), 16.0);
  EXPECT_EQ(read_video_info(out).frames, 3);
  EXPECT_EQ(folder_entries(dir.path()), std::vector<std::string>{"v.mp4"});

  // A failure after encoding (the rename onto a non-empty folder) removes the temp file.
  fs::create_directory(dir / "d.mp4");
  write_text(dir / "d.mp4" / "keep", "k");
  expect_error_containing([&] { write_mp4(dir / "d.mp4", moving_gradients(2, 16, 16), 16.0); },
                          {(dir / "d.mp4").string(), "renaming"});
  EXPECT_EQ(folder_entries(dir.path()), (std::vector<std::string>{"d.mp4", "v.mp4"}));
  EXPECT_EQ(read_text(dir / "d.mp4" / "keep"), "k");
}

TEST(Video, ReadersNameTheFile) {
  TempDir dir;
  expect_error_containing([&] { read_video_info(dir / "none.mp4"); },
                          {(dir / "none.mp4").string()});
  write_text(dir / "text.mp4", "this is not a video\n");
  expect_error_containing([&] { read_video_frames(dir / "text.mp4"); },
                          {(dir / "text.mp4").string()});
}

// ---- image input ----------------------------------------------------------------------------

// Writes an 8-bit (or `depth`-bit gray) PNG with libpng; `image` [H, W, C] uint8 contiguous.
void write_png_raw(const fs::path& path, const at::Tensor& image, int color_type, int depth = 8) {
  FILE* fp = std::fopen(path.c_str(), "wb");
  ASSERT_NE(fp, nullptr);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_init_io(png, fp);
  const auto h = static_cast<png_uint_32>(image.size(0));
  const auto w = static_cast<png_uint_32>(image.size(1));
  png_set_IHDR(png, info, w, h, depth, color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  if (depth < 8) png_set_packing(png);
  const at::Tensor img = image.contiguous();
  const size_t row = static_cast<size_t>(w) * img.size(2);
  for (png_uint_32 y = 0; y < h; ++y) {
    png_write_row(png, const_cast<png_bytep>(img.data_ptr<uint8_t>() + y * row));
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(fp);
}

// Writes a JPEG with libjpeg: `image` [H, W, C] uint8 (C = 3 RGB, 1 gray, 4 CMYK); `app1`, when
// given, as an APP1 marker (EXIF).
void write_jpeg(const fs::path& path, const at::Tensor& image, int quality,
                const std::string& app1 = "") {
  FILE* fp = std::fopen(path.c_str(), "wb");
  ASSERT_NE(fp, nullptr);
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, fp);
  cinfo.image_width = static_cast<JDIMENSION>(image.size(1));
  cinfo.image_height = static_cast<JDIMENSION>(image.size(0));
  cinfo.input_components = static_cast<int>(image.size(2));
  cinfo.in_color_space =
      image.size(2) == 3 ? JCS_RGB : (image.size(2) == 1 ? JCS_GRAYSCALE : JCS_CMYK);
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  if (!app1.empty()) {
    jpeg_write_marker(&cinfo, JPEG_APP0 + 1, reinterpret_cast<const JOCTET*>(app1.data()),
                      static_cast<unsigned>(app1.size()));
  }
  const at::Tensor img = image.contiguous();
  const size_t row = static_cast<size_t>(image.size(1)) * image.size(2);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW p = img.data_ptr<uint8_t>() + cinfo.next_scanline * row;
    jpeg_write_scanlines(&cinfo, &p, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::fclose(fp);
}

at::Tensor random_image(int64_t h, int64_t w, int64_t c) {
  return at::randint(0, 256, {h, w, c}, at::kByte);
}

TEST(ImageInput, PngRgbRgbaGrayAndLowBitGray) {
  TempDir dir;
  const at::Tensor rgb = random_image(13, 17, 3);
  write_png(dir / "rgb.png", rgb);
  EXPECT_TRUE(at::equal(read_image(dir / "rgb.png"), rgb));

  const at::Tensor gray = random_image(13, 17, 1);
  write_png(dir / "gray.png", gray);
  const at::Tensor gray_back = read_image(dir / "gray.png");
  ASSERT_EQ(gray_back.sizes(), (std::vector<int64_t>{13, 17, 3}));
  for (int c = 0; c < 3; ++c) EXPECT_TRUE(at::equal(gray_back.select(2, c), gray.select(2, 0)));

  const at::Tensor rgba = random_image(13, 17, 4);
  write_png_raw(dir / "rgba.png", rgba, PNG_COLOR_TYPE_RGB_ALPHA);
  EXPECT_TRUE(at::equal(read_image(dir / "rgba.png"), rgba.narrow(2, 0, 3)));  // alpha dropped

  const at::Tensor gray_alpha = random_image(5, 7, 2);
  write_png_raw(dir / "ga.png", gray_alpha, PNG_COLOR_TYPE_GRAY_ALPHA);
  EXPECT_TRUE(at::equal(read_image(dir / "ga.png"), gray_alpha.narrow(2, 0, 1).expand({5, 7, 3})));

  // 1- and 2-bit gray scale to 0..255 as PIL's convert("RGB"): 0/1 -> 0/255, 0..3 -> 0..255.
  const at::Tensor bits = at::randint(0, 2, {6, 9, 1}, at::kByte);
  write_png_raw(dir / "bits.png", bits, PNG_COLOR_TYPE_GRAY, 1);
  EXPECT_TRUE(
      at::equal(read_image(dir / "bits.png"), (bits * 255).to(at::kByte).expand({6, 9, 3})));
  const at::Tensor two = at::randint(0, 4, {6, 9, 1}, at::kByte);
  write_png_raw(dir / "two.png", two, PNG_COLOR_TYPE_GRAY, 2);
  EXPECT_TRUE(at::equal(read_image(dir / "two.png"), (two * 85).to(at::kByte).expand({6, 9, 3})));

  // The magic bytes decide, not the name.
  write_png(dir / "named.jpg", rgb);
  EXPECT_TRUE(at::equal(read_image(dir / "named.jpg"), rgb));
}

TEST(ImageInput, JpegRgbGrayAndCmyk) {
  TempDir dir;
  const at::Tensor rgb = moving_gradients(1, 40, 56)[0].contiguous();
  write_jpeg(dir / "a.jpg", rgb, 95);
  const at::Tensor back = read_image(dir / "a.jpg");
  ASSERT_EQ(back.sizes(), rgb.sizes());
  EXPECT_EQ(back.scalar_type(), at::kByte);
  EXPECT_LT(mean_abs_diff(back, rgb), 2.0);
  EXPECT_LE(max_abs_diff(back, rgb), 16);

  const at::Tensor gray = rgb.narrow(2, 1, 1).contiguous();
  write_jpeg(dir / "g.jpeg", gray, 95);
  const at::Tensor gray_back = read_image(dir / "g.jpeg");
  ASSERT_EQ(gray_back.sizes(), rgb.sizes());
  EXPECT_TRUE(at::equal(gray_back.select(2, 0), gray_back.select(2, 2)));
  EXPECT_LT(mean_abs_diff(gray_back.narrow(2, 0, 1), gray), 2.0);

  write_jpeg(dir / "named.png", rgb, 95);  // a JPEG named .png is read as a JPEG
  EXPECT_TRUE(at::equal(read_image(dir / "named.png"), back));

  write_jpeg(dir / "cmyk.jpg", random_image(8, 8, 4), 95);
  expect_error_containing([&] { read_image(dir / "cmyk.jpg"); },
                          {(dir / "cmyk.jpg").string(), "CMYK"});
}

// An APP1 EXIF payload whose IFD0 holds one entry, Orientation (0x0112, SHORT) = `orientation`.
std::string exif_with_orientation(int orientation, bool big_endian) {
  std::string tiff;
  auto u16 = [&](int v) {
    const char lo = static_cast<char>(v & 0xFF), hi = static_cast<char>((v >> 8) & 0xFF);
    tiff += big_endian ? std::string{hi, lo} : std::string{lo, hi};
  };
  auto u32 = [&](uint32_t v) {
    if (big_endian) {
      u16(static_cast<int>(v >> 16));
      u16(static_cast<int>(v & 0xFFFF));
    } else {
      u16(static_cast<int>(v & 0xFFFF));
      u16(static_cast<int>(v >> 16));
    }
  };
  tiff += big_endian ? "MM" : "II";
  u16(42);
  u32(8);  // IFD0 right after the header
  u16(1);  // one entry
  u16(0x0112);
  u16(3);  // SHORT
  u32(1);
  u16(orientation);
  u16(0);
  u32(0);  // no next IFD
  return std::string("Exif\0\0", 6) + tiff;
}

// EXIF orientation turns a JPEG upright as diffusers' load_image (PIL's exif_transpose) does.
// Expectations from the EXIF definition of the tag (where the stored 0th row and 0th column are
// displayed), independent of how the reader implements it: the stored image has a red block at
// its first pixel and a green block at the end of its first row.
TEST(ImageInput, JpegExifOrientationIsApplied) {
  TempDir dir;
  const int64_t h = 32, w = 48, b = 8;
  at::Tensor stored = at::full({h, w, 3}, 128, at::kByte);
  stored.narrow(0, 0, b).narrow(1, 0, b).copy_(
      at::tensor({255, 0, 0}, at::kByte).expand({b, b, 3}));
  stored.narrow(0, 0, b)
      .narrow(1, w - b, b)
      .copy_(at::tensor({0, 255, 0}, at::kByte).expand({b, b, 3}));
  enum Corner { kTopLeft, kTopRight, kBottomLeft, kBottomRight };
  // orientation -> where the first pixel (red) and the end of the first row (green) display.
  const std::map<int, std::pair<Corner, Corner>> expected = {
      {1, {kTopLeft, kTopRight}},       {2, {kTopRight, kTopLeft}},
      {3, {kBottomRight, kBottomLeft}}, {4, {kBottomLeft, kBottomRight}},
      {5, {kTopLeft, kBottomLeft}},     {6, {kTopRight, kBottomRight}},
      {7, {kBottomRight, kTopRight}},   {8, {kBottomLeft, kTopLeft}}};
  auto corner_mean = [&](const at::Tensor& img, Corner c) {
    const int64_t y = (c == kTopLeft || c == kTopRight) ? 0 : img.size(0) - b;
    const int64_t x = (c == kTopLeft || c == kBottomLeft) ? 0 : img.size(1) - b;
    return img.narrow(0, y + 2, b - 4)
        .narrow(1, x + 2, b - 4)
        .to(at::kFloat)
        .mean(at::IntArrayRef{0, 1});
  };
  for (const auto& [orientation, corners] : expected) {
    for (bool big_endian : {false, true}) {
      const fs::path file = dir / ("o" + std::to_string(orientation) + ".jpg");
      write_jpeg(file, stored, 95, exif_with_orientation(orientation, big_endian));
      const at::Tensor img = read_image(file);
      const bool swapped = orientation >= 5;
      EXPECT_EQ(img.size(0), swapped ? w : h) << "orientation " << orientation;
      EXPECT_EQ(img.size(1), swapped ? h : w) << "orientation " << orientation;
      EXPECT_TRUE(img.is_contiguous());
      const at::Tensor red = corner_mean(img, corners.first);
      const at::Tensor green = corner_mean(img, corners.second);
      EXPECT_GT(red[0].item<float>(), 200) << "orientation " << orientation;
      EXPECT_LT(red[1].item<float>(), 60) << "orientation " << orientation;
      EXPECT_GT(green[1].item<float>(), 200) << "orientation " << orientation;
      EXPECT_LT(green[0].item<float>(), 60) << "orientation " << orientation;
    }
  }
  // A malformed EXIF payload (IFD offset past the end) is ignored, as an absent one.
  std::string bad = exif_with_orientation(6, false);
  bad[10] = 0x7F;
  write_jpeg(dir / "bad.jpg", stored, 95, bad);
  EXPECT_EQ(read_image(dir / "bad.jpg").sizes(), stored.sizes());
}

TEST(ImageInput, BadFilesNameTheFile) {
  TempDir dir;
  write_jpeg(dir / "full.jpg", moving_gradients(1, 64, 64)[0].contiguous(), 95);
  const std::string jpeg = read_text(dir / "full.jpg");
  write_text(dir / "cut.jpg", jpeg.substr(0, jpeg.size() / 2));
  expect_error_containing([&] { read_image(dir / "cut.jpg"); },
                          {(dir / "cut.jpg").string(), "JPEG"});
  write_text(dir / "head.jpg", jpeg.substr(0, 40));
  expect_error_containing([&] { read_image(dir / "head.jpg"); }, {(dir / "head.jpg").string()});

  write_png(dir / "full.png", random_image(32, 32, 3));
  const std::string png = read_text(dir / "full.png");
  write_text(dir / "cut.png", png.substr(0, png.size() / 2));
  expect_error_containing([&] { read_image(dir / "cut.png"); }, {(dir / "cut.png").string()});

  write_text(dir / "text.png", "not an image at all\n");
  expect_error_containing([&] { read_image(dir / "text.png"); },
                          {(dir / "text.png").string(), "neither a PNG nor a JPEG"});
  write_text(dir / "empty.jpg", "");
  expect_error_containing([&] { read_image(dir / "empty.jpg"); },
                          {(dir / "empty.jpg").string(), "empty"});
  expect_error_containing([&] { read_image(dir / "missing.png"); },
                          {(dir / "missing.png").string(), "does not exist"});
  expect_error_containing([&] { read_image(dir.path()); }, {dir.path().string(), "folder"});
}

// Declared sizes are checked against the pixel limit before any pixel is allocated: a tiny file
// declaring 100000 x 100000 (PNG) or 60000 x 60000 (JPEG) is refused naming the file and sizes.
TEST(ImageInput, DeclaredSizesAreCheckedBeforeDecoding) {
  TempDir dir;
  write_text(dir / "bomb.png", xfuser::testing::png_declaring(100000, 100000));
  expect_error_containing(
      [&] { read_image(dir / "bomb.png"); },
      {(dir / "bomb.png").string(), "declares 100000x100000 = 10000000000 pixels",
       "more than the limit of 178956970", "--max_input_pixels"});
  // read_png itself (the resume check's reader) checks the same limit.
  expect_error_containing([&] { xfuser::runner::read_png(dir / "bomb.png"); },
                          {"declares 100000x100000"});

  write_jpeg(dir / "small.jpg", random_image(8, 8, 3), 90);
  std::string jpeg = read_text(dir / "small.jpg");
  const size_t sof = jpeg.find("\xFF\xC0");  // baseline frame header: FFC0 len(2) P(1) Y(2) X(2)
  ASSERT_NE(sof, std::string::npos);
  for (size_t at : {sof + 5, sof + 7}) {
    jpeg[at] = static_cast<char>(60000 >> 8);
    jpeg[at + 1] = static_cast<char>(60000 & 0xFF);
  }
  write_text(dir / "bomb.jpg", jpeg);
  expect_error_containing(
      [&] { read_image(dir / "bomb.jpg"); },
      {(dir / "bomb.jpg").string(), "declares 60000x60000 = 3600000000 pixels"});

  // The limit is a setting: lowered, an 8 x 8 picture is refused; raised back, it is read.
  xfuser::runner::set_max_image_pixels(63);
  expect_error_containing([&] { read_image(dir / "small.jpg"); },
                          {"declares 8x8 = 64 pixels, more than the limit of 63"});
  write_png(dir / "small.png", random_image(8, 8, 3));
  expect_error_containing([&] { read_image(dir / "small.png"); }, {"declares 8x8 = 64 pixels"});
  xfuser::runner::set_max_image_pixels(64);
  EXPECT_EQ(read_image(dir / "small.jpg").sizes(), (std::vector<int64_t>{8, 8, 3}));
  EXPECT_EQ(read_image(dir / "small.png").sizes(), (std::vector<int64_t>{8, 8, 3}));
  xfuser::runner::set_max_image_pixels(xfuser::runner::kDefaultMaxImagePixels);
  expect_error_containing([&] { xfuser::runner::set_max_image_pixels(0); },
                          {"--max_input_pixels must be >= 1"});
}

}  // namespace
