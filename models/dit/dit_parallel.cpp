#include "models/dit/dit_parallel.h"

#include <regex>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "backends/error.h"
#include "models/dit/step_cache.h"
#include "models/weights/component_folder.h"
#include "parallel/process_groups.h"
#include "parallel/sequence_shard.h"
#include "parallel/usp_attention.h"

namespace xfuser::models::dit {
namespace {

const DiTFactory& factory_for(const ComponentFolder& folder) {
  register_builtin_components();
  const DiTFactory* factory = DiTRegistry::find(folder.class_name);
  if (factory == nullptr) {
    std::string known;
    for (const auto& name : DiTRegistry::known_classes())
      known += (known.empty() ? "" : ", ") + name;
    XF_THROW(folder.config_path, ": '", folder.class_name,
             "' is not a diffusion transformer xfuser knows; known: ", known);
  }
  return *factory;
}

// The sequence-parallel slice of a per-token input [.., N, ..] along `dim` (undefined stays).
at::Tensor shard_or_keep(const parallel::SequenceShard& shard, const at::Tensor& t, int64_t dim,
                         int rank) {
  return t.defined() ? shard.shard(t, dim, rank) : t;
}

}  // namespace

TensorParallelOps tensor_parallel_ops(parallel::Communicator& tp) {
  TensorParallelOps ops;
  ops.all_reduce = [&tp](at::Tensor& t) { tp.all_reduce(t); };
  ops.all_gather_last = [&tp](const at::Tensor& t) { return tp.all_gather(t, t.dim() - 1); };
  return ops;
}

std::shared_ptr<DiTTransformer> load_dit_transformer(
    const std::string& dir, c10::ScalarType dtype, const parallel::ProcessGroups* groups,
    const DiTPart& part, const std::string& expected_class, c10::Device device,
    const WeightFormat& weights, int row_part, int row_parts,
    std::shared_ptr<const ComponentLora> lora) {
  ComponentFolder folder = open_component_folder(dir);
  XF_CONTEXT("loading ", folder.class_name, " from ", dir);
  XF_CHECK(expected_class.empty() || folder.class_name == expected_class, dir, " holds a ",
           folder.class_name, ", expected ", expected_class);
  TensorParallel tp;
  if (groups) tp = TensorParallel{groups->coords().tp, groups->config().tp()};
  auto model = factory_for(folder)(folder.config, folder.config_path, part, tp);
  const bool whole = model->part().block_begin == 0 &&
                     model->part().block_end == model->num_blocks() && model->part().embedders &&
                     model->part().head;
  XF_CHECK(weights.kind != WeightFormat::Kind::kFp8Scaled || tp.size == 1,
           "--use_fp8_gemms with --tensor_parallel_degree ", tp.size,
           " is not supported yet: a row-parallel layer would scale each rank's part of a row on "
           "its own; use sequence, CFG, data or PipeFusion parallelism with FP8 GEMMs");
  XF_CHECK(row_parts <= 1 || tp.size == 1, "--use_fsdp with --tensor_parallel_degree ", tp.size,
           " is not supported: FSDP shards whole weights; use Ulysses, ring or CFG parallelism "
           "with FSDP");
  LoadOptions options;
  options.row_part = row_part;
  options.row_parts = row_parts;
  // A pipeline stage reads only its own tensors from the (memory-mapped) checkpoint.
  options.allow_unexpected = !whole;
  options.device = device;
  options.weight_format = dit_weight_format(*model, weights);
  options.lora = std::move(lora);
  if (options.lora && !whole) {
    // A stage holds some blocks only: check the adapters against the whole model first.
    auto all = factory_for(folder)(folder.config, folder.config_path, DiTPart{}, TensorParallel{});
    plan_lora(*all, *options.lora, /*partial=*/false);
  }
  model->load(*folder.weights, dtype, "", options);
  if (tp.size > 1) model->set_tensor_parallel_ops(tensor_parallel_ops(groups->tp()));
  return model;
}

WeightFormat dit_weight_format(const DiTTransformer& model, const WeightFormat& kind_and_format) {
  WeightFormat out = kind_and_format;
  switch (out.kind) {
    case WeightFormat::Kind::kAsLoaded:
      out.selects = nullptr;
      break;
    case WeightFormat::Kind::kFp8Storage: {
      std::vector<std::regex> skip;
      for (const char* p : {"pos_embed", "patch_embed", "norm", "^proj_in$", "^proj_out$"}) {
        skip.emplace_back(p);
      }
      for (const auto& p : model.layerwise_casting_skip_patterns()) skip.emplace_back(p);
      out.selects = [skip](const std::string& name) {
        // diffusers tests each enclosing module's name from the outside in and stops at the
        // first match; the parameter's own attribute name (after the last dot) is not tested.
        const size_t leaf = name.rfind('.');
        if (leaf == std::string::npos) return true;
        size_t dot = name.find('.');
        while (true) {
          const std::string module = name.substr(0, dot);
          for (const auto& re : skip) {
            if (std::regex_search(module, re)) return false;
          }
          if (dot >= leaf) return true;
          dot = name.find('.', dot + 1);
        }
      };
      break;
    }
    case WeightFormat::Kind::kFp8Scaled: {
      const auto prefixes = model.block_list_prefixes();
      out.selects = [prefixes](const std::string& name) {
        for (const auto& p : prefixes) {
          if (name.compare(0, p.size(), p) == 0) return true;
        }
        return false;
      };
      break;
    }
  }
  return out;
}

std::shared_ptr<DiTTransformer> describe_dit_transformer(const std::string& dir) {
  // The config alone: the model declares shapes only (no weights needed).
  ComponentFolder folder = open_component_config(dir);
  return factory_for(folder)(folder.config, folder.config_path, DiTPart{}, TensorParallel{});
}

at::Tensor sequence_parallel_forward(DiTTransformer& model, const DiTInputs& full,
                                     const parallel::ProcessGroups& groups) {
  if (model.tensor_parallel().size > 1) {
    XF_CHECK(model.tensor_parallel().size == groups.config().tp() &&
                 model.tensor_parallel().rank == groups.coords().tp,
             "the model is built for tensor-parallel rank ", model.tensor_parallel().rank, " of ",
             model.tensor_parallel().size, " but this rank is ", groups.coords().tp, " of ",
             groups.config().tp());
    model.set_tensor_parallel_ops(tensor_parallel_ops(groups.tp()));
  } else {
    XF_CHECK(groups.config().tp() == 1, "tensor parallel degree ", groups.config().tp(),
             " needs a model built for it (load_dit_transformer with the process groups)");
  }
  const int parts = groups.config().sp();
  if (parts == 1) return model.forward(full);
  model.check_inputs(full);
  const int rank = groups.coords().sp;
  parallel::SequenceShard image(full.tokens.size(1), parts);
  const int64_t text_len = full.text.defined() ? full.text.size(1) : 0;
  const bool cross = model.text_attention() == TextAttention::kCross;
  // Cross-attention models keep the whole text on every rank; their self-attention has no text.
  // Models that embed the text as a whole (text_whole) keep it replicated in the joint attention.
  const parallel::TextMode mode = cross ? parallel::TextMode::kSplit
                                  : model.text_whole()
                                      ? parallel::TextMode::kReplicated
                                      : parallel::choose_text_mode(text_len, parts);
  DiTInputs in = full;
  in.tokens = image.shard(full.tokens, 1, rank);
  in.token_ids = shard_or_keep(image, full.token_ids, 0, rank);
  if (!cross && mode == parallel::TextMode::kSplit && text_len > 0) {
    parallel::SequenceShard text(text_len, parts);
    in.text = text.shard(full.text, 1, rank);
    in.text_ids = shard_or_keep(text, full.text_ids, 0, rank);
    in.text_mask = shard_or_keep(text, full.text_mask, 1, rank);
  }
  // A block-level step cache measures its metrics on the real rows only.
  if (model.block_cache() != nullptr) model.block_cache()->valid_image_rows = image.valid(rank);
  parallel::UspAttention usp(groups.ulysses(), groups.ring(), mode, image.valid_counts());
  struct HookGuard {
    DiTTransformer& model;
    ~HookGuard() { model.set_attention_hook({}); }
  } guard{model};
  model.set_attention_hook([&usp](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const AttentionCall& call) {
    if (call.cross) return local_attention(q, k, v, call);
    // Masked text keys: the text is whole on every rank (replicated), the image keys all real.
    if (call.text_key_mask.defined() && usp.text_mode() == parallel::TextMode::kReplicated) {
      return usp.attention(q, k, v, call.text_tokens, call.text_first, {}, call.text_key_mask);
    }
    return usp.attention(q, k, v, call.text_tokens, call.text_first, call.mask);
  });
  at::Tensor local = model.forward(in);  // [B, chunk, C]
  return image.gather(local.contiguous(), 1, groups.sp());
}

at::Tensor dit_forward(DiTTransformer& model, const DiTInputs& in,
                       const parallel::ProcessGroups* groups) {
  return groups ? sequence_parallel_forward(model, in, *groups) : model.forward(in);
}

at::Tensor cached_forward(DiTTransformer& model, const DiTInputs& in,
                          const parallel::ProcessGroups* groups, const StepCacheUse& use,
                          const std::string& branch, bool across_cfg) {
  if (use.cache == nullptr) return dit_forward(model, in, groups);
  CacheScope scope;
  if (groups) {
    std::vector<parallel::Communicator*> comms;
    if (groups->config().sp() > 1) comms.push_back(&groups->sp());
    // Tensor-parallel ranks hold the same activations: summing over them scales numerator and
    // denominator alike, and makes the totals (so the decision) bitwise the same on all of them.
    if (groups->config().tp() > 1) comms.push_back(&groups->tp());
    if (across_cfg && groups->config().cfg() > 1) comms.push_back(&groups->cfg());
    if (!comms.empty()) {
      scope.sum = [comms](at::Tensor& t) {
        for (parallel::Communicator* c : comms) c->all_reduce(t);
      };
    }
  }
  return use.cache->evaluate(model, use.model_name, branch, use.step, scope,
                             [&] { return dit_forward(model, in, groups); });
}

DiTInputs concat_branches(const DiTInputs& negative, const DiTInputs& positive) {
  auto cat = [](const at::Tensor& n, const at::Tensor& p) {
    if (!p.defined()) return p;
    return at::cat({n, p}, 0);
  };
  auto repeat = [](const at::Tensor& t) {
    if (!t.defined() || t.size(0) == 1) return t;
    return at::cat({t, t}, 0);
  };
  DiTInputs both = positive;
  // Tokens may be undefined (PipeFusion takes them from the latents).
  if (positive.tokens.defined()) both.tokens = at::cat({positive.tokens, positive.tokens}, 0);
  both.text = cat(negative.text, positive.text);
  both.text_mask = cat(negative.text_mask, positive.text_mask);
  both.pooled = cat(negative.pooled, positive.pooled);
  both.timestep = repeat(positive.timestep);
  both.guidance = repeat(positive.guidance);
  for (auto& [name, t] : both.extra) {
    auto it = negative.extra.find(name);
    t = it != negative.extra.end() ? cat(it->second, t) : repeat(t);
  }
  return both;
}

at::Tensor guided_noise(DiTTransformer& model, const DiTInputs& positive, const DiTInputs& negative,
                        double scale, const parallel::ProcessGroups* groups, bool batched,
                        const StepCacheUse& cache) {
  const int64_t b = positive.tokens.size(0);
  if (groups && groups->config().cfg() == 2) {
    // CFG parallel: cfg rank 0 runs the negative branch, rank 1 the positive one; every rank
    // combines the gathered predictions (and then steps the scheduler identically).
    const bool negative_here = groups->coords().cfg == 0;
    const DiTInputs& mine = negative_here ? negative : positive;
    const std::string branch = batched ? "batch" : negative_here ? "uncond" : "cond";
    at::Tensor out = cached_forward(model, mine, groups, cache, branch, batched).contiguous();
    at::Tensor both = groups->cfg().all_gather(out, 0);  // [neg; pos]
    at::Tensor neg = both.narrow(0, 0, b);
    return neg + scale * (both.narrow(0, b, b) - neg);
  }
  if (batched) {
    at::Tensor both =
        cached_forward(model, concat_branches(negative, positive), groups, cache, "batch");
    at::Tensor neg = both.narrow(0, 0, b);
    return neg + scale * (both.narrow(0, b, b) - neg);
  }
  // diffusers' order: the "cond" context, then "uncond".
  at::Tensor pos = cached_forward(model, positive, groups, cache, "cond");
  at::Tensor neg = cached_forward(model, negative, groups, cache, "uncond");
  return neg + scale * (pos - neg);
}

}  // namespace xfuser::models::dit
