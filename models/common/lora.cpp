#include "models/common/lora.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <sstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "backends/tensor_util.h"
#include "models/common/layers.h"
#include "models/common/module.h"
#include "models/weights/safetensors.h"
#include "models/weights/tensor_source.h"

namespace xfuser::models {
namespace {

bool lora_starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}
bool lora_ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// Components an adapter file may name, as diffusers' loaders prefix them.
const std::vector<std::string>& known_components() {
  static const std::vector<std::string> names = {"transformer",    "transformer_2",  "text_encoder",
                                                 "text_encoder_2", "text_encoder_3", "unet"};
  return names;
}

// The suffixes of a diffusers / PEFT layer's tensors: (suffix, role).
enum class Role { kDown, kUp, kUpBias, kAlpha };
const std::vector<std::pair<std::string, Role>>& peft_suffixes() {
  static const std::vector<std::pair<std::string, Role>> s = {
      {".lora_A.weight", Role::kDown},
      {".lora_B.weight", Role::kUp},
      {".lora_B.bias", Role::kUpBias},
      // diffusers' older attention-processor names (still read by its loaders).
      {".lora.down.weight", Role::kDown},
      {".lora.up.weight", Role::kUp},
      {".lora_linear_layer.down.weight", Role::kDown},
      {".lora_linear_layer.up.weight", Role::kUp},
      {".alpha", Role::kAlpha},
  };
  return s;
}

// Adapter kinds that are not LoRA, by a key fragment that marks them.
void refuse_other_kinds(const LoraFile& file) {
  for (const auto& [key, t] : file.tensors) {
    const char* kind = nullptr;
    if (key.find("lokr_w") != std::string::npos) kind = "LoKr";
    if (key.find("hada_w") != std::string::npos) kind = "LoHa";
    if (key.find("lora_magnitude_vector") != std::string::npos ||
        key.find("dora_scale") != std::string::npos) {
      kind = "DoRA";
    }
    if (key.find(".oft_") != std::string::npos) kind = "OFT";
    if (kind) {
      XF_THROW(file.path, ": key '", key, "' belongs to a ", kind,
               " adapter; xfuser applies plain LoRA adapters (lora_A / lora_B, lora_down / "
               "lora_up) only");
    }
  }
}

at::Tensor as_float(const at::Tensor& t) { return t.to(at::kFloat).contiguous(); }

// The adapter's scaling from diffusers' `lora_adapter_metadata` header entry: for each component,
// its LoraConfig fields packed as "<component>.<field>".
struct PeftScaling {
  bool present = false;
  double r = 0, alpha = 0;
  bool rslora = false;
  std::vector<std::pair<std::string, double>> rank_pattern, alpha_pattern;
};

// `component` empty: a model's own adapter file (PEFT's save of one model), whose keys and
// metadata fields carry no component prefix.
PeftScaling read_scaling(const LoraFile& file, const std::string& component) {
  PeftScaling s;
  auto it = file.metadata.find("lora_adapter_metadata");
  if (it == file.metadata.end()) return s;
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(it->second);
  } catch (const std::exception& e) {
    XF_THROW(file.path, ": the header's lora_adapter_metadata is not valid JSON: ", e.what());
  }
  XF_CHECK(meta.is_object(), file.path, ": the header's lora_adapter_metadata is not an object");
  const std::string p = component.empty() ? "" : component + ".";
  if (!p.empty()) {
    bool any = false;
    for (auto& [k, v] : meta.items()) any = any || lora_starts_with(k, p);
    if (!any) return s;
  } else if (!meta.contains("r")) {
    return s;
  }
  auto number = [&](const std::string& field) {
    const auto f = meta.find(p + field);
    XF_CHECK(f != meta.end() && f->is_number(), file.path,
             ": lora_adapter_metadata has no number '", p, field, "'");
    return f->get<double>();
  };
  s.present = true;
  s.r = number("r");
  s.alpha = number("lora_alpha");
  for (const char* flag : {"use_dora"}) {
    const auto f = meta.find(p + flag);
    XF_CHECK(f == meta.end() || f->is_null() || (f->is_boolean() && !f->get<bool>()), file.path,
             ": lora_adapter_metadata sets ", p, flag,
             "; DoRA adapters are not supported (plain LoRA only)");
  }
  if (const auto f = meta.find(p + "use_rslora"); f != meta.end() && f->is_boolean()) {
    s.rslora = f->get<bool>();
  }
  auto patterns = [&](const char* field, std::vector<std::pair<std::string, double>>& out) {
    const auto f = meta.find(p + field);
    if (f == meta.end() || f->is_null()) return;
    XF_CHECK(f->is_object(), file.path, ": lora_adapter_metadata ", p, field, " is not an object");
    for (auto& [k, v] : f->items()) {
      XF_CHECK(v.is_number(), file.path, ": lora_adapter_metadata ", p, field, "['", k,
               "'] is not a number");
      out.emplace_back(k, v.get<double>());
    }
  };
  patterns("rank_pattern", s.rank_pattern);
  patterns("alpha_pattern", s.alpha_pattern);
  return s;
}

