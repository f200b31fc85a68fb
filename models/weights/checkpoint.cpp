#include "models/weights/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "backends/error.h"

namespace xfuser::models {
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "a.b.c" + "fp16" -> "a.b.fp16.c" (diffusers' and transformers' _add_variant).
std::string add_variant(const std::string& name, const std::string& variant) {
  if (variant.empty()) return name;
  const auto dot = name.rfind('.');
  return name.substr(0, dot) + "." + variant + name.substr(dot);
}

}  // namespace

ShardedCheckpoint::ShardedCheckpoint(const std::string& index_path) : index_path_(index_path) {
  XF_CONTEXT("opening sharded checkpoint ", index_path);
  std::ifstream in(index_path, std::ios::binary);
  XF_CHECK(in.good() && !fs::is_directory(index_path), "cannot read checkpoint index ", index_path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(buffer.str());
  } catch (const nlohmann::json::exception& e) {
    XF_THROW(index_path, ": not valid JSON: ", e.what());
  }
  XF_CHECK(index.is_object(), index_path, ": a checkpoint index must be a JSON object, got ",
           index.type_name());
  auto weight_map = index.find("weight_map");
  XF_CHECK(weight_map != index.end() && weight_map->is_object(), index_path,
           ": \"weight_map\" is missing or not an object");

  // Shard file -> the tensors the index places in it.
  std::map<std::string, std::vector<std::string>> by_shard;
  for (auto& [name, shard] : weight_map->items()) {
    XF_CHECK(shard.is_string(), index_path, ": weight_map entry for tensor '", name,
             "' must be a file name, got ", shard.dump());
    by_shard[shard.get<std::string>()].push_back(name);
  }

  const fs::path folder = fs::path(index_path).parent_path();
  std::vector<std::string> absent;
  for (const auto& [shard_name, tensor_names] : by_shard) {
    const fs::path shard_path = folder / shard_name;
    XF_CHECK(fs::is_regular_file(shard_path), index_path, ": shard '", shard_name, "' (listed for ",
             tensor_names.size(), " tensors, e.g. '", tensor_names.front(), "') not found at ",
             shard_path.string());
    auto shard = std::make_shared<SafetensorsFile>(shard_path.string());
    for (const auto& name : tensor_names) {
      if (shard->contains(name)) {
        by_name_[name] = shard.get();
      } else {
        absent.push_back("'" + name + "' (in " + shard_name + ")");
      }
    }
    shards_.push_back(std::move(shard));
  }
  if (!absent.empty()) {
    std::ostringstream os;
    const size_t shown = std::min<size_t>(absent.size(), 10);
    for (size_t i = 0; i < shown; ++i) os << (i ? ", " : "") << absent[i];
    if (absent.size() > shown) os << " and " << absent.size() - shown << " more";
    XF_THROW(index_path, ": ", absent.size(),
             " tensors listed in weight_map are absent from their shard: ", os.str());
  }
}

std::vector<std::string> ShardedCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, shard] : by_name_) out.push_back(name);
  return out;
}

const SafetensorsFile& ShardedCheckpoint::shard_of(const std::string& name) const {
  auto it = by_name_.find(name);
  XF_CHECK(it != by_name_.end(), "tensor '", name, "' not found in ", index_path_);
  return *it->second;
}

TensorInfo ShardedCheckpoint::info(const std::string& name) const {
  return shard_of(name).info(name);
}

at::Tensor ShardedCheckpoint::get(const std::string& name) const {
  return shard_of(name).get(name);
}

void ShardedCheckpoint::release(const std::string& name) const { shard_of(name).release(name); }

at::Tensor ShardedCheckpoint::get_slice(const std::string& name, int64_t dim, int64_t start,
                                        int64_t length) const {
  return shard_of(name).get_slice(name, dim, start, length);
}

std::vector<std::string> checkpoint_file_names(const std::string& variant) {
  return {add_variant("diffusion_pytorch_model.safetensors", variant),
          add_variant("diffusion_pytorch_model.safetensors.index.json", variant),
          add_variant("model.safetensors", variant),
          add_variant("model.safetensors.index.json", variant)};
}

std::shared_ptr<TensorSource> open_checkpoint(const std::string& path, const std::string& variant) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  XF_CHECK(fs::exists(status), "checkpoint not found: ", path);
  if (fs::is_directory(status)) {
    const auto candidates = checkpoint_file_names(variant);
    for (const auto& name : candidates) {
      const fs::path file = fs::path(path) / name;
      if (fs::is_regular_file(file)) return open_checkpoint(file.string());
    }
    std::string looked;
    for (const auto& name : candidates) looked += (looked.empty() ? "" : ", ") + name;
    XF_THROW("no safetensors checkpoint in ", path, ": looked for ", looked);
  }
  if (ends_with(path, ".json")) return std::make_shared<ShardedCheckpoint>(path);
  return std::make_shared<SafetensorsFile>(path);
}

}  // namespace xfuser::models
