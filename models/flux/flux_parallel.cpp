#include "models/flux/flux_parallel.h"

#include <ATen/ATen.h>

#include "models/flux/flux_transformer.h"
#include "parallel/process_groups.h"
#include "parallel/sequence_shard.h"
#include "parallel/usp_attention.h"

namespace xfuser::models::flux {

at::Tensor sequence_parallel_forward(FluxTransformer2DModel& model, const FluxInputs& full,
                                     const parallel::ProcessGroups& groups) {
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
