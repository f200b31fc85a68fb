#include <unistd.h>

#include <fstream>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "backends/error.h"
#include "models/vae/pixels.h"
#include "runner/outputs.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using namespace xfuser::runner;

TEST(Outputs, PngRoundTripKeepsPixelsAndText) {
  xfuser::testing::TempDir dir;
  at::Tensor img = at::randint(0, 256, {17, 23, 3}, at::kByte);
  std::map<std::string, std::string> text = {{"prompt", "a cat, \"quoted\""}, {"seed", "42"}};
  write_png(dir / "a.png", img, text);
  std::map<std::string, std::string> back_text;
  at::Tensor back = read_png(dir / "a.png", &back_text);
  EXPECT_TRUE(at::equal(back, img));
  EXPECT_EQ(back_text, text);
  // Same input, same bytes.
  EXPECT_EQ(encode_png(img, text), encode_png(img, text));
}

TEST(Outputs, GrayscaleAndBadShapes) {
  at::Tensor gray = at::randint(0, 256, {4, 5, 1}, at::kByte);
  EXPECT_FALSE(encode_png(gray, {}).empty());
  try {
    encode_png(at::zeros({4, 5, 3}, at::kFloat), {});
    FAIL();
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("uint8 image [H, W, 3]"), std::string::npos);
  }
}