// PEFT's get_pattern_key: the first pattern p with re.match(r"(.*\.)?(p)$", module).
std::optional<double> pattern_value(const std::vector<std::pair<std::string, double>>& patterns,
                                    const std::string& module) {
  for (const auto& [p, v] : patterns) {
    try {
      if (std::regex_match(module, std::regex("(.*\\.)?(" + p + ")"))) return v;
    } catch (const std::regex_error&) {
      if (module == p || lora_ends_with(module, "." + p)) return v;
    }
  }
  return std::nullopt;
}

LoraFile read_lora_file(const std::string& path) {
  XF_CHECK(std::filesystem::exists(path), "--lora ", path, ": no such file");
  XF_CHECK(std::filesystem::is_regular_file(path), "--lora ", path,
           ": not a file (give the adapter's .safetensors file)");
  LoraFile file;
  file.path = path;
  SafetensorsFile st(path);
  file.metadata = st.metadata();
  for (const auto& name : st.names()) file.tensors.emplace(name, st.get(name).clone());
  XF_CHECK(!file.tensors.empty(), path, ": the adapter file holds no tensors");
  return file;
}

// The diffusers / PEFT layout: "<component>.<module><suffix>" (or no component prefix at all:
// the transformer's adapter as PEFT saves a model's).
bool is_peft_layout(const LoraFile& file) {
  for (const auto& [key, t] : file.tensors) {
    if (lora_ends_with(key, ".lora_A.weight") || lora_ends_with(key, ".lora_B.weight") ||
        lora_ends_with(key, ".lora.down.weight") ||
        lora_ends_with(key, ".lora_linear_layer.down.weight")) {
      continue;
    }
    bool ok = false;
    for (const auto& [suffix, role] : peft_suffixes()) ok = ok || lora_ends_with(key, suffix);
    if (!ok) return false;
  }
  return std::any_of(file.tensors.begin(), file.tensors.end(), [](const auto& kv) {
    return lora_ends_with(kv.first, ".lora_A.weight") ||
           lora_ends_with(kv.first, ".lora.down.weight") ||
           lora_ends_with(kv.first, ".lora_linear_layer.down.weight");
  });
}

