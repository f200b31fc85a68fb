// tokenizer.json byte-level BPE tokenizers (BpeTokenizer): every text of the bpe_tokenizers
// fixtures (tokenizers 0.19.1 + transformers v4.44.2: Llama 3 under PreTrainedTokenizerFast and
// LlamaTokenizerFast, Qwen2 with NFC / left padding / [a, b] merges, a tekken-like one with
// byte_fallback and no pad token) exactly, folder detection, and the errors of malformed files.
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/tokenizers/bpe_tokenizer.h"
#include "models/tokenizers/tokenizer.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using xfuser::models::tokenizers::BpeTokenizer;
using xfuser::models::tokenizers::Encoding;
using xfuser::models::tokenizers::load_tokenizer;
using xfuser::models::tokenizers::Tokenizer;
using xfuser::testing::fixtures_dir;
using xfuser::testing::read_json;
using xfuser::testing::TempDir;
using Ids = std::vector<int64_t>;

fs::path bpe_fixture(const std::string& name) { return fixtures_dir() / "bpe_tokenizers" / name; }

void write_file(const fs::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
}

// Checks every text of a tokens.json; returns how many were checked.
int check_cases(const Tokenizer& tokenizer, const nlohmann::json& fixture) {
  const int64_t max_length = fixture["max_length"].get<int64_t>();
  int checked = 0;
  for (const auto& result : fixture["results"]) {
    const std::string text = result["text"].get<std::string>();
    SCOPED_TRACE("text: " + text);
    EXPECT_EQ(tokenizer.encode_ids(text), result["ids_untruncated"].get<Ids>());
    if (result.contains("input_ids")) {
      const Encoding encoding = tokenizer.encode(text, max_length);
      EXPECT_EQ(encoding.input_ids, result["input_ids"].get<Ids>());
      EXPECT_EQ(encoding.attention_mask, result["attention_mask"].get<Ids>());
    } else {
      // No pad token: transformers raises when padding; a text at least max_length long needs
      // none and is truncated as tokenizer(text, truncation=True, max_length=N).
      const Ids truncated = result["input_ids_truncated"].get<Ids>();
      if (static_cast<int64_t>(truncated.size()) == max_length) {
        const Encoding encoding = tokenizer.encode(text, max_length);
        EXPECT_EQ(encoding.input_ids, truncated);
        EXPECT_EQ(encoding.attention_mask, Ids(static_cast<size_t>(max_length), 1));
      } else {
        EXPECT_THROW(tokenizer.encode(text, max_length), xfuser::Error);
      }
    }
    ++checked;
  }
  return checked;
}

class BpeFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(BpeFixture, EveryTextMatchesTransformers) {
  const fs::path dir = bpe_fixture(GetParam());
  XF_REQUIRE_FIXTURE(dir / "tokens.json");
  const auto fixture = read_json(dir / "tokens.json");
  const auto tokenizer = load_tokenizer(dir);
  ASSERT_EQ(tokenizer->kind(), "bpe");
  const auto id = [](const nlohmann::json& v) {
    return v.is_null() ? std::optional<int64_t>() : std::optional<int64_t>(v.get<int64_t>());
  };
  EXPECT_EQ(tokenizer->bos_id(), id(fixture["bos_id"]));
  EXPECT_EQ(tokenizer->eos_id(), id(fixture["eos_id"]));
  EXPECT_EQ(tokenizer->pad_id(), id(fixture["pad_id"]));
  EXPECT_EQ(tokenizer->size(), fixture["len_tokenizer"].get<int64_t>());
  EXPECT_EQ(static_cast<int64_t>(tokenizer->encode_ids("").size()),
            fixture["num_special_tokens"].get<int64_t>());
  const auto& bpe = dynamic_cast<const BpeTokenizer&>(*tokenizer);
  EXPECT_EQ(bpe.padding_left(), fixture["padding_side"] == "left");
  EXPECT_EQ(check_cases(*tokenizer, fixture), 19);
}

