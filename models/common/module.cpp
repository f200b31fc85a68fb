#include "models/common/module.h"

#include <algorithm>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <ATen/ATen.h>

#include "backends/device.h"
#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/weights/component_folder.h"
#include "models/weights/tensor_source.h"

namespace xfuser::models {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

at::Tensor take_part(const at::Tensor& full, const ParamShard& shard) {
  std::vector<at::Tensor> pieces;
  int64_t offset = 0;
  for (int64_t seg : shard.segments) {
    const int64_t len = seg / shard.parts;
    pieces.push_back(full.narrow(shard.dim, offset + shard.part * len, len));
    offset += seg;
  }
  return pieces.size() == 1 ? pieces[0] : at::cat(pieces, shard.dim);
}

std::pair<int, int64_t> block_list_key(const std::string& name,
                                       const std::vector<std::string>& prefixes) {
  for (size_t p = 0; p < prefixes.size(); ++p) {
    if (!starts_with(name, prefixes[p])) continue;
    size_t i = prefixes[p].size(), j = i;
    while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
    if (j == i || j >= name.size() || name[j] != '.') continue;
    return {static_cast<int>(p), std::stoll(name.substr(i, j - i))};
  }
  return {-1, -1};
}

void ParamSlot::ensure_resident() const {
  if (group != nullptr && !group->in_use) group->use();
}

at::Tensor ParamSlot::value() const {
  ensure_resident();
  if (!fp8) return tensor;
  if (!fp8->scale.defined()) return backends::from_fp8(fp8->data, fp8->format, fp8->dtype);
  return (backends::from_fp8(fp8->data, fp8->format, at::kFloat) * fp8->scale).to(fp8->dtype);
}

c10::ScalarType ParamSlot::compute_dtype() const {
  if (fp8) return fp8->dtype;
  XF_CHECK(tensor.defined(), "parameter of shape ", shape_string(shape), " used before loading");
  return tensor.scalar_type();
}

int64_t ParamSlot::bytes() const {
  auto size = [](const at::Tensor& t) {
    return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : int64_t{0};
  };
  return fp8 ? size(fp8->data) + size(fp8->scale) : size(tensor);
}

bool WeightFormat::applies(const std::string& name, const ParamSlot& slot) const {
  switch (kind) {
    case Kind::kAsLoaded:
      return false;
    case Kind::kFp8Storage:
      if (slot.layer == LayerKind::kOther) return false;
      break;
    case Kind::kFp8Scaled:
      if (slot.layer != LayerKind::kLinear || slot.shape.size() != 2 || name.size() < 6 ||
          name.compare(name.size() - 6, 6, "weight") != 0) {
        return false;
      }
      break;
  }
  return !selects || selects(name);
}

void WeightFormat::apply(ParamSlot& slot) const {
  XF_CHECK(kind != Kind::kAsLoaded && !slot.fp8 && slot.tensor.defined(),
           "WeightFormat::apply: the parameter is not loaded or already converted");
  XF_CHECK(at::isFloatingType(slot.tensor.scalar_type()), "fp8 weights need floating-point ",
           "parameters, got ", slot.tensor.scalar_type());
  Fp8Weight w;
  w.format = format;
  w.dtype = slot.tensor.scalar_type();
  if (kind == Kind::kFp8Storage) {
    w.data = backends::to_fp8(slot.tensor, format);
  } else {
    // One float32 scale per output channel: the row's largest magnitude maps to the format's
    // largest finite value (all-zero rows get a tiny scale and stay zero).
    const at::Tensor t = slot.tensor.to(at::kFloat);
    w.scale = (t.abs().amax({1}, /*keepdim=*/true) / backends::fp8_max(format)).clamp_min(1e-12);
    w.data = backends::to_fp8(t / w.scale, format);
  }
  slot.fp8 = std::move(w);
  slot.tensor = at::Tensor();
}

std::vector<int64_t> ParamSlot::stored_shape() const {
  if (!shard) return shape;
  std::vector<int64_t> out = shape;
  int64_t total = 0;
  for (int64_t seg : shard->segments) total += seg;
  out[shard->dim] = total;
  return out;
}

ParamSlot& Module::sharded_param(const std::string& name, std::vector<int64_t> stored_shape,
                                 ParamShard shard) {
  const int64_t ndim = static_cast<int64_t>(stored_shape.size());
  XF_CHECK(shard.dim >= 0 && shard.dim < ndim, "parameter '", name, "' of shape ",
           shape_string(stored_shape), " has no dim ", shard.dim, " to shard");
  XF_CHECK(shard.parts >= 1 && shard.part >= 0 && shard.part < shard.parts, "parameter '", name,
           "': shard part ", shard.part, " of ", shard.parts, " is out of range");
  if (shard.segments.empty()) shard.segments = {stored_shape[shard.dim]};
  int64_t total = 0, local = 0;
  for (int64_t seg : shard.segments) {
    XF_CHECK(seg >= 0 && seg % shard.parts == 0, "parameter '", name, "' of shape ",
             shape_string(stored_shape), ": dim ", shard.dim, " (segment of ", seg,
             ") does not split into ", shard.parts, " equal parts");
    total += seg;
    local += seg / shard.parts;
  }
  XF_CHECK(total == stored_shape[shard.dim], "parameter '", name, "': shard segments sum to ",
           total, ", dim ", shard.dim, " of ", shape_string(stored_shape), " has ",
           stored_shape[shard.dim]);
  std::vector<int64_t> shape = stored_shape;
  shape[shard.dim] = local;
  ParamSlot& slot = param(name, std::move(shape));
  if (shard.parts > 1) slot.shard = std::move(shard);
  return slot;
}

ParamSlot& Module::param(const std::string& name, std::vector<int64_t> shape) {
  for (const auto& [n, slot] : params_)
    XF_CHECK(n != name, "parameter '", name, "' declared twice");
  params_.emplace_back(name, std::make_unique<ParamSlot>());
  params_.back().second->shape = std::move(shape);
  return *params_.back().second;
}

std::vector<std::pair<std::string, ParamSlot*>> Module::named_parameters(
    const std::string& prefix) {
  std::vector<std::pair<std::string, ParamSlot*>> out;
  for (auto& [name, slot] : params_) out.emplace_back(prefix + name, slot.get());
  for (auto& [name, mod] : children_) {
    auto sub = mod->named_parameters(prefix + name + ".");
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<std::pair<std::string, const ParamSlot*>> Module::named_parameters(
    const std::string& prefix) const {
  auto mut = const_cast<Module*>(this)->named_parameters(prefix);
  return {mut.begin(), mut.end()};
}

void Module::load(const TensorSource& given_source, c10::ScalarType dtype,
                  const std::string& prefix, const LoadOptions& options) {
  XF_CONTEXT("loading weights from ", given_source.describe());
  // LoRA adapters: checked against the model before any weight is read; fused ones are added to
  // the tensors as the source hands them out, unfused ones attached to their slots at the end.
  std::map<std::string, std::vector<LoraBranch>> lora_plan;
  std::unique_ptr<TensorSource> fused_source;
  if (options.lora && !options.lora->entries.empty()) {
    lora_plan = plan_lora(*this, *options.lora, options.allow_unexpected);
    if (options.lora->fused) {
      fused_source = make_lora_fused_source(given_source, prefix, lora_plan);
    }
  }
  const TensorSource& source = fused_source ? *fused_source : given_source;
  auto params = named_parameters();
  std::vector<std::string> missing, mismatched, unexpected, wrong_dtype;
  std::set<std::string> claimed;
  // Linear weights stored in fp8 with per-row scales (`<layer>.weight_scale`, float32, [out],
  // [out, 1] or one per-tensor value; an `input_scale` beside it is read by static-activation
  // recipes and not used here: FP8 GEMMs scale activations per token).
  std::set<std::string> scaled;
  for (auto& [name, slot] : params) {
    const std::string full = prefix + name;
    const std::string scale_name = full + "_scale";
    if (slot->layer != LayerKind::kLinear || !source.contains(scale_name) ||
        !source.contains(full)) {
      continue;
    }
    const auto w = source.info(full);
    const auto s = source.info(scale_name);
    const int64_t rows = w.shape.empty() ? 0 : w.shape[0];
    const bool per_row =
        s.shape == std::vector<int64_t>{rows} || s.shape == std::vector<int64_t>{rows, 1};
    const bool per_tensor = s.shape.empty() || s.shape == std::vector<int64_t>{1};
    if (w.dtype_name != "F8_E4M3" || w.shape.size() != 2 || !(per_row || per_tensor) ||
        !at::isFloatingType(s.dtype)) {
      wrong_dtype.push_back(full +
                            ": a scaled fp8 weight needs an F8_E4M3 [out, in] weight and a "
                            "float " +
                            scale_name + " of [out], [out, 1] or one value; got " + w.dtype_name +
                            " " + shape_string(w.shape) + " and " + s.dtype_name + " " +
                            shape_string(s.shape));
      continue;
    }
    scaled.insert(full);
    claimed.insert(scale_name);
    if (source.contains(full.substr(0, full.size() - 6) + "input_scale")) {
      claimed.insert(full.substr(0, full.size() - 6) + "input_scale");
    }
  }
  for (auto& [name, slot] : params) {
    const std::string full = prefix + name;
    claimed.insert(full);
    if (!source.contains(full)) {
      missing.push_back(full + " " + shape_string(slot->shape));
      continue;
    }
    auto info = source.info(full);
    if (info.shape != slot->stored_shape()) {
      mismatched.push_back(full + ": checkpoint " + shape_string(info.shape) + ", model expects " +
                           shape_string(slot->stored_shape()));
    }
    // Weights are floating point: an integer or bool tensor would be cast to garbage silently.
    const auto want = slot->dtype.value_or(dtype);
    if (at::isFloatingType(want) && !at::isFloatingType(info.dtype)) {
      wrong_dtype.push_back(full + ": checkpoint " + info.dtype_name +
                            ", model expects a floating-point type");
    }
  }
  if (!options.allow_unexpected) {
    for (const auto& name : source.names()) {
      if (!starts_with(name, prefix) || claimed.count(name)) continue;
      bool ignored = std::any_of(
          options.ignore_unexpected_prefixes.begin(), options.ignore_unexpected_prefixes.end(),
          [&](const std::string& p) { return starts_with(name, prefix + p); });
      if (!ignored) unexpected.push_back(name);
    }
  }
  if (!missing.empty() || !mismatched.empty() || !unexpected.empty() || !wrong_dtype.empty()) {
    std::ostringstream os;
    os << "state dict does not match the model (" << missing.size() << " missing, "
       << mismatched.size() << " shape mismatches, " << unexpected.size() << " unexpected";
    if (!wrong_dtype.empty()) os << ", " << wrong_dtype.size() << " dtype mismatches";
    os << ") in " << source.describe();
    auto list = [&](const char* title, const std::vector<std::string>& items) {
      if (items.empty()) return;
      os << "\n  " << title << ":";
      for (const auto& it : items) os << "\n    " << it;
    };
    list("missing tensors", missing);
    list("shape mismatches", mismatched);
    list("dtype mismatches", wrong_dtype);
    list("unexpected tensors", unexpected);
    if (const std::string note = config_defaults_note(source.describe()); !note.empty()) {
      os << "\n  " << note;
    }
    XF_THROW(os.str());
  }
  backends::DeviceUploader uploader(options.device);
  int converted = 0;
  for (auto& [name, slot] : params) {
    at::Tensor t;
    slot->rows.reset();
    if (options.row_parts > 1 && !slot->shard && !slot->shape.empty() &&
        slot->shape[0] >= options.row_parts) {
      // FSDP: only this rank's chunk of rows is read, zero-padded to the chunk length.
      RowShard rs{options.row_part, options.row_parts, slot->shape[0]};
      std::vector<int64_t> pad_shape = slot->shape;
      pad_shape[0] = rs.chunk() - rs.length();
      if (rs.length() > 0) {
        t = source.get_slice(prefix + name, 0, rs.begin(), rs.length());
        if (pad_shape[0] > 0) t = at::cat({t, at::zeros(pad_shape, t.options())}, 0);
      } else {
        t = at::zeros(pad_shape, at::TensorOptions().dtype(source.info(prefix + name).dtype));
      }
      if (!t.is_contiguous()) t = t.contiguous();
      slot->rows = rs;
    } else if (!slot->shard) {
      t = source.get(prefix + name);
    } else {
      // Only this rank's slices are read; a slice along dim > 0 is a strided view, copied to a
      // contiguous tensor so the kernels see a dense weight.
      const ParamShard& sh = *slot->shard;
      std::vector<at::Tensor> pieces;
      int64_t offset = 0;
      for (int64_t seg : sh.segments) {
        const int64_t len = seg / sh.parts;
        pieces.push_back(source.get_slice(prefix + name, sh.dim, offset + sh.part * len, len));
        offset += seg;
      }
      t = pieces.size() == 1 ? pieces[0] : at::cat(pieces, sh.dim);
      if (!t.is_contiguous()) t = t.contiguous();
    }
    slot->fp8.reset();
    const auto load_dtype = slot->dtype.value_or(dtype);
    if (scaled.count(prefix + name)) {
      // Scales per row of this rank's rows (a column-parallel part takes its rows' scales).
      at::Tensor scale = source.get(prefix + name + "_scale").to(at::kFloat).reshape({-1, 1});
      scale = scale.size(0) == 1 ? scale.expand({slot->stored_shape()[0], 1}).contiguous() : scale;
      if (slot->shard && slot->shard->dim == 0) scale = take_part(scale, *slot->shard).contiguous();
      if (slot->rows) {
        const RowShard& rs = *slot->rows;
        scale = at::cat({scale.narrow(0, rs.begin(), rs.length()),
                         at::ones({rs.chunk() - rs.length(), 1}, scale.options())},
                        0);
      }
      const auto& wf = options.weight_format;
      if (wf.kind == WeightFormat::Kind::kFp8Scaled && wf.format == backends::Fp8Format::kE4M3FN &&
          wf.applies(name, *slot)) {
        // Kept as stored: the checkpoint's own codes and scales, no second rounding.
        Fp8Weight w;
        w.data = backends::to_fp8(uploader.upload(t, t.scalar_type()), wf.format);
        w.scale = uploader.upload(scale, at::kFloat);
        w.dtype = load_dtype;
        slot->fp8 = std::move(w);
        continue;
      }
      t = t.to(at::kFloat) * scale;  // dequantized, then held as the format says
    }
    slot->tensor = uploader.upload(t, load_dtype);
    if (options.weight_format.applies(name, *slot)) {
      options.weight_format.apply(*slot);
      // The fp8 values are a copy: the file's pages of the tensor are no longer needed.
      t = at::Tensor();
      source.release(prefix + name);
      ++converted;
    }
  }
  uploader.finish();
  if (!lora_plan.empty() && !options.lora->fused) {
    attach_lora(*this, lora_plan, dtype, options.lora->device);
  }
#ifdef __GLIBC__
  // Converting held one float32 copy of a tensor at a time; return those blocks to the system
  // rather than keep them in malloc's free lists.
  if (converted > 0) ::malloc_trim(0);
#endif
}

void Module::init_random(uint64_t seed, double std, c10::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& [name, slot] : named_parameters()) {
    auto t = at::empty(slot->stored_shape(), at::TensorOptions().dtype(at::kFloat));
    t.normal_(0.0, std, gen);
    if (slot->shard) t = take_part(t, *slot->shard).contiguous();
    slot->fp8.reset();
    slot->tensor = t.to(slot->dtype.value_or(dtype));
  }
}

int64_t Module::parameter_bytes() const {
  int64_t n = 0;
  for (const auto& [name, slot] : named_parameters()) n += slot->bytes();
  return n;
}

int Module::apply_weight_format(const WeightFormat& format) {
  int converted = 0;
  for (auto& [name, slot] : named_parameters()) {
    if (slot->tensor.defined() && format.applies(name, *slot)) {
      format.apply(*slot);
      ++converted;
    }
  }
  return converted;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, slot] : named_parameters()) {
    int64_t k = 1;
    for (auto d : slot->shape) k *= d;
    n += k;
  }
  return n;
}

}  // namespace xfuser::models
