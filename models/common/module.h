// Module: a tree of named parameters with diffusers' state-dict names, loaded strictly.
//
// A model declares its parameters and expected shapes at construction (param / child), then
// load() fills them from a TensorSource: every missing tensor, unexpected tensor and shape
// mismatch is listed by name in one error. No autograd, no torch::nn: inference only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace xfuser::models {

class TensorSource;

// A parameter that holds one part of the checkpoint tensor (tensor parallelism): along `dim`,
// the stored tensor is a concatenation of `segments` (sizes summing to the stored extent; one
// segment = the whole dim); this rank holds part `part` of `parts` equal parts of every segment,
// concatenated in segment order. E.g. FLUX single blocks' proj_out.weight [D, D + 4D] row-split
// over 2 ranks: dim 1, segments {D, 4D}, rank r holds columns [rD/2, (r+1)D/2) and
// [D + r*2D, D + (r+1)*2D). Each rank reads only its slices (TensorSource::get_slice).
struct ParamShard {
  int64_t dim = 0;
  std::vector<int64_t> segments;
  int part = 0;
  int parts = 1;
};

struct ParamSlot {
  std::vector<int64_t> shape;            // expected shape (of this rank's part when sharded)
  at::Tensor tensor;                     // undefined until loaded
  std::optional<c10::ScalarType> dtype;  // load dtype override (e.g. kept in fp32)
  std::optional<ParamShard> shard;       // set: the slot holds a part of the stored tensor

  // The shape of the tensor in the checkpoint (== shape unless sharded).
  std::vector<int64_t> stored_shape() const;
};

struct LoadOptions {
  // Tensors in the source that no parameter claims are an error unless they start with one of
  // these prefixes, or allow_unexpected is set (a partial load such as one pipeline stage).
  std::vector<std::string> ignore_unexpected_prefixes;
  bool allow_unexpected = false;
  // Where the weights go: copied there once, as they are read (backends::DeviceUploader).
  c10::Device device = c10::Device(c10::kCPU);
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // All parameters of this module and its children, "child.sub.name" style, in declaration order.
  std::vector<std::pair<std::string, ParamSlot*>> named_parameters(const std::string& prefix = "");
  std::vector<std::pair<std::string, const ParamSlot*>> named_parameters(
      const std::string& prefix = "") const;

  // Loads every parameter from `source` in `dtype` (copy when the dtype differs, else a view).
  // `prefix` is prepended to every name looked up in the source.
  virtual void load(const TensorSource& source, c10::ScalarType dtype,
                    const std::string& prefix = "", const LoadOptions& options = {});

  // Fills every parameter with seeded random values (tests, tiny models): N(0, std) per tensor.
  // A sharded parameter draws its whole stored tensor and keeps its part, so a sharded model
  // holds exactly the slices of the unsharded model initialised with the same seed.
  void init_random(uint64_t seed, double std = 0.02, c10::ScalarType dtype = c10::kFloat);

  // Total parameter count.
  int64_t num_parameters() const;

 protected:
  // Declares a parameter and returns its slot; the tensor is defined after load().
  ParamSlot& param(const std::string& name, std::vector<int64_t> shape);
  // Declares part `shard.part` of `shard.parts` of a parameter whose stored shape is
  // `stored_shape` (see ParamShard); the slot's shape is the part's. Segments default to the
  // whole dim; every segment must divide by `parts` (the error names the parameter).
  ParamSlot& sharded_param(const std::string& name, std::vector<int64_t> stored_shape,
                           ParamShard shard);
  // Registers a child module under `name` ("transformer_blocks.3" style names are fine).
  template <typename M>
  std::shared_ptr<M> child(const std::string& name, std::shared_ptr<M> module) {
    children_.emplace_back(name, module);
    return module;
  }

 private:
  std::vector<std::pair<std::string, std::unique_ptr<ParamSlot>>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace xfuser::models
