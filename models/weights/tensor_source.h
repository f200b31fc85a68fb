// A read-only collection of named tensors: one safetensors file, a sharded checkpoint, or a
// synthetic source in tests. Modules load from it by exact diffusers/transformers names.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace xfuser::models {

struct TensorInfo {
  c10::ScalarType dtype;       // dtype the tensor has once loaded (fp8 may load as another type)
  std::string dtype_name;      // dtype as stored, e.g. "BF16", "F8_E4M3"
  std::vector<int64_t> shape;  // stored shape
  std::string file;            // the file that holds it
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;

  // Every tensor name, sorted.
  virtual std::vector<std::string> names() const = 0;
  virtual bool contains(const std::string& name) const = 0;
  // Throws xfuser::Error naming the tensor and describe() when absent.
  virtual TensorInfo info(const std::string& name) const = 0;
  // The tensor on CPU; a zero-copy view of the file where the dtype allows. Throws when absent.
  virtual at::Tensor get(const std::string& name) const = 0;
  // `length` entries from `start` along `dim`, reading only that part where the layout allows
  // (tensor parallelism loads one slice per rank). The default narrows get().
  virtual at::Tensor get_slice(const std::string& name, int64_t dim, int64_t start,
                               int64_t length) const;
  // Where the tensors come from, for error messages (a file or folder path).
  virtual std::string describe() const = 0;
  // A hint that no view of `name` is in use any more (its data was copied, e.g. converted to
  // fp8): a memory-mapped file drops the tensor's pages from memory (re-read from the file if
  // touched again). The default does nothing.
  virtual void release(const std::string& name) const {}
};

// An in-memory source (tests, tools, converted checkpoints).
class TensorMapSource : public TensorSource {
 public:
  explicit TensorMapSource(std::map<std::string, at::Tensor> tensors, std::string label = "memory")
      : tensors_(std::move(tensors)), label_(std::move(label)) {}
  std::vector<std::string> names() const override;
  bool contains(const std::string& name) const override { return tensors_.count(name) > 0; }
  TensorInfo info(const std::string& name) const override;
  at::Tensor get(const std::string& name) const override;
  std::string describe() const override { return label_; }

 private:
  std::map<std::string, at::Tensor> tensors_;
  std::string label_;
};

// A view of another source with `inserted` put after `at` in the names that start with `at`
// (all names when `at` is empty): a checkpoint saved without a wrapper module's prefix read by the
// module that has it. transformers 5 saves CLIPTextModel and CLIPVisionModel without their
// "text_model." / "vision_model." prefix. Names outside `at` pass through unchanged.
class InsertedPrefixSource : public TensorSource {
 public:
  InsertedPrefixSource(const TensorSource& base, std::string at, std::string inserted)
      : base_(base), at_(std::move(at)), inserted_(std::move(inserted)) {}
  std::vector<std::string> names() const override;
  bool contains(const std::string& name) const override;
  TensorInfo info(const std::string& name) const override;
  at::Tensor get(const std::string& name) const override;
  at::Tensor get_slice(const std::string& name, int64_t dim, int64_t start,
                       int64_t length) const override;
  std::string describe() const override { return base_.describe(); }
  void release(const std::string& name) const override { base_.release(to_base(name, true)); }

 private:
  // The base name of a view name; a name under `at` without `inserted` has none (an empty
  // string). `checked`: throw naming the tensor instead.
  std::string to_base(const std::string& name, bool checked = false) const;

  const TensorSource& base_;
  std::string at_;
  std::string inserted_;
};

// Whether any name of the source starts with `prefix`.
bool has_prefix(const TensorSource& source, const std::string& prefix);

}  // namespace xfuser::models