void convert_peft(const LoraFile& file, LoraAdapter& adapter) {
  // Group the keys by (component, module).
  struct Parts {
    at::Tensor down, up, up_bias, alpha;
    std::string key;
  };
  std::map<std::pair<std::string, std::string>, Parts> layers;
  bool prefixed = false, bare = false;
  for (const auto& [key, t] : file.tensors) {
    std::string k = key;
    if (lora_starts_with(k, "base_model.model.")) k = k.substr(17);
    std::string component;
    for (const auto& c : known_components()) {
      if (lora_starts_with(k, c + ".")) {
        component = c;
        k = k.substr(c.size() + 1);
        break;
      }
    }
    (component.empty() ? bare : prefixed) = true;
    if (component.empty()) component = "transformer";
    Role role = Role::kDown;
    std::string module;
    for (const auto& [suffix, r] : peft_suffixes()) {
      if (lora_ends_with(k, suffix)) {
        role = r;
        module = k.substr(0, k.size() - suffix.size());
        break;
      }
    }
    XF_CHECK(!module.empty(), file.path, ": key '", key, "' names no module");
    Parts& p = layers[{component, module}];
    at::Tensor& slot = role == Role::kDown     ? p.down
                       : role == Role::kUp     ? p.up
                       : role == Role::kUpBias ? p.up_bias
                                               : p.alpha;
    XF_CHECK(!slot.defined(), file.path, ": key '", key, "' repeats a tensor of module '", module,
             "'");
    slot = t;
    if (role == Role::kDown) p.key = key;
  }
  XF_CHECK(!(prefixed && bare), file.path,
           ": some keys name a component (transformer., text_encoder., ...) and some do not; an "
           "adapter file names its components for every key or for none");
  if (std::any_of(layers.begin(), layers.end(),
                  [](const auto& kv) { return kv.first.first == "unet"; })) {
    XF_THROW(file.path,
             ": this adapter is for a UNet model (keys under 'unet.'); xfuser runs "
             "diffusion transformers");
  }
  std::map<std::string, PeftScaling> scalings;
  for (auto& [id, p] : layers) {
    const auto& [component, module] = id;
    const std::string where = component + "." + module;
    XF_CHECK(p.down.defined(), file.path, ": module '", where, "' has an up weight but no ",
             "down weight (lora_A)");
    XF_CHECK(p.up.defined(), file.path, ": module '", where, "' (key '", p.key,
             "') has no up weight (lora_B)");
    XF_CHECK(p.down.dim() == 2 && p.up.dim() == 2, file.path, ": module '", where, "': LoRA of a ",
             p.down.dim() == 4 ? "convolution" : "non-Linear layer", " (down ",
             shape_string(p.down.sizes()),
             ") is not supported; xfuser adapts Linear "
             "layers");
    const int64_t r = p.down.size(0);
    XF_CHECK(p.up.size(1) == r, file.path, ": module '", where, "': rank mismatch, down (lora_A) ",
             shape_string(p.down.sizes()), " has rank ", r, " but up (lora_B) ",
             shape_string(p.up.sizes()), " has ", p.up.size(1));
    XF_CHECK(!p.up_bias.defined() || (p.up_bias.dim() == 1 && p.up_bias.size(0) == p.up.size(0)),
             file.path, ": module '", where, "': lora_B bias ", shape_string(p.up_bias.sizes()),
             " does not fit up ", shape_string(p.up.sizes()));
    if (!scalings.count(component)) scalings[component] = read_scaling(file, bare ? "" : component);
    const PeftScaling& s = scalings[component];
    double factor = 1.0;
    if (s.present) {
      const double rank = pattern_value(s.rank_pattern, module).value_or(s.r);
      const double alpha = pattern_value(s.alpha_pattern, module).value_or(s.alpha);
      XF_CHECK(static_cast<int64_t>(rank) == r, file.path, ": module '", where,
               "': rank mismatch, lora_adapter_metadata gives r = ", rank,
               " but the weights have rank ", r);
      factor = s.rslora ? alpha / std::sqrt(rank) : alpha / rank;
    } else if (p.alpha.defined()) {
      XF_CHECK(p.alpha.numel() == 1, file.path, ": ", where, ".alpha is not one value");
      factor = p.alpha.to(at::kDouble).item<double>() / static_cast<double>(r);
    }
    LoraUpdate u;
    u.key = p.key;
    u.modules = {module};
    u.down = as_float(p.down);
    u.up = as_float(p.up);
    if (p.up_bias.defined()) u.up_bias = as_float(p.up_bias);
    u.factor = factor;
    adapter.components[component].push_back(std::move(u));
  }
}

class FusedSource : public TensorSource {
 public:
  FusedSource(const TensorSource& base, std::string prefix,
              const std::map<std::string, std::vector<LoraBranch>>& plan)
      : base_(base), prefix_(std::move(prefix)), plan_(plan) {}
  std::vector<std::string> names() const override { return base_.names(); }
  bool contains(const std::string& name) const override { return base_.contains(name); }
  TensorInfo info(const std::string& name) const override { return base_.info(name); }
  std::string describe() const override { return base_.describe(); }
  void release(const std::string& name) const override { base_.release(name); }
  at::Tensor get(const std::string& name) const override {
    const auto* branches = find(name);
    if (!branches) return base_.get(name);
    return fuse(base_.get(name), *branches, -1, 0, 0);
  }
  at::Tensor get_slice(const std::string& name, int64_t dim, int64_t start,
                       int64_t length) const override {
    const auto* branches = find(name);
    if (!branches) return base_.get_slice(name, dim, start, length);
    return fuse(base_.get_slice(name, dim, start, length), *branches, dim, start, length);
  }

