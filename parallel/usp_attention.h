// USP (unified sequence parallelism): exact attention over the GLOBAL sequence when every rank of
// the sequence-parallel group holds a local slice of q/k/v. Ulysses (all-to-all over heads) runs
// inside ring attention (K/V passed around the ring, partials merged with the log-sum-exp).
//
// Local layout on SP rank s = ring_rank * U + ulysses_rank (Ulysses innermost, spec section 1):
//   q, k, v [B, S_local, H, D],  S_local = T + c,  text rows first or last:
//   - image rows: chunk s of the padded image sequence (parallel/sequence_shard.h); the first
//     valid_tokens[s] rows are real, the rest is padding that is never attended as a key;
//   - text rows T: kSplit -> text chunk s (T = L / sp); kReplicated -> all L text rows, identical
//     on every rank (their keys are attended exactly once, their outputs are identical on every
//     rank of the group).
//   returns [B, S_local, H, D] in q's dtype (rows of padding queries are finite but meaningless).
//
// Ulysses: Q, K, V of the distributed part (whole local sequence with split text, image rows with
// replicated text) go through ONE all_to_all (stacked [U, 3, ...]); H is padded with zero heads to
// a multiple of U and the padding heads are dropped after; one all_to_all brings the output back.
// Replicated text is not all-to-all'ed: each Ulysses rank slices its heads and the text output is
// all_gathered over heads at the end.
// Ring: K and V (one stacked buffer) go to the next ring rank with isend/irecv while the current
// block is computed; partials merge in float32 (backends::merge_attention).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "parallel/communicator.h"
#include "parallel/sequence_shard.h"

namespace xfuser::parallel {

// What one attention call says about its local sequence (the model side adapts its own
// AttentionCall to this).
struct UspCall {
  int64_t text_tokens = 0;  // text rows in the LOCAL sequence (L / sp split, L replicated)
  bool text_first = true;   // [text, image] (FLUX) or [image, text] (SD3, HunyuanVideo)
  at::Tensor mask;          // must be undefined when sp > 1 (no masks under sequence parallelism)
  // [B, T] bool with replicated text: the text keys attended (true) by every query; the image
  // keys are all attended. Undefined: every text key.
  at::Tensor text_key_mask;
};

using UspAttentionFn = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const UspCall& call)>;

class UspAttention {
 public:
  // `ulysses` and `ring` are the groups of this rank (either may have size 1) and must outlive
  // this object. `valid_tokens[s]` = real image rows of SP rank s's chunk (size U * R).
  // `scale` multiplies Q K^T (default 1/sqrt(D)).
  UspAttention(Communicator& ulysses, Communicator& ring, TextMode text_mode,
               std::vector<int64_t> valid_tokens, std::optional<double> scale = std::nullopt);

  int ulysses_size() const { return ulysses_->size(); }
  int ring_size() const { return ring_->size(); }
  int sp_size() const { return ulysses_->size() * ring_->size(); }
  int sp_rank() const { return ring_->rank() * ulysses_->size() + ulysses_->rank(); }
  TextMode text_mode() const { return text_mode_; }
  const std::vector<int64_t>& valid_tokens() const { return valid_tokens_; }

  // q, k, v [B, S_local, H, D] (see the layout above) -> [B, S_local, H, D].
  // text_key_mask [B, T] bool (optional) masks text keys; it needs replicated text (T = the whole
  // text on every rank).
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       int64_t text_tokens, bool text_first, const at::Tensor& mask = {},
                       const at::Tensor& text_key_mask = {});
  at::Tensor operator()(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const UspCall& call) {
    return attention(q, k, v, call.text_tokens, call.text_first, call.mask, call.text_key_mask);
  }
  // A hook-shaped function calling this object (which must outlive it).
  UspAttentionFn as_function();

 private:
  Communicator* ulysses_;
  Communicator* ring_;
  TextMode text_mode_;
  std::vector<int64_t> valid_tokens_;
  std::optional<double> scale_;
};

// ---- communication volume -----------------------------------------------------------------------

// The shapes of one attention call as seen by one rank.
struct UspShape {
  int64_t batch = 1;
  int64_t heads = 1;         // H (before padding to a multiple of the Ulysses degree)
  int64_t head_dim = 1;      // D (q, k and v)
  int64_t text_tokens = 0;   // text rows in the local sequence
  int64_t image_tokens = 0;  // image rows in the local sequence (the padded chunk c)
  int64_t element_size = 4;  // bytes per element of q/k/v
  TextMode text_mode = TextMode::kSplit;
  int ulysses = 1;
  int ring = 1;
};

// Bytes this rank sends per attention call, per communicator operation kind (the names of
// Communicator::stats()).
struct CommVolume {
  int64_t all_to_all = 0;  // Ulysses group
  int64_t all_gather = 0;  // Ulysses group (replicated text outputs)
  int64_t send = 0;        // ring group (isend of K/V)
  int64_t total() const { return all_to_all + all_gather + send; }
};

// Ulysses: Q, K, V and the output of the all-to-all'ed part each move (U-1)/U of their local size
// (heads padded to a multiple of U); replicated text: the text output of H/U heads goes to the
// U-1 other ranks.
CommVolume ulysses_comm_volume(const UspShape& shape);
// Ring: each rank sends its (post-Ulysses) K and V to the next ring rank R-1 times.
CommVolume ring_comm_volume(const UspShape& shape);
// Both (hybrid USP); equals ulysses_comm_volume + ring_comm_volume.
CommVolume usp_comm_volume(const UspShape& shape);

}  // namespace xfuser::parallel
