#include "parallel/usp_attention.h"

#include <algorithm>
#include <memory>
#include <utility>

#include <ATen/ATen.h>

#include "backends/attention.h"
#include "backends/error.h"

namespace xfuser::parallel {
namespace {

using backends::AttentionOutput;

// Zero heads appended along dim 2 of [B, S, H, D] up to `heads`.
at::Tensor pad_heads(const at::Tensor& x, int64_t heads) {
  if (x.size(2) == heads) return x;
  return at::constant_pad_nd(x, {0, 0, 0, heads - x.size(2)});
}

AttentionOutput narrow_rows(const AttentionOutput& a, int64_t start, int64_t length) {
  return {a.out.narrow(1, start, length), a.lse.narrow(2, start, length)};
}

// The ring part: local queries q [B, Sq, h, D] against the K/V [B, Sk, h, D] of every ring rank,
// which travel around the ring (double-buffered: one batch_p2p per step overlapping the block
// computation). key_valid[s] is the key mask [Sk] of the block that started on ring rank s
// (undefined: all real). joint_k/joint_v (optional, [B, T, h, D], replicated text) are attended
// exactly once, together with the block of ring rank 0, under joint_valid ([B, T] bool, the text
// keys attended; undefined: all). The first `ordered_rows` query rows
// (replicated text) merge their partials in ring-rank order, so every ring rank gets bit-identical
// text outputs.
AttentionOutput ring_attention(Communicator& ring, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const std::vector<at::Tensor>& key_valid,
                               const at::Tensor& joint_k, const at::Tensor& joint_v,
                               const at::Tensor& joint_valid, int64_t ordered_rows,
                               const backends::AttentionOptions& base) {
  const int r_size = ring.size(), r_rank = ring.rank();
  const int64_t sq = q.size(1);
  const bool has_joint = joint_k.defined() && joint_k.size(1) > 0;

  auto block = [&](const at::Tensor& kb, const at::Tensor& vb, int src) {
    at::Tensor kk = kb, vv = vb, valid = key_valid[src];
    backends::AttentionOptions opts = base;
    if (valid.defined()) opts.mask = valid.view({1, 1, 1, -1});  // [1, 1, 1, Sk]
    if (has_joint && src == 0) {
      kk = at::cat({joint_k, kb}, 1);  // [B, T + Sk, h, D]
      vv = at::cat({joint_v, vb}, 1);
      if (joint_valid.defined()) {
        const int64_t bsz = joint_valid.size(0), sk = kb.size(1);
        at::Tensor image = valid.defined() ? valid.view({1, sk}).expand({bsz, sk})
                                           : at::ones({bsz, sk}, joint_valid.options());
        opts.mask = at::cat({joint_valid, image}, 1).view({bsz, 1, 1, -1});  // [B, 1, 1, T + Sk]
      } else if (valid.defined()) {
        valid = at::cat({at::ones({joint_k.size(1)}, valid.options()), valid});
        opts.mask = valid.view({1, 1, 1, -1});
      }
    }
    return backends::attention(q, kk, vv, opts);
  };

  if (r_size == 1) return block(k, v, 0);

  const int next = (r_rank + 1) % r_size, prev = (r_rank - 1 + r_size) % r_size;
  at::Tensor cur = at::stack({k, v}, 0);  // [2, B, Sk, h, D] contiguous
  std::vector<AttentionOutput> ordered(r_size);
  AttentionOutput acc;
  for (int step = 0; step < r_size; ++step) {
    const int src = (r_rank - step + r_size) % r_size;
    at::Tensor nxt;
    std::unique_ptr<Work> exchange;  // one group: safe on NCCL, where a lone recv would block
    if (step + 1 < r_size) {
      nxt = at::empty_like(cur);
      exchange = ring.batch_p2p(
          {P2POp::recv(nxt, prev, Tag::kRingKv), P2POp::send(cur, next, Tag::kRingKv)});
    }
    AttentionOutput part = block(cur[0], cur[1], src);  // overlaps the transfer
    if (ordered_rows > 0) ordered[src] = narrow_rows(part, 0, ordered_rows);
    AttentionOutput rest = narrow_rows(part, ordered_rows, sq - ordered_rows);
    acc = step == 0 ? rest : backends::merge_attention(acc, rest, at::kFloat);
    if (exchange) {
      exchange->wait();
      cur = nxt;
    }
  }
  if (ordered_rows == 0) return acc;
  AttentionOutput text = ordered[0];
  for (int s = 1; s < r_size; ++s) text = backends::merge_attention(text, ordered[s], at::kFloat);
  return {at::cat({text.out.to(acc.out.scalar_type()), acc.out}, 1),
          at::cat({text.lse, acc.lse}, 2)};
}

}  // namespace

UspAttention::UspAttention(Communicator& ulysses, Communicator& ring, TextMode text_mode,
                           std::vector<int64_t> valid_tokens, std::optional<double> scale)
    : ulysses_(&ulysses),
      ring_(&ring),
      text_mode_(text_mode),
      valid_tokens_(std::move(valid_tokens)),
      scale_(scale) {
  XF_CHECK(static_cast<int>(valid_tokens_.size()) == sp_size(), "UspAttention: got ",
           valid_tokens_.size(), " valid-token counts for a sequence-parallel group of ", sp_size(),
           " ranks (ulysses '", ulysses.name(), "' ", ulysses.size(), " x ring '", ring.name(),
           "' ", ring.size(), ")");
  for (size_t s = 0; s < valid_tokens_.size(); ++s) {
    XF_CHECK(valid_tokens_[s] >= 0, "UspAttention: valid_tokens[", s, "] = ", valid_tokens_[s],
             " is negative");
  }
}

UspAttentionFn UspAttention::as_function() {
  return [this](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const UspCall& call) { return (*this)(q, k, v, call); };
}

at::Tensor UspAttention::attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   int64_t text_tokens, bool text_first, const at::Tensor& mask,
                                   const at::Tensor& text_key_mask) {
  const int u_size = ulysses_size(), r_size = ring_size(), sp = sp_size();
  XF_CONTEXT("usp attention (ulysses ", u_size, " x ring ", r_size, ", ",
             text_mode_name(text_mode_), " text)");
  XF_CHECK(q.defined() && k.defined() && v.defined(), "q, k and v must be defined");
  XF_CHECK(q.dim() == 4 && q.sizes() == k.sizes() && q.sizes() == v.sizes(),
           "q, k, v must share one shape [B, S_local, H, D]; got q ", q.sizes(), ", k ", k.sizes(),
           ", v ", v.sizes());
  XF_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
           "q, k, v dtypes differ: ", q.scalar_type(), ", ", k.scalar_type(), ", ",
           v.scalar_type());
  const int64_t b = q.size(0), s_local = q.size(1), heads = q.size(2), d = q.size(3);
  const int64_t t = text_tokens, c = s_local - t;
  XF_CHECK(t >= 0 && c >= 0, "text_tokens ", t, " outside the local sequence of ", s_local,
           " rows (q ", q.sizes(), ")");
  const int64_t max_valid = *std::max_element(valid_tokens_.begin(), valid_tokens_.end());
  XF_CHECK(max_valid <= c, "a rank has ", max_valid, " valid image rows but the local chunk has ",
           c, " (q ", q.sizes(), ", text_tokens ", t, ")");

  backends::AttentionOptions base;
  base.scale = scale_;
  if (mask.defined()) {
    XF_CHECK(sp == 1 && valid_tokens_[0] == c,
             "attention masks are not supported under sequence parallelism (mask ", mask.sizes(),
             ", sp ", sp, ", padded image rows ", c - valid_tokens_[0], ")");
    base.mask = mask;
    return backends::attention(q, k, v, base).out;
  }

  const bool replicated = text_mode_ == TextMode::kReplicated && t > 0;
  at::Tensor joint_valid;
  if (text_key_mask.defined()) {
    XF_CHECK(replicated, "a text key mask needs the text replicated on every rank (",
             text_mode_name(text_mode_), " text, ", t, " local text rows)");
    XF_CHECK(text_key_mask.dim() == 2 && text_key_mask.size(0) == b && text_key_mask.size(1) == t &&
                 text_key_mask.scalar_type() == at::kBool,
             "text_key_mask must be bool [", b, ", ", t, "], got ", text_key_mask.sizes(), " ",
             text_key_mask.scalar_type());
    joint_valid = text_key_mask.to(q.device());
  }
  const int64_t text_start = text_first ? 0 : c, image_start = text_first ? t : 0;
  const int64_t hp = (heads + u_size - 1) / u_size * u_size, hl = hp / u_size;
  const int u_rank = ulysses_->rank();

  // The all-to-all'ed ("distributed") part of the local sequence: Sd rows.
  const int64_t sd = replicated ? c : s_local;
  auto dist = [&](const at::Tensor& x) { return replicated ? x.narrow(1, image_start, c) : x; };

  // ---- Ulysses: one all_to_all for Q, K and V -------------------------------------------------
  at::Tensor qd, kd, vd;  // [B, U*Sd, hl, D]
  if (u_size > 1) {
    auto qkv = at::stack({pad_heads(dist(q), hp), pad_heads(dist(k), hp), pad_heads(dist(v), hp)},
                         0);  // [3, B, Sd, Hp, D]
    qkv = qkv.view({3, b, sd, u_size, hl, d}).permute({3, 0, 1, 2, 4, 5}).contiguous();
    auto got = ulysses_->all_to_all(qkv);  // [U, 3, B, Sd, hl, D]
    got = got.permute({1, 2, 0, 3, 4, 5}).reshape({3, b, u_size * sd, hl, d});  // src-major rows
    qd = got[0];
    kd = got[1];
    vd = got[2];
  } else {
    qd = dist(q);
    kd = dist(k);
    vd = dist(v);
  }

  // Replicated text: this rank's heads of the full text, not communicated.
  at::Tensor qt, kt, vt;  // [B, T, hl, D]
  if (replicated) {
    auto heads_of = [&](const at::Tensor& x) {
      return pad_heads(x.narrow(1, text_start, t), hp).narrow(2, u_rank * hl, hl);
    };
    qt = heads_of(q);
    kt = heads_of(k);
    vt = heads_of(v);
  }

  // Key masks of the distributed part of every ring rank's block: the Sd rows of SP ranks
  // s = src * U + j, j = 0..U-1, in Ulysses source order. Undefined when every row is real.
  std::vector<at::Tensor> key_valid(r_size);
  for (int src = 0; src < r_size; ++src) {
    bool all_real = true;
    for (int j = 0; j < u_size; ++j) all_real &= valid_tokens_[src * u_size + j] == c;
    if (all_real) continue;
    std::vector<at::Tensor> rows;
    for (int j = 0; j < u_size; ++j) {
      auto image = at::arange(c, q.options().dtype(at::kLong)) < valid_tokens_[src * u_size + j];
      if (replicated || t == 0) {
        rows.push_back(image);
      } else {
        auto text = at::ones({t}, image.options());
        rows.push_back(text_first ? at::cat({text, image}) : at::cat({image, text}));
      }
    }
    key_valid[src] = at::cat(rows);  // [U*Sd]
  }

  // ---- ring (or local) attention over the gathered sequence ---------------------------------
  const at::Tensor q_all = replicated ? at::cat({qt, qd}, 1) : qd;  // [B, T' + U*Sd, hl, D]
  AttentionOutput o = ring_attention(*ring_, q_all, kd.contiguous(), vd.contiguous(), key_valid, kt,
                                     vt, joint_valid, replicated ? t : 0, base);
  const int64_t t_rows = replicated ? t : 0;
  at::Tensor od = o.out.narrow(1, t_rows, u_size * sd).to(q.scalar_type());  // [B, U*Sd, hl, D]

  // ---- Ulysses back: one all_to_all for the output -----------------------------------------
  at::Tensor out_dist;  // [B, Sd, H, D]
  if (u_size > 1) {
    auto send = od.reshape({b, u_size, sd, hl, d}).permute({1, 0, 2, 3, 4}).contiguous();
    auto got = ulysses_->all_to_all(send);  // [U (head chunk), B, Sd, hl, D]
    out_dist = got.permute({1, 2, 0, 3, 4}).reshape({b, sd, hp, d}).narrow(2, 0, heads);
  } else {
    out_dist = od;
  }
  if (!replicated) return out_dist.contiguous();

  at::Tensor ot = o.out.narrow(1, 0, t).to(q.scalar_type());  // [B, T, hl, D]
  if (u_size > 1) ot = ulysses_->all_gather(ot.contiguous(), 2).narrow(2, 0, heads);
  return text_first ? at::cat({ot, out_dist}, 1) : at::cat({out_dist, ot}, 1);
}