 private:
  const std::vector<LoraBranch>* find(const std::string& name) const {
    if (!lora_starts_with(name, prefix_)) return nullptr;
    auto it = plan_.find(name.substr(prefix_.size()));
    return it == plan_.end() ? nullptr : &it->second;
  }
  // base (a slice along `dim` of [start, start + length), or whole for dim -1) + the updates,
  // in float32.
  static at::Tensor fuse(const at::Tensor& base, const std::vector<LoraBranch>& branches,
                         int64_t dim, int64_t start, int64_t length) {
    at::Tensor out = base.to(at::kFloat).clone();
    for (const auto& b : branches) {
      const double w = b.weight();
      if (w == 0.0) continue;
      if (out.dim() == 1) {  // a bias: the lora_B bias
        at::Tensor bias = b.up_bias;
        if (dim == 0) bias = bias.narrow(0, start, length);
        out.add_(bias, w);
        continue;
      }
      at::Tensor up = b.up, down = b.down;
      if (dim == 0) up = up.narrow(0, start, length);
      if (dim == 1) down = down.narrow(1, start, length);
      out.add_(at::matmul(up, down), w);
    }
    return out;
  }

  const TensorSource& base_;
  std::string prefix_;
  const std::map<std::string, std::vector<LoraBranch>>& plan_;
};

}  // namespace

bool LoraFile::has_key_prefix(const std::string& prefix) const {
  return std::any_of(tensors.begin(), tensors.end(),
                     [&](const auto& kv) { return lora_starts_with(kv.first, prefix); });
}

LoraKeys::LoraKeys(const LoraFile& file) : file_(file) {}

bool LoraKeys::contains(const std::string& key) const {
  return file_.tensors.count(key) > 0 && !taken_.count(key);
}

at::Tensor LoraKeys::take(const std::string& key) {
  auto it = file_.tensors.find(key);
  XF_CHECK(it != file_.tensors.end(), file_.path, ": key '", key, "' is missing");
  XF_CHECK(!taken_.count(key), file_.path, ": key '", key, "' is used twice");
  taken_.insert(key);
  return as_float(it->second);
}

std::optional<at::Tensor> LoraKeys::take_optional(const std::string& key) {
  if (!contains(key)) return std::nullopt;
  return take(key);
}

bool LoraKeys::take_pair(LoraAdapter& adapter, const std::string& component,
                         const std::string& base, std::vector<std::string> modules,
                         const std::string& down, const std::string& up,
                         const std::string& bias_key) {
  const std::string down_key = base + "." + down + ".weight";
  if (!contains(down_key)) return false;
  LoraUpdate u;
  u.key = down_key;
  u.modules = std::move(modules);
  u.down = take(down_key);
  u.up = take(base + "." + up + ".weight");
  if (!bias_key.empty()) {
    if (auto b = take_optional(bias_key)) u.up_bias = *b;
  }
  XF_CHECK(u.down.dim() == 2 && u.up.dim() == 2, file_.path, ": '", down_key,
           "': LoRA of a non-Linear layer (down ", shape_string(u.down.sizes()),
           ") is not supported");
  const int64_t r = u.down.size(0);
  XF_CHECK(u.up.size(1) == r, file_.path, ": '", base, "': rank mismatch, ", down, " ",
           shape_string(u.down.sizes()), " has rank ", r, " but ", up, " ",
           shape_string(u.up.sizes()), " has ", u.up.size(1));
  if (auto alpha = take_optional(base + ".alpha")) {
    XF_CHECK(alpha->numel() == 1, file_.path, ": '", base, ".alpha' is not one value");
    u.factor = alpha->to(at::kDouble).item<double>() / static_cast<double>(r);
  }
  adapter.components[component].push_back(std::move(u));
  return true;
}

std::vector<std::string> LoraKeys::remaining() const {
  std::vector<std::string> out;
  for (const auto& [key, t] : file_.tensors) {
    if (!taken_.count(key)) out.push_back(key);
  }
  return out;
}

