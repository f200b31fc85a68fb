// The tiny HunyuanVideo-1.5 folders (models/hunyuan_video15/tiny_hunyuan_video15.h): the layout
// diffusers' HunyuanVideo15(ImageToVideo)Pipeline expects, the Qwen2 and ByT5 tokenizers through
// our loaders, determinism in the seed (byte-identical folders), `xfuser make-tiny` + xfuser-run
// --model_path on both folders (the MP4's frames and size), and the embedded tiny-hunyuan-video15
// at its defaults; the guidance scale defaults to the folder's guider (as diffusers' pipeline,
// which takes no other), and --guidance_scale still wins.
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/hunyuan_video15/hunyuan_video15_prompt.h"
#include "models/hunyuan_video15/tiny_hunyuan_video15.h"
#include "models/tokenizers/tokenizer.h"
#include "runner/outputs.h"
#include "runner/video.h"
#include "tests/test_util.h"

namespace {
namespace fs = std::filesystem;
using xfuser::models::hunyuan_video15::write_tiny_hunyuan_video15;
using xfuser::testing::read_json;
using xfuser::testing::run_command;
using xfuser::testing::TempDir;

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const std::string kRun = (xfuser::testing::binary_dir() / "bin" / "xfuser-run").string();
const std::string kTool = (xfuser::testing::binary_dir() / "bin" / "xfuser").string();

TEST(TinyHunyuanVideo15, LayoutAndTokenizers) {
  TempDir tmp("xfuser-tiny-hv15");
  write_tiny_hunyuan_video15(tmp / "t2v", 0, false);
  write_tiny_hunyuan_video15(tmp / "i2v", 0, true);
  auto index = read_json(tmp / "t2v" / "model_index.json");
  EXPECT_EQ(index["_class_name"], "HunyuanVideo15Pipeline");
  EXPECT_FALSE(index.contains("image_encoder"));
  auto i2v = read_json(tmp / "i2v" / "model_index.json");
  EXPECT_EQ(i2v["_class_name"], "HunyuanVideo15ImageToVideoPipeline");
  for (const char* name :
       {"guider", "scheduler", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2",
        "transformer", "vae", "image_encoder", "feature_extractor"}) {
    ASSERT_TRUE(i2v.contains(name)) << name;
    EXPECT_TRUE(fs::is_directory(tmp / "i2v" / name)) << name;
  }
  EXPECT_EQ(read_json(tmp / "i2v" / "transformer" / "config.json")["use_meanflow"], true);
  EXPECT_EQ(read_json(tmp / "t2v" / "transformer" / "config.json")["task_type"], "t2v");

  // Qwen2: the vocabulary (merges + the 14 specials after them) is the encoder's.
  auto tok_json = read_json(tmp / "t2v" / "tokenizer" / "tokenizer.json");
  EXPECT_EQ(tok_json["normalizer"]["type"], "NFC");
  const size_t vocab = tok_json["model"]["vocab"].size() + tok_json["added_tokens"].size();
  EXPECT_EQ(read_json(tmp / "t2v" / "text_encoder" / "config.json")["vocab_size"], vocab);
  auto qwen = xfuser::models::tokenizers::load_tokenizer(tmp / "t2v" / "tokenizer");
  const int64_t end_of_text = tok_json["added_tokens"][0]["id"];
  EXPECT_EQ(qwen->pad_id(), end_of_text);
  EXPECT_EQ(qwen->text_ids("<|im_start|>"), std::vector<int64_t>{end_of_text + 1});
  // The system message is in the corpus: merges make far fewer tokens than bytes.
  const std::string system = xfuser::models::hunyuan_video15::kSystemMessage;
  EXPECT_LT(qwen->text_ids(system).size(), system.size() / 2);
  // ByT5: bytes at 3..258, </s> at the end.
  auto byt5 = xfuser::models::tokenizers::load_tokenizer(tmp / "t2v" / "tokenizer_2");
  const auto ids = byt5->text_ids("ab");
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], 'a' + 3);
  EXPECT_EQ(ids[1], 'b' + 3);
}

TEST(TinyHunyuanVideo15, DeterministicInTheSeed) {
  TempDir tmp("xfuser-tiny-hv15-seed");
  write_tiny_hunyuan_video15(tmp / "a", 0, true);
  write_tiny_hunyuan_video15(tmp / "b", 0, true);
  write_tiny_hunyuan_video15(tmp / "c", 1, true);
  size_t files = 0;
  uintmax_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(tmp / "a")) {
    if (!e.is_regular_file()) continue;
    const fs::path rel = fs::relative(e.path(), tmp / "a");
    EXPECT_EQ(file_bytes(e.path()), file_bytes(tmp / "b" / rel)) << rel;
    if (rel.extension() == ".safetensors") {
      EXPECT_NE(file_bytes(e.path()), file_bytes(tmp / "c" / rel)) << rel;
    } else {
      EXPECT_EQ(file_bytes(e.path()), file_bytes(tmp / "c" / rel)) << rel;
    }
    ++files;
    total += e.file_size();
  }
  EXPECT_EQ(files, 22u);
  EXPECT_LT(total, 1500000u);
}

