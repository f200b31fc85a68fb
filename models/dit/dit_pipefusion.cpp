#include "models/dit/dit_pipefusion.h"

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>

#include <ATen/ATen.h>

#include "backends/error.h"
#include "parallel/process_groups.h"
#include "parallel/sequence_shard.h"

namespace xfuser::models::dit {

namespace {

int64_t numel(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

std::vector<int64_t> parameters_per_block(
    const Module& model, const std::vector<std::pair<std::string, int64_t>>& prefixes_and_counts) {
  int64_t total = 0;
  for (const auto& [prefix, count] : prefixes_and_counts) total += count;
  std::vector<int64_t> out(total, 0);
  for (const auto& [name, slot] : model.named_parameters()) {
    int64_t offset = 0;
    for (const auto& [prefix, count] : prefixes_and_counts) {
      if (starts_with(name, prefix)) {
        const auto index = std::stoll(name.substr(prefix.size()));  // "3.attn..." -> 3
        XF_CHECK(index >= 0 && index < count, "parameter ", name, " is outside the ", count,
                 " blocks of ", prefix);
        out[offset + index] += numel(slot->shape);
        break;
      }
      offset += count;
    }
  }
  return out;
}

int64_t parameters_with_prefix(const Module& model, const std::vector<std::string>& prefixes) {
  int64_t out = 0;
  for (const auto& [name, slot] : model.named_parameters()) {
    for (const auto& prefix : prefixes) {
      if (starts_with(name, prefix)) {
        out += numel(slot->shape);
        break;
      }
    }
  }
  return out;
}

std::vector<int64_t> balanced_stage_layers(const std::vector<int64_t>& costs, int stages,
                                           int64_t first_extra, int64_t last_extra) {
  const int64_t n = static_cast<int64_t>(costs.size());
  XF_CHECK(stages >= 1 && stages <= n, "balanced_stage_layers: ", stages, " stages for ", n,
           " blocks");
  std::vector<int64_t> prefix(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  // best[s][k]: the smallest largest-stage cost of stages 0..s covering blocks [0, k).
  std::vector<std::vector<int64_t>> best(stages, std::vector<int64_t>(n + 1, kInf));
  std::vector<std::vector<int64_t>> from(stages, std::vector<int64_t>(n + 1, -1));
  for (int s = 0; s < stages; ++s) {
    const int64_t extra = (s == 0 ? first_extra : 0) + (s + 1 == stages ? last_extra : 0);
    for (int64_t k = s + 1; k <= n; ++k) {
      for (int64_t j = s; j < k; ++j) {  // stage s holds blocks [j, k)
        const int64_t before = s == 0 ? (j == 0 ? 0 : kInf) : best[s - 1][j];
        if (before == kInf) continue;
        const int64_t cost = std::max(before, prefix[k] - prefix[j] + extra);
        if (cost < best[s][k]) {
          best[s][k] = cost;
          from[s][k] = j;
        }
      }
    }
  }
  std::vector<int64_t> counts(stages);
  int64_t k = n;
  for (int s = stages - 1; s >= 0; --s) {
    const int64_t j = from[s][k];
    counts[s] = k - j;
    k = j;
  }
  return counts;
}

std::vector<int64_t> pipefusion_stage_layers(const std::vector<int64_t>& block_parameters,
                                             const std::vector<int64_t>& other_parameters,
                                             int stages,
                                             const std::vector<int64_t>& explicit_counts,
                                             const std::string& blocks_what) {
  const int64_t total_blocks = static_cast<int64_t>(block_parameters.size());
  const std::string what = blocks_what.empty() ? "" : " (" + blocks_what + ")";
  XF_CHECK(stages >= 1, "--pipefusion_parallel_degree must be >= 1 (got ", stages, ")");
  XF_CHECK(stages <= total_blocks, "--pipefusion_parallel_degree ", stages, " exceeds the ",
           total_blocks, " transformer blocks of the model (each stage needs at least one)");
  if (explicit_counts.empty()) {
    const int64_t first = other_parameters.empty() ? 0 : other_parameters.front();
    const int64_t last = other_parameters.size() < 2 ? 0 : other_parameters.back();
    return balanced_stage_layers(block_parameters, stages, first, last);
  }
  std::string given;
  for (auto c : explicit_counts) given += (given.empty() ? "" : ",") + std::to_string(c);
  XF_CHECK(static_cast<int>(explicit_counts.size()) == stages, "--pipefusion_layers ", given,
           " gives ", explicit_counts.size(), " stage(s); --pipefusion_parallel_degree is ",
           stages);
  for (auto c : explicit_counts) {
    XF_CHECK(c >= 1, "--pipefusion_layers ", given, ": every stage needs at least one block");
  }
  const int64_t sum = std::accumulate(explicit_counts.begin(), explicit_counts.end(), int64_t{0});
  XF_CHECK(sum == total_blocks, "--pipefusion_layers ", given, " sums to ", sum, "; the model has ",
           total_blocks, " transformer blocks", what);
  return explicit_counts;
}

std::vector<int64_t> pipefusion_stage_layers(const DiTTransformer& model, int stages,
                                             const std::vector<int64_t>& explicit_counts,
                                             const std::string& blocks_what) {
  return pipefusion_stage_layers(model.block_parameters(), model.other_parameters(), stages,
                                 explicit_counts, blocks_what);
}

DiTPart pipefusion_stage_part(const std::vector<int64_t>& stage_layers, int stage) {
  XF_CHECK(stage >= 0 && stage < static_cast<int>(stage_layers.size()), "pipeline stage ", stage,
           " of ", stage_layers.size());
  DiTPart part;
  part.block_begin =
      std::accumulate(stage_layers.begin(), stage_layers.begin() + stage, int64_t{0});
  part.block_end = part.block_begin + stage_layers[stage];
  part.embedders = stage == 0;
  part.head = stage + 1 == static_cast<int>(stage_layers.size());
  return part;
}

std::vector<std::pair<int64_t, int64_t>> pipefusion_patch_rows(int64_t rows, int patches) {
  XF_CHECK(patches >= 1 && patches <= rows, "--num_pipeline_patch ", patches,
           " must be between 1 and the ", rows, " latent token rows of the image");
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t begin = 0;
  for (int p = 0; p < patches; ++p) {
    const int64_t n = rows / patches + (p < rows % patches ? 1 : 0);
    out.emplace_back(begin, begin + n);
    begin += n;
  }
  return out;
}

double image_psnr(const at::Tensor& a, const at::Tensor& b) {
  XF_CHECK(a.sizes() == b.sizes(), "image_psnr: shapes differ: ", shape_string(a.sizes()), " vs ",
           shape_string(b.sizes()));
  const double mse = (a.to(at::kDouble) - b.to(at::kDouble)).pow(2).mean().item<double>();
  if (mse == 0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(255.0 * 255.0 / mse);
}

// One patch of one step as this rank sees it.
struct PipeFusion::Patch {
  int64_t begin = 0;   // first image token of the patch
  int64_t tokens = 0;  // generated tokens of the patch
  int64_t refs = 0;    // reference tokens that follow them (the same in every patch)
  std::unique_ptr<parallel::SequenceShard> shard;  // [patch, references] over the sp group
  parallel::TextMode text_mode = parallel::TextMode::kSplit;
  int64_t local_text = 0;  // text rows in this rank's sequence
};

PipeFusion::PipeFusion(DiTTransformer& model, const parallel::ProcessGroups& groups,
                       int64_t token_rows, int64_t token_cols, int patches, int warmup_steps,
                       int num_steps)
    : model_(model),
      groups_(groups),
      rows_(token_rows),
      cols_(token_cols),
      patches_(patches),
      warmup_steps_(warmup_steps),
      num_steps_(num_steps),
      stage_(groups.coords().pp),
      stages_(groups.config().pp()) {
  pipefusion_patch_rows(rows_, patches_);  // validates the patch count
  XF_CHECK(patches_ == 1 || warmup_steps_ >= 1, "--pipefusion_warmup_steps must be >= 1 with ",
           patches_, " pipeline patches (the warm-up fills the stale K/V buffers)");
  const auto& part = model_.part();
  XF_CHECK(part.embedders == (stage_ == 0) && part.head == (stage_ + 1 == stages_),
           "PipeFusion: ", model_.class_name(), " part (blocks [", part.block_begin, ", ",
           part.block_end, ")) does not match pipeline stage ", stage_, " of ", stages_);
  // NCCL has no tags and runs a communicator's operations in order on one stream: stage 0's
  // prefetched latent receives would queue ahead of its activation sends. The latents get their
  // own communicator (a duplicate of the pp group, collective over it) there; MPI matches them
  // by tag on the pp group itself.
  auto& pp = groups_.pp();
  if (stages_ > 1 && pp.backend() != "mpi") {
    latent_comm_ = pp.split(0, pp.rank(), pp.name() + "/latents");
  }
}

PipeFusion::~PipeFusion() {
  // Normal completion leaves nothing pending; after an error the job is aborted anyway, and a
  // dropped Work keeps its buffers alive (parallel/mpi_communicator.cpp).
  model_.set_attention_hook({});
}

void PipeFusion::wait_sends() {
  for (auto& s : sends_) s.work->wait();
  sends_.clear();
}

at::Tensor PipeFusion::attend(const Patch& patch, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, const AttentionCall& call) {
  // Cross-attention reads the (whole, uncached) text only.
  if (call.cross) return local_attention(q, k, v, call);
  // q, k, v [B, T + c, H, hd]: this rank's text rows T (none for image-only attention) and its
  // band c of the patch, text first or last as the family orders them.
  const int64_t t = call.text_tokens;
  XF_CHECK((t == 0 || t == patch.local_text) && !call.mask.defined(),
           "PipeFusion attention expects the stage's ", patch.local_text,
           " text rows (or none) and no mask (layer ", call.layer, ", ", t, " text rows)");
  const bool text_first = call.text_first;
  const int sp = groups_.config().sp();
  const int64_t image_rows = patch.tokens + patch.refs;
  at::Tensor text_kv, image_kv;  // [2, B, L, H, hd], [2, B, n + R, H, hd]
  if (sp == 1) {
    auto kv = at::stack({k, v});  // [2, B, T + n + R, H, hd]
    text_kv = kv.narrow(2, text_first ? 0 : image_rows, t);
    image_kv = kv.narrow(2, text_first ? t : 0, image_rows);
  } else {
    // Every sp rank's fresh K/V of the patch: [sp, 2, B, T + c, H, hd].
    auto all = groups_.sp().all_gather(at::stack({k, v}).unsqueeze(0).contiguous(), 0);
    const int64_t chunk = patch.shard->chunk();
    std::vector<at::Tensor> texts, images;
    for (int r = 0; r < sp; ++r) {
      if (t > 0 && (patch.text_mode == parallel::TextMode::kSplit || r == 0)) {
        texts.push_back(all[r].narrow(2, text_first ? 0 : chunk, t));
      }
      images.push_back(all[r].narrow(2, text_first ? t : 0, patch.shard->valid(r)));
    }
    if (!texts.empty()) text_kv = at::cat(texts, 2);
    image_kv = at::cat(images, 2);
  }
  at::Tensor& buffer = kv_[call.layer];
  const int64_t b = k.size(0), heads = k.size(2), hd = k.size(3);
  if (!buffer.defined() || buffer.size(1) != b || buffer.scalar_type() != k.scalar_type()) {
    buffer = at::zeros({2, b, rows_ * cols_, heads, hd}, k.options());
  }
  // Fresh rows of this patch; the reference tokens' K/V (fresh, never cached) follow the buffer.
  buffer.narrow(2, patch.begin, patch.tokens).copy_(image_kv.narrow(2, 0, patch.tokens));
  const at::Tensor image =
      patch.refs > 0 ? at::cat({buffer, image_kv.narrow(2, patch.tokens, patch.refs)}, 2) : buffer;
  if (!text_kv.defined() || text_kv.size(2) == 0) {
    return local_attention(q, image[0], image[1], call);
  }
  auto join = [text_first](const at::Tensor& text, const at::Tensor& image) {
    return text_first ? at::cat({text, image}, 1) : at::cat({image, text}, 1);
  };
  return local_attention(q, join(text_kv[0], image[0]), join(text_kv[1], image[1]), call);
}

void PipeFusion::step(int index, const DiTInputs& in, int branches, const CombineFn& combine,
                      const StepFn& step_fn, at::Tensor& latents) {
  XF_CONTEXT("PipeFusion stage ", stage_, "/", stages_, ", step ", index);
  XF_CHECK(index >= 0 && index < num_steps_, "PipeFusion step ", index, " of ", num_steps_);
  const bool first = stage_ == 0, last = stage_ + 1 == stages_;
  auto& pp = groups_.pp();
  const int sp = groups_.config().sp(), sp_rank = groups_.coords().sp;
  if (!latents.is_contiguous()) latents = latents.contiguous();
  if (latent_comm_ && !latent_path_connected_) {
    // NCCL connects two ranks on their first point-to-point operation, and each host waits in it
    // until the other posts its side. Stage 0 posts its first latent receive (from the last
    // stage) before it sends any activations, while the last stage sends latents only after
    // activations arrived: left to the first real operation, that is a deadlock. The two connect
    // here, both ways in one group, before anything else moves.
    if (first || last) {
      const int peer = first ? stages_ - 1 : 0;
      at::Tensor out = at::zeros({1}, latents.options()), in = at::empty({1}, latents.options());
      latent_comm_
          ->batch_p2p({parallel::P2POp::send(out, peer, parallel::Tag::kPipeLatent),
                       parallel::P2POp::recv(in, peer, parallel::Tag::kPipeLatent)})
          ->wait();
    }
    latent_path_connected_ = true;
  }
  const int64_t batch = latents.size(0), channels = latents.size(2);
  const bool cross = model_.text_attention() == TextAttention::kCross;
  const bool text_first = model_.text_attention() == TextAttention::kJointTextFirst;
  const int64_t text_len = model_.text_tokens(in);
  const int64_t model_batch = in.text.size(0);
  const int64_t dim = model_.hidden_size();
  const auto dtype = model_.dtype();
  // Cross-attention families keep the whole text on every rank (it never joins the sequence).
  const auto text_mode = cross || model_.text_whole() ? parallel::TextMode::kReplicated
                                                      : parallel::choose_text_mode(text_len, sp);
  const int64_t local_text = parallel::local_text_tokens(text_mode, text_len, sp);
  const int64_t sent_text = cross ? 0 : local_text;  // text rows travelling between stages
  // Per-token conditioning channels (HunyuanVideo-1.5's image-condition latents and mask): the
  // channels of in.tokens past the latents' are appended to every patch's latents.
  const int64_t cond_channels = in.tokens.defined() ? in.tokens.size(2) - channels : 0;
  XF_CHECK(cond_channels >= 0, "PipeFusion: tokens have ", in.tokens.size(2),
           " channels, fewer than the latents' ", channels);
  // Reference tokens (input pictures): the last refs rows of in.tokens / in.token_ids.
  const int64_t refs = in.reference_tokens, image_tokens = rows_ * cols_;
  at::Tensor ref_tokens, ref_ids;
  if (refs > 0) {
    XF_CHECK(!cross, "PipeFusion: reference tokens need a joint-attention family, ",
             model_.class_name(), " uses cross-attention");
    XF_CHECK(in.tokens.defined() && in.tokens.dim() == 3 &&
                 in.tokens.size(1) == image_tokens + refs && in.tokens.size(0) == model_batch,
             "PipeFusion: ", refs, " reference tokens need tokens [", model_batch, ", ",
             image_tokens + refs, ", C] (generated, then reference), got ",
             in.tokens.defined() ? shape_string(in.tokens.sizes()) : std::string("none"));
    XF_CHECK(in.token_ids.size(0) == image_tokens + refs, "PipeFusion: token_ids has ",
             in.token_ids.size(0), " rows, expected ", image_tokens, " generated + ", refs,
             " reference");
    ref_tokens = in.tokens.narrow(1, image_tokens, refs);
    ref_ids = in.token_ids.narrow(0, image_tokens, refs);
  }

  // Warm-up steps run the whole image as one patch.
  const auto ranges = pipefusion_patch_rows(rows_, index < warmup_steps_ ? 1 : patches_);
  std::vector<Patch> patches(ranges.size());
  for (size_t p = 0; p < ranges.size(); ++p) {
    auto& pt = patches[p];
    pt.begin = ranges[p].first * cols_;
    pt.tokens = (ranges[p].second - ranges[p].first) * cols_;
    pt.refs = refs;
    pt.shard = std::make_unique<parallel::SequenceShard>(pt.tokens + refs, sp);
    pt.text_mode = text_mode;
    pt.local_text = local_text;
  }

  // Activations (stages > 0) travel one patch ahead: the receive of patch p + 1 from stage s - 1
  // is posted in one batch_p2p with the send of patch p to stage s + 1, and the last stage (which
  // sends no activations) posts it once patch p's has arrived. On NCCL a group progresses its
  // operations together, so no receive queued on the stream blocks this stage's own send.
  std::vector<at::Tensor> act_in(patches.size());
  auto act_recv = [&](size_t p) {
    act_in[p] = at::empty({model_batch, sent_text + patches[p].shard->chunk(), dim},
                          latents.options().dtype(dtype));
    return parallel::P2POp::recv(act_in[p], stage_ - 1, parallel::Tag::kPipeActivation);
  };
  std::unique_ptr<parallel::Work> act_pending;  // brings act_in of the next patch
  if (!first) act_pending = pp.batch_p2p({act_recv(0)});
  // Stage 0 prefetches every latent patch of the next step (from the last stage).
  auto& latent_comm = latent_comm_ ? *latent_comm_ : pp;
  std::deque<Pending> next_latents;
  if (first && index + 1 < num_steps_) {
    for (const auto& pt : patches) {
      Pending r;
      r.begin = pt.begin;
      r.end = pt.begin + pt.tokens;
      r.buffer = at::empty({batch, pt.tokens, channels}, latents.options());
      r.work = latent_comm.irecv(r.buffer, stages_ - 1, parallel::Tag::kPipeLatent);
      next_latents.push_back(std::move(r));
    }
  }

  const auto& part = model_.part();
  const bool joined_in = model_.joined_at(part.block_begin);
  DiTInputs text_in = in;
  if (!cross && text_mode == parallel::TextMode::kSplit && sp > 1) {
    parallel::SequenceShard text(text_len, sp);
    text_in.text = text.shard(in.text, 1, sp_rank);
    if (in.text_ids.defined()) text_in.text_ids = text.shard(in.text_ids, 0, sp_rank);
    if (in.text_mask.defined()) text_in.text_mask = text.shard(in.text_mask, 1, sp_rank);
  }

  for (size_t p = 0; p < patches.size(); ++p) {
    XF_CONTEXT("patch ", p, "/", patches.size());
    const Patch& pt = patches[p];
    DiTInputs local = text_in;
    at::Tensor ids = in.token_ids.narrow(0, pt.begin, pt.tokens);
    if (refs > 0) ids = at::cat({ids, ref_ids}, 0);
    local.token_ids = pt.shard->shard(ids, 0, sp_rank);
    if (first) {
      // The latents of this patch from the previous step (already here at step 0).
      while (!latents_in_.empty() && latents_in_.front().begin < pt.begin + pt.tokens) {
        auto& r = latents_in_.front();
        r.work->wait();
        latents.narrow(1, r.begin, r.end - r.begin).copy_(r.buffer);
        latents_in_.pop_front();
      }
      auto x = latents.narrow(1, pt.begin, pt.tokens).repeat({branches, 1, 1});  // [B', n, C]
      if (cond_channels > 0) {
        x = at::cat({x, in.tokens.narrow(1, pt.begin, pt.tokens)
                            .narrow(2, channels, cond_channels)
                            .to(x.scalar_type())},
                    2);
      }
      if (refs > 0) x = at::cat({x, ref_tokens.to(x.scalar_type())}, 1);  // [B', n + R, C]
      local.tokens = pt.shard->shard(x, 1, sp_rank);
    }
    DiTActivations st = model_.embed(local);
    if (!first) {
      act_pending->wait();  // patch p's activations (and the send of patch p - 1)
      act_pending.reset();
      if (last && p + 1 < patches.size()) act_pending = pp.batch_p2p({act_recv(p + 1)});
      const at::Tensor& buffer = act_in[p];
      const int64_t c = pt.shard->chunk();
      if (joined_in) {
        st.hidden = buffer;  // [B', T + c, D] joint sequence
        st.joined = true;
      } else if (cross) {
        st.hidden = buffer;  // [B', c, D]; the text stream comes from this stage's embed
      } else {
        st.context = buffer.narrow(1, text_first ? 0 : c, local_text);
        st.hidden = buffer.narrow(1, text_first ? local_text : 0, c);
      }
    }
    model_.set_attention_hook(
        [this, &pt](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const AttentionCall& call) { return attend(pt, q, k, v, call); });
    model_.run_blocks(st, part.block_begin, part.block_end);
    model_.set_attention_hook({});
    if (!last) {
      Pending s;
      if (st.joined || cross) {
        s.buffer = st.hidden.contiguous();
      } else {
        s.buffer =
            (text_first ? at::cat({st.context, st.hidden}, 1) : at::cat({st.hidden, st.context}, 1))
                .contiguous();
      }
      std::vector<parallel::P2POp> ops{
          parallel::P2POp::send(s.buffer, stage_ + 1, parallel::Tag::kPipeActivation)};
      const bool more = !first && p + 1 < patches.size();
      if (more) ops.push_back(act_recv(p + 1));
      auto exchange = pp.batch_p2p(std::move(ops));
      if (more) {
        act_pending = std::move(exchange);  // waited for before patch p + 1
      } else {
        s.work = std::move(exchange);
        sends_.push_back(std::move(s));
      }
      continue;
    }
    at::Tensor out = model_.finalize(st).contiguous();         // [B', c, C]
    if (sp > 1) out = pt.shard->gather(out, 1, groups_.sp());  // [B', n + R, C]
    if (refs > 0) out = out.narrow(1, 0, pt.tokens);           // the references' are dropped
    auto rows = latents.narrow(1, pt.begin, pt.tokens);
    // The step gets a copy: rows is overwritten below, and a multistep scheduler keeps its
    // sample (UniPC's last_sample) for the next step's corrector.
    rows.copy_(
        step_fn(combine(out), rows.clone(), {pt.begin, pt.begin + pt.tokens, rows_ * cols_}));
    if (index + 1 < num_steps_) {
      Pending s;
      s.buffer = rows.contiguous();
      s.work = latent_comm.isend(s.buffer, 0, parallel::Tag::kPipeLatent);
      sends_.push_back(std::move(s));
    }
  }
  wait_sends();
  latents_in_ = std::move(next_latents);
  if (index + 1 == num_steps_) pp.broadcast(latents, stages_ - 1);
}

}  // namespace xfuser::models::dit
