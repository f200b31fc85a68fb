#include "models/weights/hub_cache.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "backends/error.h"

namespace xfuser::models {
namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

std::vector<fs::path> hub_cache_roots() {
  std::vector<fs::path> roots;
  if (auto v = env("HF_HUB_CACHE"); !v.empty()) roots.emplace_back(v);
  if (auto v = env("HUGGINGFACE_HUB_CACHE"); !v.empty()) roots.emplace_back(v);
  if (auto v = env("HF_HOME"); !v.empty()) roots.push_back(fs::path(v) / "hub");
  if (auto v = env("XDG_CACHE_HOME"); !v.empty()) roots.push_back(fs::path(v) / "huggingface/hub");
  if (auto v = env("HOME"); !v.empty()) roots.push_back(fs::path(v) / ".cache/huggingface/hub");
  return roots;
}

fs::path find_in_hub_cache(const std::string& repo_id, const std::string& revision) {
  auto slash = repo_id.find('/');
  XF_CHECK(slash != std::string::npos && slash > 0 && slash + 1 < repo_id.size() &&
               repo_id.find('/', slash + 1) == std::string::npos,
           "'", repo_id, "' is not a Hugging Face repo id of the form org/name");
  const std::string folder =
      "models--" + repo_id.substr(0, slash) + "--" + repo_id.substr(slash + 1);
  std::ostringstream looked;
  std::error_code ec;
  for (const auto& root : hub_cache_roots()) {
    const fs::path repo = root / folder;
    const fs::path snapshots = repo / "snapshots";
    looked << "\n    " << snapshots.string();
    if (!fs::is_directory(snapshots, ec)) continue;
    std::ifstream ref(repo / "refs" / revision);
    std::string commit;
    if (ref && std::getline(ref, commit) && !trim(commit).empty()) {
      // refs/<revision> names the snapshot to use: never another one in its place.
      const fs::path snap = snapshots / trim(commit);
      XF_CHECK(fs::is_directory(snap, ec), (repo / "refs" / revision).string(), " names commit ",
               trim(commit), " but its snapshot ", snap.string(),
               " is missing (an interrupted download or a cleaned cache?). Fetch it again (e.g. "
               "`huggingface-cli download ",
               repo_id, "`), or fix or remove the ref to use another snapshot");
      return snap;
    }
    fs::path newest;
    fs::file_time_type newest_time{};
    for (const auto& entry : fs::directory_iterator(snapshots, ec)) {
      if (!entry.is_directory()) continue;
      auto t = fs::last_write_time(entry.path(), ec);
      if (newest.empty() || t > newest_time) {
        newest = entry.path();
        newest_time = t;
      }
    }
    if (!newest.empty()) return newest;
  }
  XF_THROW("model '", repo_id, "' is not in the local Hugging Face cache; looked in:",
           looked.str().empty() ? std::string("\n    (no cache folder: HOME, HF_HOME unset)")
                                : looked.str(),
           "\n  xfuser never downloads weights. Fetch them on a machine with network access "
           "(e.g. `huggingface-cli download ",
           repo_id,
           "`) into one of these folders (HF_HUB_CACHE / HF_HOME select it), or pass "
           "--model_path with a diffusers pipeline folder (the one holding model_index.json).");
}

void check_pipeline_folder(const fs::path& dir) {
  std::error_code ec;
  XF_CHECK(fs::exists(dir, ec), "model folder ", dir.string(), " does not exist");
  XF_CHECK(fs::is_directory(dir, ec), "model path ", dir.string(), " is not a folder");
  XF_CHECK(fs::exists(dir / "model_index.json", ec), "model folder ", dir.string(),
           " has no model_index.json: expected a diffusers pipeline folder (model_index.json, "
           "scheduler/, text_encoder/, tokenizer/, transformer/, vae/, ...)");
}

bool saved_before_diffusers(const nlohmann::json& config, int major, int minor) {
  const auto it = config.find("_diffusers_version");
  if (!config.is_object() || it == config.end() || !it->is_string()) return false;
  int got_major = 0, got_minor = 0;
  if (std::sscanf(it->get<std::string>().c_str(), "%d.%d", &got_major, &got_minor) != 2) {
    return false;
  }
  return got_major < major || (got_major == major && got_minor < minor);
}

nlohmann::json read_model_index(const fs::path& dir) {
  const fs::path path = dir / "model_index.json";
  std::ifstream in(path, std::ios::binary);
  XF_CHECK(in.good(), "cannot read ", path.string());
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    XF_THROW("malformed ", path.string(), ": not valid JSON: ", e.what());
  }
  XF_CHECK(index.is_object(), "malformed ", path.string(), ": expected a JSON object, got ",
           index.type_name());
  // Pipeline settings registered beside the components, by the type diffusers gives them.
  static const std::map<std::string, bool> kSettings = {// key -> true: a number, false: a bool
                                                        {"boundary_ratio", true},
                                                        {"expand_timesteps", false},
                                                        {"force_zeros_for_empty_prompt", false},
                                                        {"requires_safety_checker", false},
                                                        {"is_distilled", false}};
  for (const auto& [key, value] : index.items()) {
    if (!key.empty() && key[0] == '_') continue;
    if (const auto it = kSettings.find(key); it != kSettings.end()) {
      XF_CHECK(value.is_null() || (it->second ? value.is_number() : value.is_boolean()),
               "malformed ", path.string(), ": '", key, "' is a pipeline setting and must be ",
               it->second ? "a number" : "true or false", ", got ", value.dump());
      continue;
    }
    // Other settings (of pipelines not listed above) are numbers and booleans as well.
    if (value.is_number() || value.is_boolean() || value.is_null()) continue;
    const bool pair = value.is_array() && value.size() == 2 &&
                      ((value[0].is_string() && value[1].is_string()) ||
                       (value[0].is_null() && value[1].is_null()));
    XF_CHECK(pair, "malformed ", path.string(), ": component '", key,
             "' must be a [library, class] pair of strings, got ", value.dump());
  }
  return index;
}

}  // namespace xfuser::models
