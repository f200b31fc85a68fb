// SentencePiece through the libxfuser_spm shim (spm_shim/spm_shim.h), loaded with dlopen so its
// embedded protobuf never meets libtorch's. Free of torch: ids are int64_t.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace xfuser::models::tokenizers {

// A loaded .model file.
class SentencePieceModel {
 public:
  // Loads a SentencePiece model file; throws xfuser::Error naming the file on failure.
  static std::unique_ptr<SentencePieceModel> load(const std::filesystem::path& model_file);
  ~SentencePieceModel();
  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;

  // Piece ids of UTF-8 text (the model's own normaliser; no special tokens added).
  std::vector<int64_t> encode(std::string_view text) const;
  int64_t piece_size() const;
  // The unknown id when the piece is absent; has_piece() tells the two apart.
  int64_t piece_to_id(std::string_view piece) const;
  bool has_piece(std::string_view piece) const;
  std::string id_to_piece(int64_t id) const;
  // -1 when the model defines none.
  int64_t unk_id() const;
  int64_t bos_id() const;
  int64_t eos_id() const;
  int64_t pad_id() const;

 private:
  explicit SentencePieceModel(void* handle) : handle_(handle) {}
  void* handle_;  // XfSpm*
};

// Trains a SentencePiece model from a corpus file (one sentence per line), writing
// <model_prefix>.model and .vocab. For tests and tiny models; single-threaded.
void train_sentencepiece(const std::filesystem::path& corpus,
                         const std::filesystem::path& model_prefix, int64_t vocab_size,
                         const std::string& model_type = "unigram",
                         const std::map<std::string, std::string>& extra_options = {});

// The shim library in use (loading it if needed). Search order: $XFUSER_SPM_SHIM, <exe dir>/../lib,
// <exe dir>, the build tree, then the dynamic loader's search path.
std::filesystem::path sentencepiece_shim_path();

}  // namespace xfuser::models::tokenizers
