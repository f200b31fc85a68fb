// libFuzzer target: the CLIP tokenizer's folder readers on arbitrary files. The input's bytes up
// to the first NUL become vocab.json, the rest merges.txt (no NUL: the fixture's vocab.json and
// the whole input as merges.txt), beside the fixture's tokenizer_config.json and special tokens.
// Malformed files may only raise a named xfuser::Error; a folder that loads must tokenize a fixed
// text into ids of its vocabulary (vocab.json's ids and the added tokens').
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "models/tokenizers/clip_tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

namespace fs = std::filesystem;

fs::path g_dir;
std::string g_vocab;
std::set<int64_t> g_added_ids;  // the fixture's added tokens (tokenizer_config.json)

void write(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const fs::path fixture = xfuser::fuzz::require_fixture("transformers-v4.44.2/tok-clip");
  g_dir = fs::temp_directory_path() / ("xfuser-fuzz-clip-" + std::to_string(::getpid()));
  fs::create_directories(g_dir);
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    if (fs::exists(fixture / name)) {
      fs::copy_file(fixture / name, g_dir / name, fs::copy_options::overwrite_existing);
    }
  }
  std::ifstream config(fixture / "tokenizer_config.json");
  const auto json = nlohmann::json::parse(config);
  const nlohmann::json added = json.value("added_tokens_decoder", nlohmann::json::object());
  for (const auto& [id, token] : added.items()) g_added_ids.insert(std::stoll(id));
  std::ifstream in(fixture / "vocab.json", std::ios::binary);
  g_vocab.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  write(g_dir / "vocab.json", nul == std::string::npos ? g_vocab : input.substr(0, nul));
  write(g_dir / "merges.txt", nul == std::string::npos ? input : input.substr(nul + 1));
  xfuser::fuzz::expect_named_errors_only([&] {
    const auto tokenizer = xfuser::models::tokenizers::ClipTokenizer::from_dir(g_dir);
    // It loaded, so vocab.json is a JSON object of ids.
    std::set<int64_t> ids = g_added_ids;
    std::ifstream in(g_dir / "vocab.json");
    const nlohmann::json vocab = nlohmann::json::parse(in);
    for (const auto& [token, id] : vocab.items()) ids.insert(id.get<int64_t>());
    for (int64_t id : tokenizer->encode_ids("a photo of a cat, 2 dogs!")) {
      if (!ids.count(id)) std::abort();
    }
  });
  return 0;
}
