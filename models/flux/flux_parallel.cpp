#include "models/flux/flux_parallel.h"

#include <ATen/ATen.h>

#include "backends/error.h"
#include "models/flux/flux_transformer.h"
#include "models/weights/component_folder.h"
#include "parallel/process_groups.h"
#include "parallel/sequence_shard.h"
#include "parallel/usp_attention.h"

namespace xfuser::models::flux {

TensorParallelOps tensor_parallel_ops(parallel::Communicator& tp) {
  TensorParallelOps ops;
  ops.all_reduce = [&tp](at::Tensor& t) { tp.all_reduce(t); };
  ops.all_gather_last = [&tp](const at::Tensor& t) { return tp.all_gather(t, t.dim() - 1); };
  return ops;
}

std::shared_ptr<FluxTransformer2DModel> load_flux_transformer(
    const std::string& dir, c10::ScalarType dtype, const parallel::ProcessGroups* groups) {
  ComponentFolder folder = open_component_folder(dir);
  XF_CONTEXT("loading ", folder.class_name, " from ", dir);
  XF_CHECK(folder.class_name == "FluxTransformer2DModel", dir, " holds a ", folder.class_name,
           ", expected FluxTransformer2DModel");
  TensorParallel tp;
  if (groups) tp = TensorParallel{groups->coords().tp, groups->config().tp()};
  auto model = std::make_shared<FluxTransformer2DModel>(
      FluxConfig::from_json(folder.config, folder.config_path), FluxModelPart{}, tp);
  model->load(*folder.weights, dtype);
  if (tp.size > 1) model->set_tensor_parallel_ops(tensor_parallel_ops(groups->tp()));
  return model;
}

at::Tensor sequence_parallel_forward(FluxTransformer2DModel& model, const FluxInputs& full,
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
             " needs a model built for it (load_flux_transformer with the process groups)");
  }
  const int parts = groups.config().sp();
  if (parts == 1) return model.forward(full);
  model.check_inputs(full);
  const int rank = groups.coords().sp;
  parallel::SequenceShard image(full.hidden_states.size(1), parts);
  const int64_t text_len = full.encoder_hidden_states.size(1);
  const parallel::TextMode mode = parallel::choose_text_mode(text_len, parts);
  FluxInputs in = full;
  in.hidden_states = image.shard(full.hidden_states, 1, rank);
  in.img_ids = image.shard(full.img_ids.dim() == 3 ? full.img_ids[0] : full.img_ids, 0, rank);
  if (mode == parallel::TextMode::kSplit) {
    parallel::SequenceShard text(text_len, parts);
    in.encoder_hidden_states = text.shard(full.encoder_hidden_states, 1, rank);
    in.txt_ids = text.shard(full.txt_ids.dim() == 3 ? full.txt_ids[0] : full.txt_ids, 0, rank);
  }
  parallel::UspAttention usp(groups.ulysses(), groups.ring(), mode, image.valid_counts());
  struct HookGuard {
    FluxTransformer2DModel& model;
    ~HookGuard() { model.set_attention_hook({}); }
  } guard{model};
  model.set_attention_hook([&usp](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const AttentionCall& call) {
    return usp.attention(q, k, v, call.text_tokens, call.text_first, call.mask);
  });
  at::Tensor local = model.forward(in);  // [B, chunk, C]
  return image.gather(local.contiguous(), 1, groups.sp());
}

}  // namespace xfuser::models::flux
