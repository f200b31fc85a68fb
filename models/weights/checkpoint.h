// Checkpoints as diffusers / transformers save them: one .safetensors file, or shards listed by a
// `*.safetensors.index.json` ({"metadata": {...}, "weight_map": {tensor name: shard file}}).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/weights/safetensors.h"
#include "models/weights/tensor_source.h"

namespace xfuser::models {

// The tensors of a sharded checkpoint. Shard paths are relative to the index's folder; each shard
// is opened (mapped) once. Every tensor the index lists must be present in its shard; tensors a
// shard holds beyond the index are not part of the checkpoint.
class ShardedCheckpoint : public TensorSource {
 public:
  explicit ShardedCheckpoint(const std::string& index_path);

  std::vector<std::string> names() const override;
  bool contains(const std::string& name) const override { return by_name_.count(name) > 0; }
  TensorInfo info(const std::string& name) const override;
  at::Tensor get(const std::string& name) const override;
  void release(const std::string& name) const override;
  at::Tensor get_slice(const std::string& name, int64_t dim, int64_t start,
                       int64_t length) const override;
  std::string describe() const override { return index_path_; }

  // The opened shards, in the order of their file names.
  const std::vector<std::shared_ptr<SafetensorsFile>>& shards() const { return shards_; }

 private:
  const SafetensorsFile& shard_of(const std::string& name) const;

  std::string index_path_;
  std::vector<std::shared_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const SafetensorsFile*> by_name_;
};

// The weight files a component folder may hold, in the order open_checkpoint() tries them:
// diffusers' then transformers' names, single file before index. A non-empty `variant` ("fp16")
// is inserted before the last extension as both libraries do: "diffusion_pytorch_model.fp16.
// safetensors", "diffusion_pytorch_model.safetensors.index.fp16.json".
std::vector<std::string> checkpoint_file_names(const std::string& variant = "");

// Opens `path`: a .safetensors file, a *.json shard index, or a folder holding one of
// checkpoint_file_names(variant). The error for a folder lists every name it looked for.
std::shared_ptr<TensorSource> open_checkpoint(const std::string& path,
                                              const std::string& variant = "");

}  // namespace xfuser::models
