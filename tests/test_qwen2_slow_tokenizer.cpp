// Qwen2Tokenizer folders as the slow class's save_pretrained writes them (vocab.json + merges.txt
// + tokenizer_config.json, no tokenizer.json) against transformers 4.57.1's slow Qwen2Tokenizer:
// the ids of tokens.json (hunyuan_video15-text-s1: non-ASCII, emoji, NFC, added tokens, long and
// chat texts) from a copy of the folder without its tokenizer.json, and the pipeline fixture
// folder that has no tokenizer.json against its twin that has one.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/tokenizers/bpe_tokenizer.h"
#include "models/tokenizers/tokenizer.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
namespace tk = xfuser::models::tokenizers;
using xfuser::testing::expect_error_containing;
using xfuser::testing::fixtures_dir;
using xfuser::testing::read_json;
using xfuser::testing::TempDir;

fs::path text_dir() { return fixtures_dir() / "diffusers-v0.36.0" / "hunyuan_video15-text-s1"; }

// The folder's files other than tokenizer.json, copied into dir.
void copy_slow_files(const fs::path& from, const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(from)) {
    if (entry.path().filename() == "tokenizer.json") continue;
    fs::copy_file(entry.path(), dir / entry.path().filename());
  }
  ASSERT_FALSE(fs::exists(dir / "tokenizer.json"));
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(Qwen2SlowTokenizer, IdsEqualTransformersSlowQwen2Tokenizer) {
  XF_REQUIRE_FIXTURE(text_dir() / "tokens.json");
  const nlohmann::json tokens = read_json(text_dir() / "tokens.json");
  const auto& cases = tokens["qwen2"]["cases"];
  ASSERT_GE(cases.size(), 20u);
  TempDir tmp;
  copy_slow_files(text_dir() / "tokenizer", tmp.path());
  // "": the config's tokenizer_class (Qwen2Tokenizer); the fast name falls back to the slow files.
  for (const std::string cls : {"", "Qwen2Tokenizer", "Qwen2TokenizerFast"}) {
    const auto tok = tk::load_tokenizer(tmp.path(), cls);
    EXPECT_EQ(tok->kind(), "bpe") << cls;
    EXPECT_FALSE(tok->bos_id().has_value()) << cls;
    size_t checked = 0, long_ones = 0, non_ascii = 0, with_added = 0;
    for (const auto& c : cases) {
      const auto text = c["text"].get<std::string>();
      const auto want = c["input_ids"].get<std::vector<int64_t>>();
      EXPECT_EQ(tok->encode_ids(text), want) << cls << ": " << text;
      ++checked;
      long_ones += want.size() > 200;
      non_ascii += std::any_of(text.begin(), text.end(), [](char ch) { return ch & 0x80; });
      with_added += std::any_of(want.begin(), want.end(), [](int64_t id) { return id >= 556; });
    }
    EXPECT_EQ(checked, cases.size());
    EXPECT_GE(long_ones, 4u);
    EXPECT_GE(non_ascii, 5u);
    EXPECT_GE(with_added, 2u);  // special tokens written in the text are split before BPE
  }
}

TEST(Qwen2SlowTokenizer, SameTokenizerAsTokenizerJson) {
  XF_REQUIRE_FIXTURE(text_dir() / "tokenizer" / "tokenizer.json");
  TempDir tmp;
  copy_slow_files(text_dir() / "tokenizer", tmp.path());
  const auto slow = tk::BpeTokenizer::from_qwen2_slow_dir(tmp.path(), "Qwen2Tokenizer");
  const auto fast = tk::BpeTokenizer::from_dir(text_dir() / "tokenizer", "Qwen2TokenizerFast");
  EXPECT_EQ(slow->size(), fast->size());
  EXPECT_EQ(slow->eos_id(), fast->eos_id());
  EXPECT_EQ(slow->pad_id(), fast->pad_id());
  ASSERT_TRUE(slow->pad_id().has_value());
  EXPECT_EQ(*slow->token_to_id("<|endoftext|>"), *slow->pad_id());
  EXPECT_EQ(slow->padding_left(), fast->padding_left());
  EXPECT_EQ(slow->model_max_length(), fast->model_max_length());
  const std::vector<std::string> texts = {
      "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
      "  leading and trailing spaces  \n\n\ttabs\r\n",
      "e\xCC\x81 \xC3\xA9 \xE2\x84\xAB \xEF\xAC\x81",  // NFC: e + combining acute, A-ring sign, fi
      "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD emoji",
      "<|vision_start|><|image_pad|><|vision_end|>text",
      "",
  };
  for (const auto& text : texts) {
    EXPECT_EQ(slow->tokenize(text), fast->tokenize(text)) << text;
    const auto a = slow->encode(text, 24);
    const auto b = fast->encode(text, 24);
    EXPECT_EQ(a.input_ids, b.input_ids) << text;
    EXPECT_EQ(a.attention_mask, b.attention_mask) << text;
  }
}

