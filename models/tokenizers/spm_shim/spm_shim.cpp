// libxfuser_spm: see spm_shim.h. Linked against sentencepiece only, never against libtorch.
#include "models/tokenizers/spm_shim/spm_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <unordered_map>
#include <vector>

struct XfSpm {
  sentencepiece::SentencePieceProcessor processor;
};

namespace {

void write_error(char* err, size_t err_len, const std::string& message) {
  if (err == nullptr || err_len == 0) return;
  const size_t n = message.size() < err_len - 1 ? message.size() : err_len - 1;
  std::memcpy(err, message.data(), n);
  err[n] = '\0';
}

}  // namespace

extern "C" {

int xf_spm_abi_version(void) { return XF_SPM_ABI_VERSION; }

XfSpm* xf_spm_load(const char* path, char* err, size_t err_len) {
  try {
    auto* spm = new XfSpm();
    const auto status = spm->processor.Load(path);
    if (!status.ok()) {
      write_error(
          err, err_len,
          std::string("cannot load SentencePiece model '") + path + "': " + status.ToString());
      delete spm;
      return nullptr;
    }
    return spm;
  } catch (const std::exception& e) {
    write_error(err, err_len, std::string("cannot load SentencePiece model: ") + e.what());
    return nullptr;
  }
}

void xf_spm_free(XfSpm* spm) { delete spm; }

int xf_spm_encode(const XfSpm* spm, const char* text, size_t text_len, int32_t** ids,
                  size_t* num_ids, char* err, size_t err_len) {
  try {
    std::vector<int> out;
    const auto status = spm->processor.Encode(std::string_view(text, text_len), &out);
    if (!status.ok()) {
      write_error(err, err_len, "SentencePiece encode failed: " + status.ToString());
      return -1;
    }
    auto* buffer = static_cast<int32_t*>(std::malloc(sizeof(int32_t) * (out.size() + 1)));
    if (buffer == nullptr) {
      write_error(err, err_len, "SentencePiece encode: out of memory");
      return -1;
    }
    for (size_t i = 0; i < out.size(); ++i) buffer[i] = static_cast<int32_t>(out[i]);
    *ids = buffer;
    *num_ids = out.size();
    return 0;
  } catch (const std::exception& e) {
    write_error(err, err_len, std::string("SentencePiece encode failed: ") + e.what());
    return -1;
  }
}

void xf_spm_free_ids(int32_t* ids) { std::free(ids); }

int32_t xf_spm_piece_size(const XfSpm* spm) { return spm->processor.GetPieceSize(); }

int32_t xf_spm_piece_to_id(const XfSpm* spm, const char* piece, size_t piece_len) {
  return spm->processor.PieceToId(std::string_view(piece, piece_len));
}

int64_t xf_spm_id_to_piece(const XfSpm* spm, int32_t id, char* buf, size_t buf_len) {
  if (id < 0 || id >= spm->processor.GetPieceSize()) return -1;
  const std::string& piece = spm->processor.IdToPiece(id);
  write_error(buf, buf_len, piece);
  return static_cast<int64_t>(piece.size());
}

int32_t xf_spm_unk_id(const XfSpm* spm) { return spm->processor.unk_id(); }
int32_t xf_spm_bos_id(const XfSpm* spm) { return spm->processor.bos_id(); }
int32_t xf_spm_eos_id(const XfSpm* spm) { return spm->processor.eos_id(); }
int32_t xf_spm_pad_id(const XfSpm* spm) { return spm->processor.pad_id(); }

int xf_spm_train(const char* corpus_path, const char* model_prefix, int32_t vocab_size,
                 const char* model_type, const char* extra_options, char* err, size_t err_len) {
  try {
    std::unordered_map<std::string, std::string> kwargs = {
        {"input", corpus_path},
        {"model_prefix", model_prefix},
        {"vocab_size", std::to_string(vocab_size)},
        {"model_type", model_type},
        {"num_threads", "1"},
        {"minloglevel", "2"},
    };
    const std::string extra = extra_options ? extra_options : "";
    size_t pos = 0;
    while (pos < extra.size()) {
      size_t end = extra.find(';', pos);
      if (end == std::string::npos) end = extra.size();
      const std::string item = extra.substr(pos, end - pos);
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0) {
        write_error(err, err_len, "SentencePiece training option '" + item + "' is not key=value");
        return -1;
      }
      kwargs[item.substr(0, eq)] = item.substr(eq + 1);
      pos = end + 1;
    }
    const auto status = sentencepiece::SentencePieceTrainer::Train(kwargs);
    if (!status.ok()) {
      write_error(err, err_len, "SentencePiece training failed: " + status.ToString());
      return -1;
    }
    return 0;
  } catch (const std::exception& e) {
    write_error(err, err_len, std::string("SentencePiece training failed: ") + e.what());
    return -1;
  }
}

}  // extern "C"
