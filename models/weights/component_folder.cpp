#include "models/weights/component_folder.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "backends/error.h"
#include "models/weights/checkpoint.h"

namespace xfuser::models {
namespace fs = std::filesystem;

namespace detail {

void throw_config_type_error(const nlohmann::json& value, const std::string& key,
                             const std::string& expected, const std::string& file) {
  std::string shown = value.dump();
  if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
  XF_THROW(file, ": config key '", key, "' must be ", expected, ", got ", value.type_name(), " ",
           shown);
}

void throw_config_missing(const std::string& key, const std::string& file) {
  XF_THROW(file, ": required config key '", key, "' is missing");
}

namespace {

// The kinds of size a config key names, by its name (array elements by their array's name), and
// their ranges: far above every released model (FLUX.2's 48 + 8 blocks, 48 heads, widths of
// 6144; Mistral's 131072 positions; vocabularies of 262144), far below what would exhaust memory
// while the model is described.
struct SizeKind {
  const char* what;
  int64_t low, high;
};

std::string base_key(const std::string& key) {
  const size_t bracket = key.find('[');
  std::string k = bracket == std::string::npos ? key : key.substr(0, bracket);
  for (auto& c : k) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return k;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

const SizeKind* size_kind(const std::string& key) {
  static const SizeKind kLayers{"a layer or block count", 0, 1024};
  static const SizeKind kHeads{"a head count", 1, 4096};
  static const SizeKind kVocab{"a vocabulary size", 1, int64_t{1} << 24};
  static const SizeKind kPositions{"a position or sequence length", 1, int64_t{1} << 24};
  static const SizeKind kWidth{"a width, channel count or size", 0, int64_t{1} << 20};
  const std::string k = base_key(key);
  if (k.find("vocab") != std::string::npos) return &kVocab;
  if (k.find("position") != std::string::npos || k.find("max_seq") != std::string::npos ||
      k.find("seq_len") != std::string::npos) {
    return &kPositions;
  }
  if (k.find("layers") != std::string::npos || ends_with(k, "_blocks") || k == "depth") {
    return &kLayers;
  }
  if (ends_with(k, "heads")) return &kHeads;
  if (k.find("dim") != std::string::npos || k.find("channels") != std::string::npos ||
      ends_with(k, "_size") || k == "d_model" || k == "d_ff" || k == "d_kv") {
    return &kWidth;
  }
  return nullptr;
}

thread_local std::map<std::string, std::set<std::string>> g_defaults;

}  // namespace

void check_config_size(const std::string& key, int64_t value, const std::string& file) {
  const SizeKind* kind = size_kind(key);
  if (kind == nullptr) return;
  XF_CHECK(value >= kind->low && value <= kind->high, file, ": config key '", key, "' = ", value,
           " is out of range for ", kind->what, " (", kind->low, " to ", kind->high,
           "): the config is corrupt or not this model's");
}

void note_config_default(const std::string& file, const std::string& key,
                         const std::string& value) {
  g_defaults[file].insert(key + " = " + value);
}

}  // namespace detail

std::string config_defaults_note(const std::string& weights) {
  for (const auto& [file, keys] : detail::g_defaults) {
    const std::string dir = fs::path(file).parent_path().string() + "/";
    if (keys.empty() || weights.compare(0, dir.size(), dir) != 0) continue;
    std::string list;
    for (const auto& k : keys) list += (list.empty() ? "" : ", ") + k;
    return file + " lacks keys that were read as diffusers' / transformers' defaults (" + list +
           "): a missing key that sets a shape gives mismatches like these";
  }
  return "";
}

namespace detail {}  // namespace detail

ComponentFolder open_component_folder(const std::string& dir, const std::string& variant) {
  ComponentFolder folder = open_component_config(dir);
  XF_CONTEXT("opening component folder ", dir);
  folder.weights = open_checkpoint(dir, variant);
  return folder;
}

bool has_weight_files(const std::string& dir, const std::string& variant) {
  for (const auto& name : checkpoint_file_names(variant)) {
    if (fs::exists(fs::path(dir) / name)) return true;
  }
  return false;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> component_tensor_shapes(
    const std::string& dir,
    const std::function<std::shared_ptr<Module>(const ComponentFolder&)>& build) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  if (has_weight_files(dir)) {
    const ComponentFolder folder = open_component_folder(dir);
    for (const auto& name : folder.weights->names()) {
      out.emplace_back(name, folder.weights->info(name).shape);
    }
    return out;
  }
  const ComponentFolder folder = open_component_config(dir);
  XF_CONTEXT("the parameter shapes of ", folder.class_name, " from ", folder.config_path,
             " (the folder has no weights)");
  std::shared_ptr<Module> module =
      build ? build(folder)
            : ComponentRegistry::create(folder.class_name, folder.config, folder.config_path);
  for (const auto& [name, slot] : module->named_parameters()) {
    out.emplace_back(name, slot->stored_shape());
  }
  return out;
}

ComponentFolder open_component_config(const std::string& dir) {
  XF_CONTEXT("opening component folder ", dir);
  ComponentFolder folder;
  folder.dir = dir;
  folder.config_path = (fs::path(dir) / "config.json").string();
  XF_CHECK(fs::is_directory(dir), "component folder not found: ", dir);
  XF_CHECK(fs::is_regular_file(folder.config_path), "missing ", folder.config_path,
           " (a component folder needs its config.json)");
  std::ifstream in(folder.config_path, std::ios::binary);
  XF_CHECK(in.good(), "cannot read ", folder.config_path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    folder.config = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    XF_THROW(folder.config_path, ": not valid JSON: ", e.what());
  }
  XF_CHECK(folder.config.is_object(), folder.config_path, ": config must be a JSON object, got ",
           folder.config.type_name());

  const auto& config = folder.config;
  if (auto it = config.find("_class_name"); it != config.end()) {
    XF_CHECK(it->is_string(), folder.config_path, ": \"_class_name\" must be a string, got ",
             it->dump());
    folder.class_name = it->get<std::string>();
  } else if (auto arch = config.find("architectures"); arch != config.end()) {
    XF_CHECK(arch->is_array() && !arch->empty() && (*arch)[0].is_string(), folder.config_path,
             ": \"architectures\" must be a non-empty array of strings, got ", arch->dump());
    folder.class_name = (*arch)[0].get<std::string>();
  } else {
    XF_THROW(folder.config_path,
             ": no class name (neither diffusers' \"_class_name\" nor transformers' "
             "\"architectures\")");
  }
  // Quantized checkpoints: one layout is understood (module.h, Module::load): Linear weights in
  // float8_e4m3fn with float32 per-row scales `weight_scale` (Black Forest Labs' fp8r, as
  // diffusers' BFLQuantizationConfig reads it). Any other method changes the math in a way xfuser
  // would not reproduce: refused by name.
  if (auto q = config.find("quantization_config"); q != config.end() && !q->is_null()) {
    const std::string method =
        q->is_object() && q->contains("quant_method") && (*q)["quant_method"].is_string()
            ? (*q)["quant_method"].get<std::string>()
            : q->dump();
    XF_CHECK(method == "bfl", folder.config_path, ": quantization_config.quant_method '", method,
             "' is not supported; xfuser reads fp8 checkpoints with per-row weight_scale tensors "
             "('bfl', fp8r) and quantizes at load with --use_fp8_gemms / --fp8_storage");
  }
  return folder;
}

std::shared_ptr<Component> load_component(const std::string& dir, c10::ScalarType dtype,
                                          const std::string& variant) {
  return load_component(dir, dtype, c10::Device(c10::kCPU), variant);
}

std::shared_ptr<Component> load_component(const std::string& dir, c10::ScalarType dtype,
                                          c10::Device device, const std::string& variant) {
  LoadOptions options;
  options.device = device;
  return load_component(dir, dtype, options, variant);
}

std::shared_ptr<Component> load_component(const std::string& dir, c10::ScalarType dtype,
                                          const LoadOptions& options, const std::string& variant) {
  ComponentFolder folder = open_component_folder(dir, variant);
  XF_CONTEXT("loading ", folder.class_name, " from ", dir);
  auto component = ComponentRegistry::create(folder.class_name, folder.config, folder.config_path);
  component->load(*folder.weights, dtype, "", options);
  return component;
}

}  // namespace xfuser::models