void LoraKeys::finish(const std::string& layout) const {
  const auto left = remaining();
  if (left.empty()) return;
  std::ostringstream os;
  for (size_t i = 0; i < left.size() && i < 8; ++i) os << "\n    " << left[i];
  if (left.size() > 8) os << "\n    ... (" << left.size() - 8 << " more)";
  XF_THROW(file_.path, ": ", left.size(), " key(s) of the ", layout,
           " layout match no layer xfuser knows:", os.str());
}

LoraSpec parse_lora_spec(const std::string& text, const std::string& flag) {
  LoraSpec spec;
  spec.path = text;
  const size_t colon = text.rfind(':');
  if (colon != std::string::npos && colon + 1 < text.size()) {
    const std::string tail = text.substr(colon + 1);
    char* end = nullptr;
    const double v = std::strtod(tail.c_str(), &end);
    if (end && *end == '\0') {
      XF_CHECK(std::isfinite(v), flag, " ", text, ": the scale must be a finite number");
      spec.path = text.substr(0, colon);
      spec.scale = v;
    }
  }
  XF_CHECK(!spec.path.empty(), flag, " '", text, "': give PATH or PATH:SCALE");
  return spec;
}

LoraAdapter read_lora_adapter(const LoraSpec& spec, const std::vector<LoraLayout>& layouts) {
  XF_CONTEXT("reading the LoRA adapter ", spec.path);
  const LoraFile file = read_lora_file(spec.path);
  refuse_other_kinds(file);
  LoraAdapter adapter;
  adapter.path = spec.path;
  adapter.name = spec.name.empty() ? std::filesystem::path(spec.path).stem().string() : spec.name;
  for (const auto& layout : layouts) {
    if (layout.matches(file)) {
      adapter.layout = layout.name;
      layout.convert(file, adapter);
      break;
    }
  }
  if (adapter.layout.empty()) {
    if (!is_peft_layout(file)) {
      std::string known = "diffusers / PEFT (lora_A / lora_B)";
      for (const auto& l : layouts) known += ", " + l.name;
      XF_THROW(spec.path, ": not a LoRA layout xfuser reads for this model (first key '",
               file.tensors.begin()->first, "'); it reads: ", known);
    }
    adapter.layout = "diffusers";
    convert_peft(file, adapter);
  }
  XF_CHECK(!adapter.components.empty(), spec.path, ": the adapter adapts no layer");
  return adapter;
}

std::map<std::string, std::vector<LoraBranch>> plan_lora(Module& module, const ComponentLora& lora,
                                                         bool partial) {
  std::map<std::string, ParamSlot*> slots;
  for (auto& [name, slot] : module.named_parameters()) slots.emplace(name, slot);
  // transformers 5 saves CLIP text models without "text_model."; an adapter may name the layer
  // either way (PEFT names it by the module path of the model it was trained on).
  auto resolve = [&](const std::string& name) -> ParamSlot* {
    auto it = slots.find(name);
    if (it != slots.end()) return it->second;
    it = slots.find("text_model." + name);
    return it == slots.end() ? nullptr : it->second;
  };
  auto resolved_name = [&](const std::string& name) {
    return slots.count(name) ? name : "text_model." + name;
  };
  std::map<std::string, std::vector<LoraBranch>> plan;
  for (const auto& e : lora.entries) {
    const LoraUpdate& u = *e.update;
    const std::string& file = e.adapter->path;
    int64_t row = 0;
    std::vector<std::pair<std::string, int64_t>> targets;  // (weight name, rows)
    bool missing = false;
    for (const auto& m : u.modules) {
      ParamSlot* w = resolve(m + ".weight");
      if (!w) {
        XF_CHECK(partial, file, ": key '", u.key, "' adapts '", lora.component, ".", m,
                 "', which the model (", lora.component, ") does not have");
        missing = true;
        break;
      }
      XF_CHECK(w->layer == LayerKind::kLinear && w->stored_shape().size() == 2, file, ": key '",
               u.key, "' adapts '", lora.component, ".", m,
               "', which is not a Linear layer; LoRA adapts Linear layers only");
      const auto shape = w->stored_shape();
      XF_CHECK(shape[1] == u.down.size(1), file, ": key '", u.key, "' does not fit '",
               lora.component, ".", m, "': the layer takes ", shape[1], " features, lora_A ",
               shape_string(u.down.sizes()), " takes ", u.down.size(1));
      targets.emplace_back(resolved_name(m + ".weight"), shape[0]);
      row += shape[0];
    }
    if (missing) continue;
    XF_CHECK(row == u.up.size(0), file, ": key '", u.key, "' does not fit: lora_B ",
             shape_string(u.up.sizes()), " has ", u.up.size(0), " output rows but ",
             u.modules.size() == 1 ? "the layer has " : "the layers together have ", row, " (",
             lora.component, ".", u.modules.front(), u.modules.size() > 1 ? ", ..." : "", ")");
    int64_t offset = 0;
    for (const auto& [name, rows] : targets) {
      LoraBranch b;
      b.adapter = e.adapter->name;
      b.key = u.key;
      b.down = u.down;
      b.up = u.up.narrow(0, offset, rows);
      b.factor = u.factor;
      b.scale = e.scale;
      if (u.up_bias.defined()) {
        b.up_bias = u.up_bias.narrow(0, offset, rows);
        const std::string bias = name.substr(0, name.size() - 6) + "bias";
        XF_CHECK(slots.count(bias), file, ": key '", u.key, "' has a lora_B bias but '",
                 lora.component, ".", name.substr(0, name.size() - 7), "' has no bias");
        if (lora.fused) plan[bias].push_back(b);
      }
      plan[name].push_back(std::move(b));
      offset += rows;
    }
  }
  return plan;
}