TEST(TinyHunyuanVideo15, MakeTinyFoldersAndTheEmbeddedModelRun) {
  TempDir dir("xfuser-tiny-hv15-run");
  std::string log;
  for (const std::string arch : {"hunyuan-video15", "hunyuan-video15-i2v"}) {
    ASSERT_EQ(
        run_command(kTool + " make-tiny --arch " + arch + " --out " + (dir / arch).string(), &log),
        0)
        << log;
  }
  // t2v: --model_path alone runs the folder as HunyuanVideo-1.5.
  ASSERT_EQ(run_command(kRun + " --model_path " + (dir / "hunyuan-video15").string() +
                            " --prompt 'a red car' --height 32 --width 64 --num_frames 9"
                            " --num_inference_steps 2 --output_directory " +
                            (dir / "t2v").string(),
                        &log),
            0)
      << log;
  auto info =
      xfuser::runner::read_video_info(dir / "t2v" / "HunyuanVideo-1.5_u1r1_tc_False_32x64_0.mp4");
  EXPECT_EQ(info.frames, 9);
  EXPECT_EQ(info.height, 32);
  EXPECT_EQ(info.width, 64);

  // i2v: the picture's 48-pixel bucket sets the size.
  const fs::path picture = dir / "input.png";
  xfuser::runner::write_png(
      picture, (at::arange(32 * 48 * 3, at::kInt).view({32, 48, 3}) % 256).to(at::kByte));
  ASSERT_EQ(run_command(kRun + " --model_path " + (dir / "hunyuan-video15-i2v").string() +
                            " --prompt 'the car drives away' --input_images " + picture.string() +
                            " --num_frames 5 --num_inference_steps 2 --output_directory " +
                            (dir / "i2v").string(),
                        &log),
            0)
      << log;
  info = xfuser::runner::read_video_info(dir / "i2v" /
                                         "HunyuanVideo-1.5-I2V_u1r1_tc_False_32x48_0.mp4");
  EXPECT_EQ(info.frames, 5);
  EXPECT_EQ(info.height, 32);
  EXPECT_EQ(info.width, 48);

  // The embedded model at its defaults (32x48, 5 frames), built in a private cache.
  ASSERT_EQ(run_command("XFUSER_CACHE=" + (dir / "cache").string() + " " + kRun +
                            " --model tiny-hunyuan-video15 --prompt 'a cat' --output_directory " +
                            (dir / "tiny").string(),
                        &log),
            0)
      << log;
  info = xfuser::runner::read_video_info(dir / "tiny" /
                                         "tiny-hunyuan-video15_u1r1_tc_False_32x48_0.mp4");
  EXPECT_EQ(info.frames, 5);
  EXPECT_EQ(info.height, 32);
  EXPECT_EQ(info.width, 48);
  EXPECT_TRUE(fs::is_directory(dir / "cache" / "tiny-hunyuan-video15-v1-seed0" / "transformer"));
}

// diffusers' HunyuanVideo15Pipeline guides with its folder's guider_config.json alone; xfuser
// takes that scale as the default, and an explicit --guidance_scale over it.
TEST(TinyHunyuanVideo15, GuidanceDefaultsToTheFoldersGuider) {
  TempDir dir("xfuser-tiny-hv15-guider");
  std::string log;
  const fs::path folder = dir / "pipe";
  ASSERT_EQ(run_command(kTool + " make-tiny --arch hunyuan-video15 --out " + folder.string(), &log),
            0)
      << log;
  const fs::path guider = folder / "guider" / "guider_config.json";
  nlohmann::json g = read_json(guider);
  g["guidance_scale"] = 5.5;
  std::ofstream(guider) << g.dump(2);
  const auto run = [&](const std::string& name, const std::string& flags) {
    EXPECT_EQ(run_command(kRun + " --model_path " + folder.string() +
                              " --prompt 'a red car' --height 32 --width 48 --num_frames 5"
                              " --num_inference_steps 1 --output_directory " +
                              (dir / name).string() + flags,
                          &log),
              0)
        << log;
    return read_json(dir / name / "timings_rank0.json")["config"]["guidance_scale"].get<double>();
  };
  EXPECT_EQ(run("folder", ""), 5.5);
  EXPECT_EQ(run("flag", " --guidance_scale 3"), 3.0);
}

}  // namespace
