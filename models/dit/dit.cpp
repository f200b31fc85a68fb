#include "models/dit/dit.h"

#include <map>
#include <mutex>

#include <ATen/ATen.h>

#include "backends/error.h"
#include "models/dit/step_cache.h"
#include "profiling/trace.h"

namespace xfuser::models::dit {

at::Tensor DiTTransformer::forward(const DiTInputs& in) const {
  check_inputs(in);
  auto a = embed(in);
  if (block_cache_ != nullptr) {
    // Step caching (models/dit/step_cache.h) works on the whole model (PipeFusion refuses it).
    XF_CHECK(
        part_.block_begin == 0 && part_.block_end == num_blocks() && part_.embedders && part_.head,
        class_name(), ": step caching needs the whole model, this instance holds blocks [",
        part_.block_begin, ", ", part_.block_end, ")");
    block_cache_->run_blocks(*this, a);
  } else {
    run_blocks(a, part_.block_begin, part_.block_end);
  }
  return finalize(a);
}

TensorMap DiTTransformer::call(const std::string& method, const TensorMap& inputs) {
  XF_CHECK(method == "forward", class_name(), " has no method '", method, "' (methods: forward)");
  return forward_outputs(forward(parse_forward_inputs(inputs)), inputs);
}

at::Tensor DiTTransformer::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const AttentionCall& call) const {
  XF_SPAN("attention", "attention");
  return attention_hook_ ? attention_hook_(q, k, v, call) : local_attention(q, k, v, call);
}

at::Tensor DiTTransformer::teacache_input(const DiTActivations& a) const {
  XF_THROW("--cache teacache: ", class_name(),
           " has no TeaCache signal (the published TeaCache models: FLUX.1, FLUX.1-Kontext, "
           "HunyuanVideo)");
}

void DiTTransformer::resolve_part() {
  const int64_t total = num_blocks();
  if (part_.block_end < 0) part_.block_end = total;
  XF_CHECK(
      0 <= part_.block_begin && part_.block_begin <= part_.block_end && part_.block_end <= total,
      class_name(), ": block range [", part_.block_begin, ", ", part_.block_end,
      ") is outside the model's ", total, " blocks");
  XF_CHECK(tp_.size >= 1 && tp_.rank >= 0 && tp_.rank < tp_.size, "tensor-parallel rank ", tp_.rank,
           " of ", tp_.size, " is out of range");
  XF_CHECK(num_heads() % tp_.size == 0, class_name(), ": num_attention_heads ", num_heads(),
           " is not divisible by the tensor parallel degree ", tp_.size,
           " (--tensor_parallel_degree): every rank must hold whole attention heads");
}

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, DiTFactory> factories;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void DiTRegistry::add(const std::string& class_name, DiTFactory factory) {
  XF_CHECK(factory != nullptr, "transformer class '", class_name, "' registered without a factory");
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  XF_CHECK(r.factories.emplace(class_name, std::move(factory)).second, "transformer class '",
           class_name, "' is registered twice");
}

const DiTFactory* DiTRegistry::find(const std::string& class_name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.factories.find(class_name);
  return it == r.factories.end() ? nullptr : &it->second;
}

std::vector<std::string> DiTRegistry::known_classes() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& [name, f] : r.factories) out.push_back(name);
  return out;
}

void register_dit_component(const std::string& class_name, DiTFactory factory) {
  DiTRegistry::add(class_name, factory);
  ComponentRegistry::add(
      class_name, [factory](const nlohmann::json& config, const std::string& config_path) {
        return std::static_pointer_cast<Component>(factory(config, config_path, DiTPart{}, {}));
      });
}

}  // namespace xfuser::models::dit