std::unique_ptr<TensorSource> make_lora_fused_source(
    const TensorSource& base, const std::string& prefix,
    const std::map<std::string, std::vector<LoraBranch>>& plan) {
  for (const auto& [name, branches] : plan) {
    if (!base.contains(prefix + name)) continue;  // reported as missing by the load
    const auto info = base.info(prefix + name);
    XF_CHECK(info.dtype_name.rfind("F8", 0) != 0, base.describe(), ": ", prefix + name,
             " is stored in ", info.dtype_name, " with its own scales; fusing the adapter '",
             branches.front().adapter,
             "' into it would round the update to fp8. Use --lora_mode unfused (the adapter runs "
             "beside the fp8 weight)");
  }
  return std::make_unique<FusedSource>(base, prefix, plan);
}

void attach_lora(Module& module, const std::map<std::string, std::vector<LoraBranch>>& plan,
                 c10::ScalarType dtype, c10::Device device) {
  std::map<std::string, ParamSlot*> slots;
  for (auto& [name, slot] : module.named_parameters()) slots.emplace(name, slot);
  for (const auto& [name, branches] : plan) {
    ParamSlot* slot = slots.at(name);
    slot->lora.clear();
    for (LoraBranch b : branches) {
      if (slot->shard) {
        // Sliced as the weight: a column-parallel part takes its rows of B (and of B's bias); a
        // row-parallel part its columns of A, and B's bias is added by part 0 only (the parts'
        // outputs are summed).
        const ParamShard& sh = *slot->shard;
        if (sh.dim == 0) {
          b.up = take_part(b.up, sh);
          if (b.up_bias.defined()) b.up_bias = take_part(b.up_bias, sh);
        } else {
          b.down = take_part(b.down, sh);
          if (b.up_bias.defined() && sh.part != 0) b.up_bias = at::Tensor();
        }
      }
      b.down = b.down.to(device, dtype).contiguous();
      b.up = b.up.to(device, dtype).contiguous();
      if (b.up_bias.defined()) b.up_bias = b.up_bias.to(device, dtype).contiguous();
      slot->lora.push_back(std::move(b));
    }
  }
}

at::Tensor add_lora(const at::Tensor& x, at::Tensor y, const std::vector<LoraBranch>& branches) {
  for (const auto& b : branches) {
    const double w = b.weight();
    if (w == 0.0) continue;
    const at::Tensor down = b.down.device() == x.device() ? b.down : b.down.to(x.device());
    const at::Tensor up = b.up.device() == x.device() ? b.up : b.up.to(x.device());
    at::Tensor bias = b.up_bias;
    if (bias.defined() && bias.device() != x.device()) bias = bias.to(x.device());
    const at::Tensor h = linear(linear(x, down, at::Tensor()), up, bias);
    y = y + h * w;
  }
  return y;
}

}  // namespace xfuser::models
