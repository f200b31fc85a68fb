// Module: a tree of named parameters with diffusers' state-dict names, loaded strictly.
//
// A model declares its parameters and expected shapes at construction (param / child), then
// load() fills them from a TensorSource: every missing tensor, unexpected tensor and shape
// mismatch is listed by name in one error. No autograd, no torch::nn: inference only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "backends/fp8.h"
#include "models/common/lora.h"

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

// The kind of torch.nn layer a parameter belongs to, as diffusers' module tree has it: weight
// formats treat layers by kind (fp8 storage casts Linear, Conv and Embedding layers, as
// diffusers' layerwise casting does; fp8 GEMMs quantize Linear weights).
enum class LayerKind : uint8_t { kOther, kLinear, kConv, kEmbedding };

// A parameter held in 8-bit floating point (backends/fp8.h). Its value is data * scale in
// `dtype`, the dtype the layer computes in.
struct Fp8Weight {
  at::Tensor data;  // the fp8 values, the parameter's shape
  // float32 [out, 1], one scale per output channel (row) of a Linear weight; undefined: the
  // values are the weights themselves (storage only, diffusers' layerwise casting).
  at::Tensor scale;
  backends::Fp8Format format = backends::Fp8Format::kE4M3FN;
  c10::ScalarType dtype = c10::kFloat;
};

// A set of parameters whose compute values are made current before use, by CPU offload
// (models/common/offload.h: copied from host memory) or FSDP (models/common/fsdp.h: gathered
// from every rank's shard). ParamSlot::ensure_resident() calls use() while in_use is false.
struct ParamGroup {
  virtual ~ParamGroup() = default;
  bool in_use = false;  // the slots hold their compute values now
  virtual void use() = 0;
};

// FSDP's part of a parameter (models/common/fsdp.h): the stored tensor's dim 0 in `parts`
// chunks of ceil(rows / parts) rows; this rank holds chunk `part`, zero-padded to the chunk's
// full length (the last ranks' chunks may be short or empty), as FSDP2's dim-0 sharding.
struct RowShard {
  int part = 0;
  int parts = 1;
  int64_t rows = 0;  // dim 0 of the whole parameter
  int64_t chunk() const { return (rows + parts - 1) / parts; }
  int64_t begin() const { return std::min<int64_t>(rows, part * chunk()); }
  int64_t length() const { return std::min<int64_t>(rows, begin() + chunk()) - begin(); }
};

struct ParamSlot {
  std::vector<int64_t> shape;            // expected shape (of this rank's part when sharded)
  at::Tensor tensor;                     // undefined until loaded, and while held in fp8
  std::optional<c10::ScalarType> dtype;  // load dtype override (e.g. kept in fp32)
  std::optional<ParamShard> shard;       // set: the slot holds a part of the stored tensor
  LayerKind layer = LayerKind::kOther;   // the layer it belongs to (set by the layer classes)
  std::optional<Fp8Weight> fp8;          // set: the parameter is held here, not in `tensor`
  // Set while an Offloader or an FSDP sharder holds the parameter: `tensor` (or fp8's) is the
  // host copy or this rank's shard until ensure_resident() puts the compute value there.
  ParamGroup* group = nullptr;
  // Set: the slot was loaded as this rank's FSDP shard (`tensor` / fp8 hold chunk rows; `shape`
  // stays the whole parameter's).
  std::optional<RowShard> rows;
  // Unfused LoRA adapters of a Linear weight (models/common/lora.h): added by models::linear.
  std::vector<LoraBranch> lora;

  // The shape of the tensor in the checkpoint (== shape unless sharded).
  std::vector<int64_t> stored_shape() const;
  // Loaded (in `tensor` or in fp8).
  bool loaded() const { return tensor.defined() || fp8.has_value(); }
  // The parameter in the dtype its layer computes in: `tensor`, or the fp8 values decoded and
  // scaled (a new tensor on every call, as diffusers' layerwise casting upcasts per forward).
  // Every read of a parameter for compute goes through value() (or models::linear), which makes
  // an offloaded parameter resident on the compute device first.
  at::Tensor value() const;
  // Makes an offloaded parameter's device copy current (no-op otherwise).
  void ensure_resident() const;
  // That dtype, without decoding.
  c10::ScalarType compute_dtype() const;
  // Bytes the parameter holds (fp8 values and scales, or the tensor).
  int64_t bytes() const;
};

// How the layer parameters of a model are held after loading.
struct WeightFormat {
  enum class Kind {
    kAsLoaded,    // in the load dtype
    kFp8Storage,  // every parameter of the selected Linear / Conv / Embedding layers in fp8,
                  // upcast to the load dtype per use (diffusers' apply_layerwise_casting)
    kFp8Scaled,   // the selected Linear weights in fp8 with per-output-channel float32 scales
                  // (amax / fp8 max per row); their layers run FP8 GEMMs
                  // (models/common/fp8_linear.h)
  };
  Kind kind = Kind::kAsLoaded;
  backends::Fp8Format format = backends::Fp8Format::kE4M3FN;
  // Which layer parameters (by full name) take the format; unset: all of them.
  std::function<bool(const std::string& name)> selects;

  // Whether the parameter `name` in `slot` takes this format (its layer kind, shape and name).
  bool applies(const std::string& name, const ParamSlot& slot) const;
  // Converts one loaded parameter to this format (its `tensor` moves into `fp8`).
  void apply(ParamSlot& slot) const;
};

// The two largest block sizes of a component: streaming blocks one at a time with the next one
// already on its way holds at most their sum (CPU offload's and FSDP's bounds, the memory plan).
template <typename T>
struct TwoLargest {
  T first = 0, second = 0;
  void add(T n) {
    if (n > first) {
      second = first;
      first = n;
    } else if (n > second) {
      second = n;
    }
  }
  T sum() const { return first + second; }
};

// (prefix position, block index) of parameter `name` under "<prefix><index>." for one of
// `prefixes` ("transformer_blocks.", ...), or (-1, -1): how CPU offload and FSDP group a
// model's parameters by block.
std::pair<int, int64_t> block_list_key(const std::string& name,
                                       const std::vector<std::string>& prefixes);

struct LoadOptions {
  // Tensors in the source that no parameter claims are an error unless they start with one of
  // these prefixes, or allow_unexpected is set (a partial load such as one pipeline stage).
  std::vector<std::string> ignore_unexpected_prefixes;
  bool allow_unexpected = false;
  // Where the weights go: copied there once, as they are read (backends::DeviceUploader).
  c10::Device device = c10::Device(c10::kCPU);
  // Each selected parameter is converted as it is read, so the whole model never exists in the
  // load dtype at once.
  WeightFormat weight_format;
  // FSDP: part `part` of `parts` (part < parts): every parameter with at least `parts` rows
  // that tensor parallelism does not slice is read as this rank's row chunk only (RowShard);
  // smaller ones load whole (replicated). parts <= 1: everything loads whole.
  int row_part = 0;
  int row_parts = 1;
  // LoRA adapters of this component: fused into the weights as they are read, or attached to
  // their slots (models/common/lora.h).
  std::shared_ptr<const ComponentLora> lora;
};

// The part of `full` (the stored layout) that `shard` selects.
at::Tensor take_part(const at::Tensor& full, const ParamShard& shard);

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
  // Bytes the loaded parameters hold (ParamSlot::bytes summed).
  int64_t parameter_bytes() const;
  // Converts the loaded parameters `format` selects (load() does it as it reads; this is for
  // modules filled otherwise, e.g. init_random). Returns how many were converted.
  int apply_weight_format(const WeightFormat& format);

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