INSTANTIATE_TEST_SUITE_P(Folders, BpeFixture,
                         ::testing::Values("bpe-llama3", "bpe-llama3-fast", "bpe-qwen2",
                                           "bpe-tekken"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (auto& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

TEST(BpeFixtureDetails, LeftPaddingPutsMaskZerosFirst) {
  const fs::path dir = bpe_fixture("bpe-qwen2");
  XF_REQUIRE_FIXTURE(dir / "tokens.json");
  const auto tokenizer = load_tokenizer(dir);
  const Encoding e = tokenizer->encode("a cat", 8);
  ASSERT_EQ(e.attention_mask.size(), 8u);
  EXPECT_EQ(e.attention_mask.front(), 0);
  EXPECT_EQ(e.attention_mask.back(), 1);
  EXPECT_EQ(e.input_ids.front(), *tokenizer->pad_id());
}

TEST(BpeFixtureDetails, QwenFolderWithVocabAndMergesIsChosenByClass) {
  const fs::path dir = bpe_fixture("bpe-qwen2");
  XF_REQUIRE_FIXTURE(dir / "tokens.json");
  ASSERT_TRUE(fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt"));
  EXPECT_EQ(load_tokenizer(dir)->kind(), "bpe");
  // The class named by the caller (diffusers' model_index.json) wins over the config's.
  EXPECT_THROW(load_tokenizer(dir, "BertTokenizerFast"), xfuser::Error);
}

TEST(BpeFixtureDetails, TheClassOverrideChangesThePostProcessorAndPaddingSide) {
  const fs::path dir = bpe_fixture("bpe-llama3");
  XF_REQUIRE_FIXTURE(dir / "tokens.json");
  const auto plain = load_tokenizer(dir);
  const auto llama = load_tokenizer(dir, "LlamaTokenizerFast");
  const auto& bpe = dynamic_cast<const BpeTokenizer&>(*llama);
  EXPECT_TRUE(bpe.padding_left());
  EXPECT_EQ(plain->encode_ids("a cat"), llama->encode_ids("a cat"));  // bos $A either way
  EXPECT_EQ(llama->size(), plain->size() + 1);                        // <unk> added
}

// transformers' split_special_tokens=True (the backend's encode_special_tokens): special tokens in
// the text are tokenized as text. Ids printed by transformers 4.44.2 on this folder.
TEST(BpeFixtureDetails, SplitSpecialTokensFromTheConfig) {
  const fs::path src = bpe_fixture("bpe-llama3");
  XF_REQUIRE_FIXTURE(src / "tokens.json");
  const std::string text = "a<|eot_id|>b<|begin_of_text|>";
  EXPECT_EQ(load_tokenizer(src)->encode_ids(text), Ids({606, 64, 610, 65, 606}));
  TempDir dir("xfuser-bpe");
  fs::copy(src / "tokenizer.json", dir / "tokenizer.json");
  fs::copy(src / "special_tokens_map.json", dir / "special_tokens_map.json");
  auto config = read_json(src / "tokenizer_config.json");
  config["split_special_tokens"] = true;
  write_file(dir / "tokenizer_config.json", config.dump());
  EXPECT_EQ(load_tokenizer(dir.path())->encode_ids(text),
            Ids({606, 64, 27, 91,  68, 324, 62, 306, 91, 29, 65, 27, 91,
                 65,  68, 70, 256, 62, 362, 62, 454, 87, 83, 91, 29}));
}

TEST(BpeFixtureDetails, TokensNameTheirIds) {
  const fs::path dir = bpe_fixture("bpe-qwen2");
  XF_REQUIRE_FIXTURE(dir / "tokens.json");
  const auto tokenizer = BpeTokenizer::from_dir(dir);
  const std::string text = "<|im_start|>user\nDON'T \xe6\x97\xa5 cat<|im_end|>";
  const auto tokens = tokenizer->tokenize(text);
  const Ids ids = tokenizer->text_ids(text);
  ASSERT_EQ(tokens.size(), ids.size());
  EXPECT_EQ(tokens.front(), "<|im_start|>");
  EXPECT_EQ(tokens.back(), "<|im_end|>");
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(tokenizer->token_to_id(tokens[i]), ids[i]);
}

TEST(BpeFixtureDetails, ThreadsShareOneTokenizer) {
  const fs::path dir = bpe_fixture("bpe-llama3");
  XF_REQUIRE_FIXTURE(dir / "tokens.json");
  const auto fixture = read_json(dir / "tokens.json");
  const auto tokenizer = load_tokenizer(dir);
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (const auto& result : fixture["results"]) {
          if (tokenizer->encode_ids(result["text"].get<std::string>()) !=
              result["ids_untruncated"].get<Ids>()) {
            ++failures[t];
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
}

TEST(BpeFixtureDetails, NoPadTokenErrorNamesTheFolder) {
  const fs::path dir = bpe_fixture("bpe-tekken");
  XF_REQUIRE_FIXTURE(dir / "tokens.json");
  const auto tokenizer = load_tokenizer(dir);
  try {
    tokenizer->encode("a", 24);
    FAIL() << "padding without a pad token must throw";
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no pad token"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir.string()), std::string::npos) << e.what();
  }
}

// ---- malformed tokenizer.json -------------------------------------------------------------------

// A minimal valid byte-level tokenizer.json to break one field at a time.
nlohmann::json minimal_json() {
  return nlohmann::json::parse(R"({
    "version": "1.0", "added_tokens": [], "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3},
              "merges": ["a b"]}})");
}

std::string load_error(const nlohmann::json& json) {
  TempDir dir("xfuser-bpe");
  write_file(dir / "tokenizer.json", json.dump());
  try {
    load_tokenizer(dir.path());
  } catch (const xfuser::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find((dir / "tokenizer.json").string()), std::string::npos) << what;
    return what;
  }
  ADD_FAILURE() << "no error for " << json.dump();
  return "";
}

TEST(BpeErrors, MinimalFileLoadsAndMerges) {
  TempDir dir("xfuser-bpe");
  write_file(dir / "tokenizer.json", minimal_json().dump());
  const auto tokenizer = load_tokenizer(dir.path());
  EXPECT_EQ(tokenizer->kind(), "bpe");
  EXPECT_EQ(tokenizer->encode_ids("ab ab a"), Ids({2, 3, 2, 3, 0}));
  EXPECT_FALSE(tokenizer->pad_id().has_value());
}

TEST(BpeErrors, MergesAsPairsEqualStrings) {
  auto json = minimal_json();
  json["model"]["merges"] = nlohmann::json::array({nlohmann::json::array({"a", "b"})});
  TempDir dir("xfuser-bpe");
  write_file(dir / "tokenizer.json", json.dump());
  EXPECT_EQ(load_tokenizer(dir.path())->encode_ids("ab"), Ids({2}));
}

TEST(BpeErrors, MissingModel) {
  auto json = minimal_json();
  json.erase("model");
  EXPECT_NE(load_error(json).find("model"), std::string::npos);
}

TEST(BpeErrors, UnsupportedPreTokenizer) {
  auto json = minimal_json();
  json["pre_tokenizer"] = {{"type", "Sequence"},
                           {"pretokenizers", {{{"type", "BertPreTokenizer"}}}}};
  const std::string what = load_error(json);
  EXPECT_NE(what.find("BertPreTokenizer"), std::string::npos) << what;
  EXPECT_NE(what.find("pre_tokenizer.pretokenizers[0].type"), std::string::npos) << what;
}

TEST(BpeErrors, UnsupportedNormalizerModelAndProcessor) {
  auto json = minimal_json();
  json["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_NE(load_error(json).find("normalizer.type"), std::string::npos);
  json = minimal_json();
  json["model"]["type"] = "WordPiece";
  EXPECT_NE(load_error(json).find("WordPiece"), std::string::npos);
  json = minimal_json();
  json["post_processor"] = {{"type", "Weird"}};
  EXPECT_NE(load_error(json).find("post_processor.type"), std::string::npos);
}

TEST(BpeErrors, BadMergesAndRegex) {
  auto json = minimal_json();
  json["model"]["merges"] = {"a c"};
  EXPECT_NE(load_error(json).find("model.merges[0]"), std::string::npos);
  json["model"]["merges"] = {"a b c"};
  EXPECT_NE(load_error(json).find("model.merges[0]"), std::string::npos);
  json = minimal_json();
  json["pre_tokenizer"] = {{"type", "Split"},
                           {"pattern", {{"Regex", "(unclosed"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}};
  EXPECT_NE(load_error(json).find("pre_tokenizer.pattern"), std::string::npos);
  TempDir dir("xfuser-bpe");
  write_file(dir / "tokenizer.json", "{not json");
  EXPECT_THROW(load_tokenizer(dir.path()), xfuser::Error);
}

// transformers 5 saves CLIP and T5 tokenizers as tokenizer.json alone, and its classes rebuild
// the pipeline around the file's vocabulary: CLIP lower-cases and wraps in bos / eos, T5 needs a
// Unigram model. Without tokenizer.json the slow files are required and named.
TEST(BpeErrors, ClipAndT5ClassesReadTokenizerJsonAsTransformers5Does) {
  TempDir dir("xfuser-bpe");
  auto json = minimal_json();
  json["model"]["vocab"] = {{"a</w>", 0}, {"b</w>", 1},           {"ab</w>", 2},
                            {"a", 3},     {"<|startoftext|>", 4}, {"<|endoftext|>", 5}};
  json["model"]["merges"] = {"a b</w>"};
  write_file(dir / "tokenizer.json", json.dump());
  write_file(dir / "vocab.json", "{}");
  write_file(dir / "tokenizer_config.json", R"({"tokenizer_class": "CLIPTokenizer"})");
  const auto clip = load_tokenizer(dir.path());
  EXPECT_EQ(clip->kind(), "bpe");
  EXPECT_EQ(clip->encode_ids("AB  a"), Ids({4, 2, 0, 5}));  // lower case, </w>, bos ... eos
  write_file(dir / "tokenizer_config.json", R"({"tokenizer_class": "T5TokenizerFast"})");
  try {
    load_tokenizer(dir.path());
    FAIL();
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("T5Tokenizer needs a Unigram model"), std::string::npos)
        << e.what();
  }
  fs::remove(dir / "tokenizer.json");
  write_file(dir / "tokenizer_config.json", R"({"tokenizer_class": "CLIPTokenizer"})");
  try {
    load_tokenizer(dir.path());
    FAIL();
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("merges.txt is missing"), std::string::npos) << e.what();
  }
  write_file(dir / "tokenizer.json", minimal_json().dump());
  write_file(dir / "tokenizer_config.json", R"({"tokenizer_class": "TokenizersBackend"})");
  EXPECT_EQ(load_tokenizer(dir.path())->encode_ids("ab ab a"), Ids({2, 3, 2, 3, 0}));
  fs::remove(dir / "tokenizer_config.json");  // no class: vocab.json alone is not CLIP's
  EXPECT_EQ(load_tokenizer(dir.path())->kind(), "bpe");
}

// ---- Unigram (SentencePiece's model in tokenizer.json) ---------------------------------------

nlohmann::json unigram_json(const std::string& prepend = "always") {
  auto json = nlohmann::json::parse(R"({
    "version": "1.0", "added_tokens": [], "normalizer": null, "post_processor": null,
    "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": false,
              "vocab": [["<unk>", 0.0], ["\u2581", -2.0], ["\u2581ab", -1.0], ["a", -3.0],
                        ["b", -3.0], ["ab", -2.5], ["\u2581a", -1.5], ["c", -4.0],
                        ["<0x78>", -5.0]]}})");
  json["pre_tokenizer"] = {{"type", "Metaspace"},
                           {"replacement", "\u2581"},
                           {"prepend_scheme", prepend},
                           {"split", true}};
  return json;
}

std::unique_ptr<Tokenizer> load_json(const nlohmann::json& json) {
  TempDir dir("xfuser-unigram");
  write_file(dir / "tokenizer.json", json.dump());
  return load_tokenizer(dir.path());
}

TEST(Unigram, TheBestScoringSegmentationWins) {
  const auto tokenizer = load_json(unigram_json());
  EXPECT_EQ(tokenizer->encode_ids("ab"), Ids({2}));      // ▁ab (-1) over ▁a b, ▁ ab
  EXPECT_EQ(tokenizer->encode_ids("abc"), Ids({2, 7}));  // ▁ab c
  EXPECT_EQ(tokenizer->encode_ids("ba"), Ids({1, 4, 3}));
  // Each space becomes ▁ and the text splits before every ▁ (Metaspace, split = true).
  EXPECT_EQ(tokenizer->encode_ids("a  b"), Ids({6, 1, 1, 4}));
  EXPECT_EQ(tokenizer->encode_ids(""), Ids({}));
}

TEST(Unigram, UnknownCharactersFuseIntoOneUnk) {
  const auto tokenizer = load_json(unigram_json());
  EXPECT_EQ(tokenizer->encode_ids("xyz"), Ids({1, 0}));      // ▁ then one unk for "xyz"
  EXPECT_EQ(tokenizer->encode_ids("axyc"), Ids({6, 0, 7}));  // ▁a, unk "xy", c
}

TEST(Unigram, ByteFallbackBeforeUnk) {
  auto json = unigram_json();
  json["model"]["byte_fallback"] = true;
  const auto tokenizer = load_json(json);
  EXPECT_EQ(tokenizer->encode_ids("x"), Ids({1, 8}));  // the fused unknown "x" as <0x78>
  EXPECT_EQ(tokenizer->encode_ids("y"), Ids({1, 0}));  // no <0x79>: unk
}

TEST(Unigram, WhitespaceSplitAndPrependSchemes) {
  auto json = unigram_json();
  json["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", {{{"type", "WhitespaceSplit"}}, unigram_json()["pre_tokenizer"]}}};
  EXPECT_EQ(load_json(json)->encode_ids("a \t b"), Ids({6, 1, 4}));
  // An added token in the text: "first" prepends only at the start of the input.
  for (const std::string scheme : {"always", "first", "never"}) {
    SCOPED_TRACE(scheme);
    auto with_added = unigram_json(scheme);
    with_added["added_tokens"] = {{{"id", 9}, {"content", "<x>"}, {"special", true}}};
    const auto tokenizer = load_json(with_added);
    const Ids ids = tokenizer->encode_ids("a<x>a");
    if (scheme == "always") EXPECT_EQ(ids, Ids({6, 9, 6}));
    if (scheme == "first") EXPECT_EQ(ids, Ids({6, 9, 3}));
    if (scheme == "never") EXPECT_EQ(ids, Ids({3, 9, 3}));
    EXPECT_EQ(tokenizer->encode_ids("<x>a"), scheme == "always" ? Ids({9, 6}) : Ids({9, 3}));
  }
}

TEST(Unigram, ErrorsNameTheFileAndKey) {
  auto json = unigram_json();
  json["model"]["vocab"] = nlohmann::json::array({nlohmann::json::array({"a", "high"})});
  EXPECT_NE(load_error(json).find("model.vocab[0]"), std::string::npos);
  json = unigram_json();
  json["model"]["unk_id"] = 99;
  EXPECT_NE(load_error(json).find("model.unk_id"), std::string::npos);
  json = unigram_json();
  json["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  EXPECT_NE(load_error(json).find("pre_tokenizer.prepend_scheme"), std::string::npos);
  json = unigram_json();
  json["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "@@@@"}};
  EXPECT_NE(load_error(json).find("normalizer.precompiled_charsmap"), std::string::npos);
  json["normalizer"]["precompiled_charsmap"] = "AQAAAA==";  // a trie size past the end
  EXPECT_NE(load_error(json).find("normalizer.precompiled_charsmap"), std::string::npos);
  // No unk_id: a character no piece covers is an error naming the file, not a crash.
  json = unigram_json();
  json["model"]["unk_id"] = nullptr;
  TempDir dir("xfuser-unigram");
  write_file(dir / "tokenizer.json", json.dump());
  const auto tokenizer = load_tokenizer(dir.path());
  EXPECT_EQ(tokenizer->encode_ids("ab"), Ids({2}));
  try {
    tokenizer->encode_ids("q");
    FAIL();
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no unk_id"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
}

TEST(BpeErrors, UnsupportedClassIsNamed) {
  TempDir dir("xfuser-bpe");
  write_file(dir / "tokenizer.json", minimal_json().dump());
  write_file(dir / "tokenizer_config.json", R"({"tokenizer_class": "BertTokenizer"})");
  try {
    load_tokenizer(dir.path());
    FAIL();
  } catch (const xfuser::Error& e) {
    EXPECT_NE(std::string(e.what()).find("BertTokenizer"), std::string::npos) << e.what();
  }
}

// Split behaviors and invert on a literal pattern, against the library's definitions.
TEST(BpeSplit, BehaviorsOnALiteral) {
  // tokenizers 0.19.1: Split("-", behavior, invert).pre_tokenize_str("a-b--c").
  struct Case {
    std::string behavior;
    bool invert;
    std::vector<std::string> pieces;
  };
  const std::vector<Case> cases = {
      {"Removed", false, {"a", "b", "c"}},
      {"Isolated", false, {"a", "-", "b", "-", "-", "c"}},
      {"MergedWithPrevious", false, {"a-", "b-", "-", "c"}},
      {"MergedWithNext", false, {"a", "-b", "-", "-c"}},
      {"Contiguous", false, {"a", "-", "b", "--", "c"}},
      {"Removed", true, {"-", "-", "-"}},
      {"MergedWithPrevious", true, {"a", "-b", "-", "-c"}},
      {"MergedWithNext", true, {"a-", "b-", "-", "c"}},
  };
  for (const auto& [behavior, invert, pieces] : cases) {
    SCOPED_TRACE(behavior + (invert ? " inverted" : ""));
    auto json = minimal_json();
    nlohmann::json vocab = nlohmann::json::object();
    for (const auto& piece : pieces) {
      if (!vocab.contains(piece)) vocab[piece] = vocab.size();
    }
    json["model"] = {{"type", "BPE"},
                     {"vocab", vocab},
                     {"merges", nlohmann::json::array()},
                     {"ignore_merges", true}};
    json["pre_tokenizer"] = {{"type", "Split"},
                             {"pattern", {{"String", "-"}}},
                             {"behavior", behavior},
                             {"invert", invert}};
    TempDir dir("xfuser-bpe");
    write_file(dir / "tokenizer.json", json.dump());
    const auto tokenizer = load_tokenizer(dir.path());
    Ids expected;
    for (const auto& piece : pieces) expected.push_back(vocab[piece].get<int64_t>());
    EXPECT_EQ(tokenizer->encode_ids("a-b--c"), expected);
  }
}

}  // namespace

namespace {

// The expected ids were printed by tokenizers 0.19.1 (Tokenizer.from_str on the same JSON).
class BpeModelOptions : public ::testing::Test {
 protected:
  static nlohmann::json base() {
    return nlohmann::json::parse(R"({
      "version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null,
      "post_processor": null, "decoder": null,
      "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
                "byte_fallback": false,
                "vocab": {"a": 0, "b": 1, "ab": 2, "<unk>": 3, "<0x78>": 4, "c": 5, "##c": 6,
                          "c</w>": 7, "##c</w>": 8, "ac</w>": 9},
                "merges": ["a b"]}})");
  }
  static std::vector<Ids> run(const nlohmann::json& json) {
    TempDir dir("xfuser-bpe");
    write_file(dir / "tokenizer.json", json.dump());
    const auto tokenizer = load_tokenizer(dir.path());
    std::vector<Ids> out;
    for (const char* text : {"axyzab", "xxa", "zzz", "cc", "acc", "c"}) {
      out.push_back(tokenizer->encode_ids(text));
    }
    return out;
  }
};

TEST_F(BpeModelOptions, UnknownCharactersBecomeUnk) {
  EXPECT_EQ(run(base()),
            (std::vector<Ids>{{0, 3, 3, 3, 2}, {3, 3, 0}, {3, 3, 3}, {5, 5}, {0, 5, 5}, {5}}));
}

TEST_F(BpeModelOptions, FuseUnk) {
  auto json = base();
  json["model"]["fuse_unk"] = true;
  EXPECT_EQ(run(json), (std::vector<Ids>{{0, 3, 2}, {3, 0}, {3}, {5, 5}, {0, 5, 5}, {5}}));
}

TEST_F(BpeModelOptions, ByteFallbackBeforeUnk) {
  auto json = base();
  json["model"]["fuse_unk"] = true;
  json["model"]["byte_fallback"] = true;
  EXPECT_EQ(run(json), (std::vector<Ids>{{0, 4, 3, 2}, {4, 4, 0}, {3}, {5, 5}, {0, 5, 5}, {5}}));
}

TEST_F(BpeModelOptions, ContinuingSubwordPrefix) {
  auto json = base();
  json["model"]["continuing_subword_prefix"] = "##";
  json["model"]["merges"] = {"a ##c"};
  json["model"]["vocab"]["a##c"] = 10;
  json["model"]["vocab"]["ac"] = 11;
  EXPECT_EQ(run(json),
            (std::vector<Ids>{{0, 3, 3, 3, 3, 3}, {3, 3, 3}, {3, 3, 3}, {5, 6}, {11, 6}, {5}}));
}

TEST_F(BpeModelOptions, EndOfWordSuffix) {
  auto json = base();
  json["model"]["end_of_word_suffix"] = "</w>";
  json["model"]["merges"] = {"a c</w>"};
  EXPECT_EQ(run(json),
            (std::vector<Ids>{{0, 3, 3, 3, 0, 3}, {3, 3, 3}, {3, 3, 3}, {5, 7}, {0, 5, 7}, {7}}));
}

TEST_F(BpeModelOptions, WithoutUnkUnknownCharactersAreDropped) {
  auto json = base();
  json["model"]["unk_token"] = nullptr;
  TempDir dir("xfuser-bpe");
  write_file(dir / "tokenizer.json", json.dump());
  EXPECT_EQ(load_tokenizer(dir.path())->encode_ids("axyzab"), Ids({0, 2}));
}

}  // namespace