TEST(Outputs, AtomicWriteLeavesNoTemporaryFiles) {
  xfuser::testing::TempDir dir;
  write_file_atomic(dir / "t.json", "[1.5]");
  write_file_atomic(dir / "t.json", "[2.5]");
  std::ifstream in(dir / "t.json");
  std::string s((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(s, "[2.5]");
  int files = 0;
  for (auto& e : fs::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(Outputs, UnwritableDirectoryIsNamed) {
  if (geteuid() == 0) {
    // root bypasses permission bits; a path under a regular file can never be a folder.
    xfuser::testing::TempDir dir;
    write_file_atomic(dir / "file", "x");
    try {
      ensure_writable_directory(dir / "file" / "sub");
      FAIL();
    } catch (const xfuser::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--output_directory"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("file/sub"), std::string::npos);
    }
    return;
  }
  xfuser::testing::TempDir dir;
  fs::create_directory(dir / "ro");
  chmod((dir / "ro").c_str(), 0555);
  EXPECT_THROW(ensure_writable_directory(dir / "ro"), xfuser::Error);
}

TEST(Outputs, CreatesMissingOutputDirectory) {
  xfuser::testing::TempDir dir;
  ensure_writable_directory(dir / "a" / "b");
  EXPECT_TRUE(fs::is_directory(dir / "a" / "b"));
}

TEST(Outputs, XditFileNames) {
  EXPECT_EQ(output_file_name("FLUX.1-dev", 4, 2, false, 1024, 768, 0, "png"),
            "FLUX.1-dev_u4r2_tc_False_1024x768_0.png");
  EXPECT_EQ(output_file_name("tiny-flux", 1, 1, true, 256, 256, 12, "png"),
            "tiny-flux_u1r1_tc_True_256x256_12.png");
}

// The degrees beyond u/r join the name when they are not 1, so runs of several
// layouts share one folder.
TEST(Outputs, NamesCarryEveryDegreeThatIsNotOne) {
  EXPECT_EQ(output_file_name("tiny-flux", 1, 1, false, 64, 48, 0, "png", {}),
            "tiny-flux_u1r1_tc_False_64x48_0.png");
  EXPECT_EQ(output_file_name("tiny-flux", 1, 1, false, 64, 48, 0, "png", {2, 1, 1, 1}),
            "tiny-flux_u1r1_tp2_tc_False_64x48_0.png");
  EXPECT_EQ(output_file_name("FLUX.1-dev", 2, 1, false, 1024, 1024, 3, "png", {1, 2, 2, 4}),
            "FLUX.1-dev_u2r1_pp2_cfg2_dp4_tc_False_1024x1024_3.png");
  EXPECT_EQ(output_file_name("m", 1, 2, true, 16, 16, 0, "png", {2, 2, 2, 2}),
            "m_u1r2_tp2_pp2_cfg2_dp2_tc_True_16x16_0.png");
  // --task after the size, as xDiT's runner adds it.
  EXPECT_EQ(output_file_name("HunyuanVideo-1.5-I2V", 1, 1, false, 720, 1280, 0, "mp4", {}, "i2v"),
            "HunyuanVideo-1.5-I2V_u1r1_tc_False_720x1280_i2v_0.mp4");
}

// Text that is not ASCII is stored as iTXt (UTF-8), which readers decode as
// UTF-8; ASCII stays tEXt. Values read back unchanged.
TEST(Outputs, NonAsciiTextIsStoredAsItxt) {
  const at::Tensor img = at::zeros({2, 2, 3}, at::kByte);
  const std::string prompt = "\xe6\x97\xa5\xe6\x9c\xac\xe3\x81\xae caf\xc3\xa9";  // 日本の café
  const std::string png = encode_png(img, {{"prompt", prompt}, {"seed", "42"}});
  // The prompt in an iTXt chunk: keyword, NUL, compression flag 0, method 0, "" lang, "" key.
  const std::string itxt = std::string("iTXtprompt") + '\0' + '\0' + '\0' + '\0' + '\0' + prompt;
  EXPECT_NE(png.find(itxt), std::string::npos);
  EXPECT_NE(png.find(std::string("tEXtseed") + '\0' + "42"), std::string::npos);
  EXPECT_EQ(png.find("tEXtprompt"), std::string::npos);
  xfuser::testing::TempDir dir;
  write_file_atomic(dir / "a.png", png);
  std::map<std::string, std::string> text;
  read_png(dir / "a.png", &text);
  EXPECT_EQ(text["prompt"], prompt);
  EXPECT_EQ(text["seed"], "42");
}

// A second run into a folder another run holds is refused at once, naming the
// folder; the lock leaves no file behind and ends with its holder.
TEST(Outputs, ASecondRunIntoALockedFolderIsRefused) {
  xfuser::testing::TempDir dir;
  {
    OutputDirectoryLock first(dir.path());
    try {
      OutputDirectoryLock second(dir.path());
      FAIL() << "a second lock on " << dir.path() << " was granted";
    } catch (const xfuser::Error& e) {
      EXPECT_NE(e.message().find("--output_directory " + dir.path().string() +
                                 " is in use by another xfuser-run"),
                std::string::npos)
          << e.message();
    }
    EXPECT_TRUE(fs::is_empty(dir.path()));
  }
  EXPECT_NO_THROW(OutputDirectoryLock again(dir.path()));
}

TEST(Outputs, Uint8ConversionMatchesDiffusersPostprocess) {
  // x in [-1, 1] -> (x/2+0.5).clamp(0,1)*255, rounded half to even (numpy's round, as at::round).
  at::Tensor x = at::tensor({-2.0f, -1.0f, 0.0f, 1.0f, 3.0f, 1.0f / 255.0f}).view({1, 3, 1, 2});
  at::Tensor u = xfuser::models::vae::decoded_to_pixels(x);
  ASSERT_EQ(u.sizes(), (std::vector<int64_t>{1, 1, 2, 3}));
  // channels-last: pixel 0 = (c0, c1, c2) = (-2, 0, 3), pixel 1 = (-1, 1, 1/255)
  EXPECT_EQ(u[0][0][0][0].item<uint8_t>(), 0);
  EXPECT_EQ(u[0][0][0][1].item<uint8_t>(), 128);  // 127.5 -> 128 (half to even)
  EXPECT_EQ(u[0][0][0][2].item<uint8_t>(), 255);
  EXPECT_EQ(u[0][0][1][0].item<uint8_t>(), 0);
  EXPECT_EQ(u[0][0][1][1].item<uint8_t>(), 255);
  EXPECT_EQ(u[0][0][1][2].item<uint8_t>(), 128);  // (1/255/2 + 0.5)*255 = 128.0
  // Videos [B, 3, F, H, W] -> [B, F, H, W, 3].
  EXPECT_EQ(xfuser::models::vae::decoded_to_pixels(at::zeros({2, 3, 5, 4, 6})).sizes(),
            (std::vector<int64_t>{2, 5, 4, 6, 3}));
  // A NaN is an error naming how many pictures hold one, never a black pixel.
  at::Tensor nan = at::zeros({3, 3, 2, 2});
  nan[1][2][0][1] = NAN;
  xfuser::testing::expect_error_containing([&] { xfuser::models::vae::decoded_to_pixels(nan); },
                                           {"not finite (NaN or Inf) in 1 of 3 picture(s)"});
}

}  // namespace