TEST(Qwen2SlowTokenizer, PipelineFolderWithoutTokenizerJson) {
  const fs::path pipelines = fixtures_dir() / "pipelines";
  const fs::path slow_dir = pipelines / "hunyuan_video15-i2v-tiny" / "tokenizer";
  const fs::path fast_dir = pipelines / "hunyuan_video15-tiny" / "tokenizer";
  XF_REQUIRE_FIXTURE(slow_dir / "vocab.json");
  XF_REQUIRE_FIXTURE(fast_dir / "tokenizer.json");
  for (const char* name : {"vocab.json", "merges.txt", "tokenizer_config.json"}) {
    ASSERT_EQ(read_file(slow_dir / name), read_file(fast_dir / name)) << name;
  }
  const auto slow = tk::load_tokenizer(slow_dir, "Qwen2Tokenizer");
  const auto fast = tk::load_tokenizer(fast_dir, "Qwen2Tokenizer");
  const nlohmann::json tokens = read_json(text_dir() / "tokens.json");
  size_t checked = 0;
  for (const auto& c : tokens["qwen2"]["cases"]) {
    const auto text = c["text"].get<std::string>();
    EXPECT_EQ(slow->encode_ids(text), fast->encode_ids(text)) << text;
    ++checked;
  }
  EXPECT_GE(checked, 20u);
  EXPECT_EQ(slow->size(), fast->size());
  EXPECT_EQ(slow->pad_id(), fast->pad_id());
}

TEST(Qwen2SlowTokenizer, BadFilesNameTheFile) {
  XF_REQUIRE_FIXTURE(text_dir() / "tokenizer" / "vocab.json");
  const fs::path src = text_dir() / "tokenizer";
  {
    TempDir tmp;
    copy_slow_files(src, tmp.path());
    fs::remove(tmp / "merges.txt");
    expect_error_containing([&] { tk::load_tokenizer(tmp.path(), "Qwen2Tokenizer"); },
                            {tmp.path().string(), "merges.txt"});
  }
  {
    TempDir tmp;
    copy_slow_files(src, tmp.path());
    fs::remove(tmp / "vocab.json");
    expect_error_containing([&] { tk::load_tokenizer(tmp.path(), "Qwen2Tokenizer"); },
                            {tmp.path().string(), "vocab.json"});
  }
  {
    TempDir tmp;
    copy_slow_files(src, tmp.path());
    write_file(tmp / "vocab.json", "{\"a\": 0, ");
    expect_error_containing([&] { tk::load_tokenizer(tmp.path(), "Qwen2Tokenizer"); },
                            {(tmp / "vocab.json").string()});
  }
  {
    TempDir tmp;
    copy_slow_files(src, tmp.path());
    write_file(tmp / "vocab.json", "[\"a\", \"b\"]");
    expect_error_containing([&] { tk::load_tokenizer(tmp.path(), "Qwen2Tokenizer"); },
                            {(tmp / "vocab.json").string(), "object"});
  }
  {
    TempDir tmp;
    copy_slow_files(src, tmp.path());
    write_file(tmp / "vocab.json", "{\"a\": \"zero\"}");
    expect_error_containing([&] { tk::load_tokenizer(tmp.path(), "Qwen2Tokenizer"); },
                            {(tmp / "vocab.json").string(), "'a'"});
  }
  {
    TempDir tmp;
    copy_slow_files(src, tmp.path());
    write_file(tmp / "merges.txt", "#version: 0.2\n\xC4\xA0 s\ni n x\n");
    expect_error_containing([&] { tk::load_tokenizer(tmp.path(), "Qwen2Tokenizer"); },
                            {(tmp / "merges.txt").string() + ":3", "two tokens"});
  }
  {
    TempDir tmp;
    copy_slow_files(src, tmp.path());
    write_file(tmp / "merges.txt", "#version: 0.2\nnot_a_token s\n");
    expect_error_containing([&] { tk::load_tokenizer(tmp.path(), "Qwen2Tokenizer"); },
                            {(tmp / "merges.txt").string() + ":2", "not_a_token"});
  }
  {
    // Blank lines are skipped and the merges decide: with only "Ġ s", " s" is one token and
    // "in" stays two.
    TempDir tmp;
    copy_slow_files(src, tmp.path());
    write_file(tmp / "merges.txt", "#version: 0.2\n\n\xC4\xA0 s\n  \n");
    const auto tok = tk::load_tokenizer(tmp.path(), "Qwen2Tokenizer");
    EXPECT_EQ(
        tok->text_ids(" s"),
        std::vector<int64_t>({*static_cast<tk::BpeTokenizer&>(*tok).token_to_id("\xC4\xA0s")}));
    EXPECT_EQ(tok->text_ids("in").size(), 2u);
  }
}

}  // namespace
