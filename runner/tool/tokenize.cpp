// `xfuser tokenize`: runs a tokenizer folder (CLIP vocab.json + merges.txt, or T5 spiece.model) on
// texts and prints one JSON object per text: {"input_ids": [...], "attention_mask": [...]}.
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/tokenizers/tokenizer.h"
#include "runner/run_config.h"
#include "runner/tool/commands.h"

namespace xfuser::runner::tool {
namespace {

struct TokenizeOptions {
  std::string tokenizer_dir;
  int64_t max_length = 0;
  std::vector<std::string> texts;
  std::string input_file;
};

std::vector<std::string> read_texts(const std::string& path) {
  std::ifstream in(path);
  XF_CHECK(in.good(), "--input: cannot open ", path);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    XF_THROW("--input ", path, ": not valid JSON: ", e.what());
  }
  XF_CHECK(json.is_array(), "--input ", path, " must hold a JSON array of strings");
  std::vector<std::string> texts;
  for (size_t i = 0; i < json.size(); ++i) {
    XF_CHECK(json[i].is_string(), "--input ", path, ": element ", i, " is not a string");
    texts.push_back(json[i].get<std::string>());
  }
  return texts;
}

void run_tokenize(const TokenizeOptions& options) {
  XF_CHECK(options.texts.empty() != options.input_file.empty(),
           "give the texts with either --text or --input (exactly one of them)");
  XF_CHECK(options.max_length > 0, "--max-length must be positive, got ", options.max_length);
  XF_CHECK(options.max_length <= Limits::kMaxSequenceLength, "--max-length must be at most ",
           Limits::kMaxSequenceLength, " tokens (got ", options.max_length,
           "): every text is padded to it");
  const std::vector<std::string> texts =
      options.input_file.empty() ? options.texts : read_texts(options.input_file);
  const auto tokenizer = models::tokenizers::load_tokenizer(options.tokenizer_dir);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& encoding : tokenizer->encode(texts, options.max_length)) {
    out.push_back({{"input_ids", encoding.input_ids}, {"attention_mask", encoding.attention_mask}});
  }
  std::cout << out.dump() << std::endl;
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand(
      "tokenize",
      "Tokenize texts with a tokenizer folder (CLIP, T5 or a tokenizer.json BPE) and print the ids "
      "as JSON");
  cmd->add_option("--tokenizer-dir", options->tokenizer_dir,
                  "Tokenizer folder: vocab.json + merges.txt (CLIP), spiece.model (T5) or a "
                  "byte-level BPE tokenizer.json (Llama 3, Qwen)")
      ->required();
  cmd->add_option("--max-length", options->max_length,
                  "Pad / truncate every text to this many tokens")
      ->required();
  cmd->add_option("--text", options->texts, "A text to tokenize (repeatable)");
  cmd->add_option("--input", options->input_file, "A JSON file holding an array of strings");
  cmd->callback([options] { run_tokenize(*options); });
}

}  // namespace xfuser::runner::tool
