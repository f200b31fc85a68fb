#include "models/registry.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/weights/hub_cache.h"

namespace xfuser::models {

// Generated from the models/*/family.cpp files (models/CMakeLists.txt).
void register_all_families();

void check_component_classes(const ModelSpec& spec, const std::filesystem::path& pipeline_dir) {
  for (const auto& [name, classes] : spec.component_classes) {
    const std::filesystem::path file = pipeline_dir / name / "config.json";
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec)) continue;  // the loaders name what is missing
    nlohmann::json config;
    try {
      std::ifstream in(file, std::ios::binary);
      config = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      XF_THROW("malformed ", file.string(), ": not valid JSON: ", e.what());
    }
    const auto it = config.is_object() ? config.find("_class_name") : config.end();
    if (it == config.end() || !it->is_string()) continue;  // the component's reader says so
    const std::string held = it->get<std::string>();
    if (std::find(classes.begin(), classes.end(), held) != classes.end()) continue;
    std::string wanted;
    for (size_t i = 0; i < classes.size(); ++i) wanted += (i ? " or " : "") + classes[i];
    XF_THROW(file.string(), " holds a ", held, ", but ", spec.id, " needs a ", wanted, " as its ",
             name, " (is the folder another model's, or its model_index.json another pipeline's?)");
  }
}

std::string to_string(Task task) {
  switch (task) {
    case Task::kTextToImage:
      return "text-to-image";
    case Task::kImageToImage:
      return "image-to-image";
    case Task::kTextToVideo:
      return "text-to-video";
    case Task::kImageToVideo:
      return "image-to-video";
  }
  return "unknown";
}

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::vector<Family>& families() {
  static std::vector<Family> f;
  return f;
}

// The contract's models that no family registers yet: (ids and aliases, what it is).
struct Planned {
  std::vector<std::string> names;
  std::string what;
};

const std::vector<Planned>& planned_models() {
  static const std::vector<Planned> planned = {
      {{"SD3.5", "stable-diffusion-3.5-large", "stabilityai/stable-diffusion-3.5-large",
        "stabilityai/stable-diffusion-3-medium-diffusers"},
       "Stable Diffusion 3 / 3.5 (text-to-image)"},
  };
  return planned;
}

}  // namespace

void FamilyRegistry::add(Family family) {
  XF_CHECK(!family.name.empty(), "a model family needs a name");
  for (const auto& f : families()) {
    XF_CHECK(f.name != family.name, "model family '", family.name, "' is registered twice");
  }
  for (auto& spec : family.models) {
    XF_CHECK(spec.create != nullptr, "model ", spec.id, " of family ", family.name,
             " has no factory");
    spec.family = family.name;
  }
  families().push_back(std::move(family));
}

const std::vector<Family>& FamilyRegistry::all() {
  static std::once_flag once;
  std::call_once(once, [] { register_all_families(); });
  return families();
}

const Family& family_of(const ModelSpec& spec) {
  for (const auto& f : FamilyRegistry::all()) {
    if (f.name == spec.family) return f;
  }
  XF_THROW("model ", spec.id, " names family '", spec.family, "', which is not registered");
}

std::vector<TinyArch> FamilyRegistry::tiny_archs() {
  std::vector<TinyArch> out;
  for (const auto& f : all()) out.insert(out.end(), f.tiny_archs.begin(), f.tiny_archs.end());
  return out;
}

const TinyArch& FamilyRegistry::find_tiny_arch(const std::string& name) {
  for (const auto& f : all()) {
    for (const auto& arch : f.tiny_archs) {
      if (lower(arch.name) == lower(name)) return arch;
    }
  }
  std::string known;
  for (const auto& arch : tiny_archs()) known += (known.empty() ? "" : ", ") + arch.name;
  XF_THROW("--arch ", name, " is not a tiny architecture xfuser can write; known: ", known);
}

const std::vector<ModelSpec>& ModelRegistry::all() {
  static const std::vector<ModelSpec> specs = [] {
    std::vector<ModelSpec> out;
    for (const auto& f : FamilyRegistry::all()) {
      for (const auto& s : f.models) {
        for (const auto& other : out) {
          XF_CHECK(lower(other.id) != lower(s.id), "model id ", s.id, " is registered twice (",
                   other.family, ", ", s.family, ")");
        }
        out.push_back(s);
      }
    }
    return out;
  }();
  return specs;
}

const ModelSpec* ModelRegistry::find_or_null(const std::string& name) {
  const std::string key = lower(name);
  for (const auto& spec : all()) {
    if (lower(spec.id) == key) return &spec;
    for (const auto& alias : spec.aliases) {
      if (lower(alias) == key) return &spec;
    }
  }
  return nullptr;
}

const ModelSpec& ModelRegistry::find(const std::string& name) {
  if (const ModelSpec* spec = find_or_null(name)) return *spec;
  std::ostringstream known;
  for (const auto& spec : all()) {
    known << "\n    " << spec.id;
    for (const auto& alias : spec.aliases) known << ", " << alias;
  }
  for (const auto& p : planned_models()) {
    for (const auto& n : p.names) {
      if (lower(n) == lower(name)) {
        XF_THROW("model '", name, "' (", p.what,
                 ") is planned but not supported yet; the models xfuser runs:", known.str());
      }
    }
  }
  XF_THROW("unknown model '", name, "'; known models:", known.str());
}

const ModelSpec& ModelRegistry::for_pipeline_folder(const std::filesystem::path& dir) {
  const nlohmann::json index = read_model_index(dir);
  const std::string index_path = (dir / "model_index.json").string();
  XF_CHECK(index.contains("_class_name") && index["_class_name"].is_string(), index_path,
           " has no string \"_class_name\" (the diffusers pipeline class)");
  const std::string cls = index["_class_name"].get<std::string>();
  std::string known;
  for (const auto& spec : all()) {
    for (const auto& c : spec.pipeline_classes) {
      if (c == cls && (!spec.folder_match || spec.folder_match(index))) return spec;
      known += (known.empty() ? "" : ", ") + c + " (" + spec.id + ")";
    }
  }
  XF_THROW(index_path, ": pipeline class '", cls,
           "' is not one xfuser runs; pass --model, or a folder of: ", known);
}

}  // namespace xfuser::models
