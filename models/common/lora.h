// LoRA adapters: low-rank updates of a model's Linear layers, read from the files people train
// and share, and applied to any Module at load.
//
// An adapter file holds, for each adapted Linear layer, a down projection A [r, in] and an up
// projection B [out, r] (diffusers / PEFT call them lora_A / lora_B, kohya's sd-scripts
// lora_down / lora_up). With the adapter's scale s and the layer's alpha / r, the layer computes
//   y = x W^T + b + s * alpha/r * ((x A^T) B^T + b_B)
// where b_B is the optional lora_B bias (the original Wan layout's `diff_b`). Applied:
//   fused    W += s * alpha/r * B A (and b += s * alpha/r * b_B) as each weight is read, in
//            float32 and rounded once to the load dtype: no cost per step, and the update is in
//            the weights before tensor parallelism slices them or FP8 quantizes them;
//   unfused  A and B kept beside the weight (ParamSlot::lora, sliced as the weight is sliced)
//            and added in every models::linear call, so the scale can change per generation.
//
// Layouts: the diffusers / PEFT layout (`<component>.<module>.lora_A.weight`, the scaling in the
// `lora_adapter_metadata` header entry diffusers writes, else per-module `.alpha`, else 1) is
// read here for every family. Other layouts (kohya's names for FLUX, the original Wan names) are
// converted by the family that owns the names (Family::lora_layouts) into the same form. LoKr,
// LoHa and DoRA files are refused by name.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace xfuser::models {

class Module;
class TensorSource;

// One low-rank update read from a file: `modules` of one component share the down projection
// and take consecutive rows of the up projection, in order (a fused projection in the file, as
// BFL's qkv over diffusers' to_q / to_k / to_v, splits by the modules' output features).
struct LoraUpdate {
  std::string key;  // the file's key it came from (for errors)
  std::vector<std::string>
      modules;          // module names in the component: "transformer_blocks.0.attn.to_q"
  at::Tensor down;      // [r, in], float32
  at::Tensor up;        // [sum of the modules' out, r], float32
  at::Tensor up_bias;   // [sum of out] or undefined
  double factor = 1.0;  // alpha / r (alpha / sqrt(r) for rsLoRA)
};

// One adapter file, converted.
struct LoraAdapter {
  std::string name;  // unique within a run: the file's stem unless given
  std::string path;
  std::string layout;  // "diffusers", or the family layout it was converted from
  // Updates by the component they adapt ("transformer", "text_encoder", ...).
  std::map<std::string, std::vector<LoraUpdate>> components;
};

// The tensors and header metadata of an adapter file (.safetensors).
struct LoraFile {
  std::string path;
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;
  bool has_key_prefix(const std::string& prefix) const;
};

// A layout a family converts: `matches` says whether the file is in it; `convert` fills the
// adapter's components and must consume every key of the file (LoraKeys).
struct LoraLayout {
  std::string name;
  std::function<bool(const LoraFile&)> matches;
  std::function<void(const LoraFile&, LoraAdapter&)> convert;
};

// Reads the keys of a file in a family layout, remembering what was taken; finish() errors on
// any key left over, naming it and the file.
class LoraKeys {
 public:
  explicit LoraKeys(const LoraFile& file);
  bool contains(const std::string& key) const;
  at::Tensor take(const std::string& key);  // float32; error naming the key when absent
  std::optional<at::Tensor> take_optional(const std::string& key);
  // Takes `<base>.<down>.weight`, `<base>.<up>.weight` and the optional `<base>.alpha` and adds
  // an update of `modules` (factor alpha / r, 1 without alpha) to `component`; false (nothing
  // taken) when the down weight is absent. `bias_key` names an optional lora_B bias.
  bool take_pair(LoraAdapter& adapter, const std::string& component, const std::string& base,
                 std::vector<std::string> modules, const std::string& down = "lora_down",
                 const std::string& up = "lora_up", const std::string& bias_key = "");
  // Every key not taken yet.
  std::vector<std::string> remaining() const;
  void finish(const std::string& layout) const;
  const LoraFile& file() const { return file_; }

 private:
  const LoraFile& file_;
  std::set<std::string> taken_;
};

// What the user asked for: `--lora PATH[:SCALE]` (target empty) or `--lora_2 PATH[:SCALE]`
// (target "transformer_2": the adapter's transformer part goes to Wan 2.2's second expert, as
// diffusers' load_lora_weights(..., load_into_transformer_2=True)).
struct LoraSpec {
  std::string path;
  double scale = 1.0;
  std::string target;
  std::string name;  // empty: the file's stem (made unique with a suffix)
};

// "PATH" or "PATH:SCALE" (the scale after the last ':' when it parses as a number).
LoraSpec parse_lora_spec(const std::string& text, const std::string& flag);

// Reads and converts one adapter file: the diffusers / PEFT layout, or the first of `layouts`
// that matches. Errors name the file and the key.
LoraAdapter read_lora_adapter(const LoraSpec& spec, const std::vector<LoraLayout>& layouts);

// Module-level application. One adapted parameter: the update's rows for this module, the scale
// shared with the run (unfused: read at every call).
struct LoraBranch {
  std::string adapter;  // name (errors, reports)
  std::string key;      // the file key
  at::Tensor down;      // [r, in]
  at::Tensor up;        // [out, r] (this module's rows)
  at::Tensor up_bias;   // [out] or undefined
  double factor = 1.0;
  std::shared_ptr<const double> scale;
  double weight() const { return *scale * factor; }
};

// Every adapter's updates for one component, with the run's scales: LoadOptions::lora.
struct ComponentLora {
  struct Entry {
    const LoraAdapter* adapter;
    const LoraUpdate* update;
    std::shared_ptr<const double> scale;
  };
  std::string component;
  bool fused = true;
  std::vector<Entry> entries;
  // Memory for the unfused A and B: where and in which dtype they are held.
  c10::Device device = c10::Device(c10::kCPU);
};

// The branches of each parameter name of `module` ("<module>.weight", and "<module>.bias" for
// lora_B biases when fused). Errors (before any weight is read) name the adapter's file, key and
// module: a module the model does not have (unless `partial`: a pipeline stage holds only some
// blocks), a layer that is not Linear, a shape that does not fit.
std::map<std::string, std::vector<LoraBranch>> plan_lora(Module& module, const ComponentLora& lora,
                                                         bool partial);

// A TensorSource with the planned updates fused into the tensors it hands out (get and
// get_slice: only the rows or columns asked for are computed), float32 for those names. `prefix`
// is the one Module::load prepends to the parameter names.
std::unique_ptr<TensorSource> make_lora_fused_source(
    const TensorSource& base, const std::string& prefix,
    const std::map<std::string, std::vector<LoraBranch>>& plan);

// Unfused: stores each parameter's branches in its slot (sliced as the slot is sharded), in
// `dtype` on `device`.
void attach_lora(Module& module, const std::map<std::string, std::vector<LoraBranch>>& plan,
                 c10::ScalarType dtype, c10::Device device);

// y + the branches of `branches` applied to x (models::linear's unfused path). A branch whose
// scale is 0 adds nothing: the base result is returned bit for bit.
at::Tensor add_lora(const at::Tensor& x, at::Tensor y, const std::vector<LoraBranch>& branches);

}  // namespace xfuser::models