// ---- communication volume -------------------------------------------------------------------

namespace {

void check_shape(const UspShape& s) {
  XF_CHECK(s.ulysses >= 1 && s.ring >= 1 && s.batch >= 0 && s.heads >= 1 && s.head_dim >= 0 &&
               s.text_tokens >= 0 && s.image_tokens >= 0 && s.element_size >= 1,
           "usp_comm_volume: invalid shape (batch ", s.batch, ", heads ", s.heads, ", head_dim ",
           s.head_dim, ", text ", s.text_tokens, ", image ", s.image_tokens, ", ulysses ",
           s.ulysses, ", ring ", s.ring, ")");
}

int64_t padded_heads(const UspShape& s) {
  return (s.heads + s.ulysses - 1) / s.ulysses * s.ulysses;
}

// Rows of the local sequence that go through the Ulysses all-to-all.
int64_t distributed_rows(const UspShape& s) {
  const bool replicated = s.text_mode == TextMode::kReplicated && s.text_tokens > 0;
  return replicated ? s.image_tokens : s.text_tokens + s.image_tokens;
}

}  // namespace

CommVolume ulysses_comm_volume(const UspShape& s) {
  check_shape(s);
  CommVolume vol;
  if (s.ulysses == 1) return vol;
  const int64_t u = s.ulysses, hp = padded_heads(s);
  const int64_t one = s.batch * distributed_rows(s) * hp * s.head_dim * s.element_size;
  // Q, K, V in, the output back: each keeps 1/U of itself.
  vol.all_to_all = 4 * one / u * (u - 1);
  if (s.text_mode == TextMode::kReplicated && s.text_tokens > 0) {
    vol.all_gather = s.batch * s.text_tokens * (hp / u) * s.head_dim * s.element_size * (u - 1);
  }
  return vol;
}

CommVolume ring_comm_volume(const UspShape& s) {
  check_shape(s);
  CommVolume vol;
  // K and V of the gathered sequence (U * rows) over H/U heads, sent R-1 times.
  const int64_t hl = padded_heads(s) / s.ulysses;
  vol.send = int64_t{s.ring - 1} * 2 * s.batch * s.ulysses * distributed_rows(s) * hl * s.head_dim *
             s.element_size;
  return vol;
}

CommVolume usp_comm_volume(const UspShape& s) {
  const CommVolume a = ulysses_comm_volume(s), r = ring_comm_volume(s);
  return {a.all_to_all + r.all_to_all, a.all_gather + r.all_gather, a.send + r.send};
}

}  // namespace xfuser::parallel
