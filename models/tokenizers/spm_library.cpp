#include "models/tokenizers/spm_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "backends/error.h"
#include "models/tokenizers/spm_shim/spm_shim.h"

namespace xfuser::models::tokenizers {
namespace {

constexpr const char* kShimName = "libxfuser_spm.so";
constexpr size_t kErrorLen = 1024;

// RTLD_DEEPBIND keeps sentencepiece's protobuf symbols bound to its own copy; AddressSanitizer
// refuses DEEPBIND, so sanitizer builds load with RTLD_LOCAL only.
// (gcc defines __SANITIZE_ADDRESS__, clang answers __has_feature(address_sanitizer).)
#if defined(__SANITIZE_ADDRESS__)
#define XF_SPM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define XF_SPM_ASAN 1
#endif
#endif
#if defined(XF_SPM_ASAN)
constexpr int kDlopenFlags = RTLD_NOW | RTLD_LOCAL;
#else
constexpr int kDlopenFlags = RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND;
#endif

struct ShimApi {
  std::filesystem::path path;
  void* library = nullptr;
  decltype(&xf_spm_abi_version) abi_version = nullptr;
  decltype(&xf_spm_load) load = nullptr;
  decltype(&xf_spm_free) free = nullptr;
  decltype(&xf_spm_encode) encode = nullptr;
  decltype(&xf_spm_free_ids) free_ids = nullptr;
  decltype(&xf_spm_piece_size) piece_size = nullptr;
  decltype(&xf_spm_piece_to_id) piece_to_id = nullptr;
  decltype(&xf_spm_id_to_piece) id_to_piece = nullptr;
  decltype(&xf_spm_unk_id) unk_id = nullptr;
  decltype(&xf_spm_bos_id) bos_id = nullptr;
  decltype(&xf_spm_eos_id) eos_id = nullptr;
  decltype(&xf_spm_pad_id) pad_id = nullptr;
  decltype(&xf_spm_train) train = nullptr;
};

std::vector<std::filesystem::path> candidate_paths() {
  std::vector<std::filesystem::path> paths;
  if (const char* env = std::getenv("XFUSER_SPM_SHIM"); env != nullptr && *env != '\0') {
    paths.emplace_back(env);
    return paths;  // an explicit choice is never second-guessed
  }
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    paths.push_back(exe.parent_path().parent_path() / "lib" / kShimName);
    paths.push_back(exe.parent_path() / kShimName);
  }
  // The loader's own search (RUNPATH, LD_LIBRARY_PATH, ld.so.cache): programs linking the
  // installed package get <prefix>/lib on their RUNPATH. Before the build tree's copy, so an
  // installed xfuser never depends on its build folder.
  paths.emplace_back(kShimName);
#ifdef XFUSER_SPM_SHIM_BUILD_PATH
  paths.emplace_back(XFUSER_SPM_SHIM_BUILD_PATH);
#endif
  return paths;
}

template <typename Fn>
void bind(void* library, const std::filesystem::path& path, const char* name, Fn* fn) {
  void* symbol = dlsym(library, name);
  XF_CHECK(symbol != nullptr, "SentencePiece shim ", path, " lacks symbol ", name);
  *fn = reinterpret_cast<Fn>(symbol);
}

ShimApi open_shim() {
  ShimApi api;
  std::string tried;
  for (const auto& candidate : candidate_paths()) {
    const bool by_name = !candidate.has_parent_path();  // searched by the loader
    if (!by_name && !std::filesystem::exists(candidate)) {
      tried += "\n  " + candidate.string() + " (absent)";
      continue;
    }
    api.library = dlopen(candidate.c_str(), kDlopenFlags);
    if (api.library != nullptr) {
      api.path = candidate;
      break;
    }
    const char* why = dlerror();
    tried += "\n  " + candidate.string() + ": " + (why ? why : "dlopen failed");
  }
  XF_CHECK(api.library != nullptr, "cannot load the SentencePiece shim ", kShimName,
           " (set XFUSER_SPM_SHIM to its path); tried:", tried);
  bind(api.library, api.path, "xf_spm_abi_version", &api.abi_version);
  XF_CHECK(api.abi_version() == XF_SPM_ABI_VERSION, "SentencePiece shim ", api.path,
           " has ABI version ", api.abi_version(), ", expected ", XF_SPM_ABI_VERSION);
  bind(api.library, api.path, "xf_spm_load", &api.load);
  bind(api.library, api.path, "xf_spm_free", &api.free);
  bind(api.library, api.path, "xf_spm_encode", &api.encode);
  bind(api.library, api.path, "xf_spm_free_ids", &api.free_ids);
  bind(api.library, api.path, "xf_spm_piece_size", &api.piece_size);
  bind(api.library, api.path, "xf_spm_piece_to_id", &api.piece_to_id);
  bind(api.library, api.path, "xf_spm_id_to_piece", &api.id_to_piece);
  bind(api.library, api.path, "xf_spm_unk_id", &api.unk_id);
  bind(api.library, api.path, "xf_spm_bos_id", &api.bos_id);
  bind(api.library, api.path, "xf_spm_eos_id", &api.eos_id);
  bind(api.library, api.path, "xf_spm_pad_id", &api.pad_id);
  bind(api.library, api.path, "xf_spm_train", &api.train);
  return api;
}

// Loaded once per process and never unloaded (sentencepiece keeps static state).
const ShimApi& shim() {
  static std::once_flag once;
  static ShimApi api;
  static std::string failure;
  std::call_once(once, [] {
    try {
      api = open_shim();
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  XF_CHECK(failure.empty(), failure);
  return api;
}

XfSpm* as_spm(void* handle) { return static_cast<XfSpm*>(handle); }

}  // namespace

std::unique_ptr<SentencePieceModel> SentencePieceModel::load(
    const std::filesystem::path& model_file) {
  XF_CHECK(std::filesystem::is_regular_file(model_file), "SentencePiece model ", model_file,
           " does not exist");
  const auto& api = shim();
  char err[kErrorLen] = {0};
  XfSpm* spm = api.load(model_file.c_str(), err, sizeof(err));
  XF_CHECK(spm != nullptr, err);
  return std::unique_ptr<SentencePieceModel>(new SentencePieceModel(spm));
}

SentencePieceModel::~SentencePieceModel() { shim().free(as_spm(handle_)); }

std::vector<int64_t> SentencePieceModel::encode(std::string_view text) const {
  const auto& api = shim();
  int32_t* ids = nullptr;
  size_t num_ids = 0;
  char err[kErrorLen] = {0};
  XF_CHECK(
      api.encode(as_spm(handle_), text.data(), text.size(), &ids, &num_ids, err, sizeof(err)) == 0,
      err);
  std::vector<int64_t> out(ids, ids + num_ids);
  api.free_ids(ids);
  return out;
}

int64_t SentencePieceModel::piece_size() const { return shim().piece_size(as_spm(handle_)); }

int64_t SentencePieceModel::piece_to_id(std::string_view piece) const {
  return shim().piece_to_id(as_spm(handle_), piece.data(), piece.size());
}

bool SentencePieceModel::has_piece(std::string_view piece) const {
  const int64_t id = piece_to_id(piece);
  return id != unk_id() || id_to_piece(id) == piece;
}

std::string SentencePieceModel::id_to_piece(int64_t id) const {
  const auto& api = shim();
  XF_CHECK(id >= 0 && id < piece_size(), "SentencePiece id ", id, " out of range [0, ",
           piece_size(), ")");
  std::string piece(64, '\0');
  int64_t n =
      api.id_to_piece(as_spm(handle_), static_cast<int32_t>(id), piece.data(), piece.size());
  if (n >= static_cast<int64_t>(piece.size())) {
    piece.assign(static_cast<size_t>(n) + 1, '\0');
    n = api.id_to_piece(as_spm(handle_), static_cast<int32_t>(id), piece.data(), piece.size());
  }
  piece.resize(static_cast<size_t>(n));
  return piece;
}

int64_t SentencePieceModel::unk_id() const { return shim().unk_id(as_spm(handle_)); }
int64_t SentencePieceModel::bos_id() const { return shim().bos_id(as_spm(handle_)); }
int64_t SentencePieceModel::eos_id() const { return shim().eos_id(as_spm(handle_)); }
int64_t SentencePieceModel::pad_id() const { return shim().pad_id(as_spm(handle_)); }

void train_sentencepiece(const std::filesystem::path& corpus,
                         const std::filesystem::path& model_prefix, int64_t vocab_size,
                         const std::string& model_type,
                         const std::map<std::string, std::string>& extra_options) {
  XF_CONTEXT("training a SentencePiece model from ", corpus);
  XF_CHECK(std::filesystem::is_regular_file(corpus), "corpus ", corpus, " does not exist");
  XF_CHECK(vocab_size > 0, "vocab_size must be positive, got ", vocab_size);
  std::string extra;
  for (const auto& [key, value] : extra_options) {
    XF_CHECK(key.find_first_of("=;") == std::string::npos && value.find(';') == std::string::npos,
             "SentencePiece training option ", key, "=", value, " contains '=' or ';'");
    extra += (extra.empty() ? "" : ";") + key + "=" + value;
  }
  char err[kErrorLen] = {0};
  XF_CHECK(shim().train(corpus.c_str(), model_prefix.c_str(), static_cast<int32_t>(vocab_size),
                        model_type.c_str(), extra.c_str(), err, sizeof(err)) == 0,
           err);
}

std::filesystem::path sentencepiece_shim_path() { return shim().path; }

}  // namespace xfuser::models::tokenizers
