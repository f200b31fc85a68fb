#include "parallel/sequence_shard.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "backends/error.h"

namespace xfuser::parallel {

const char* text_mode_name(TextMode mode) {
  switch (mode) {
    case TextMode::kSplit:
      return "split";
    case TextMode::kReplicated:
      return "replicated";
  }
  return "?";
}

TextMode choose_text_mode(int64_t text_tokens, int parts) {
  XF_CHECK(parts >= 1, "choose_text_mode: parts must be >= 1, got ", parts);
  XF_CHECK(text_tokens >= 0, "choose_text_mode: text_tokens must be >= 0, got ", text_tokens);
  return text_tokens % parts == 0 ? TextMode::kSplit : TextMode::kReplicated;
}

int64_t local_text_tokens(TextMode mode, int64_t text_tokens, int parts) {
  switch (mode) {
    case TextMode::kSplit:
      XF_CHECK(text_tokens % parts == 0, "local_text_tokens: split text needs text_tokens (",
               text_tokens, ") divisible by the sequence-parallel degree (", parts, ")");
      return text_tokens / parts;
    case TextMode::kReplicated:
      return text_tokens;
  }
  return text_tokens;
}

SequenceShard::SequenceShard(int64_t tokens, int parts)
    : tokens_(tokens), parts_(parts), chunk_(0) {
  XF_CHECK(parts >= 1, "SequenceShard: parts must be >= 1, got ", parts);
  XF_CHECK(tokens >= 1, "SequenceShard: tokens must be >= 1, got ", tokens);
  chunk_ = (tokens + parts - 1) / parts;
}

int64_t SequenceShard::valid(int rank) const {
  XF_CHECK(rank >= 0 && rank < parts_, "SequenceShard: rank ", rank, " out of [0, ", parts_, ")");
  return std::clamp<int64_t>(tokens_ - rank * chunk_, 0, chunk_);
}

std::vector<int64_t> SequenceShard::valid_counts() const {
  std::vector<int64_t> out;
  out.reserve(parts_);
  for (int r = 0; r < parts_; ++r) out.push_back(valid(r));
  return out;
}

at::Tensor SequenceShard::valid_mask(int rank, const at::TensorOptions& options) const {
  return at::arange(chunk_, options.dtype(at::kLong)) < valid(rank);
}

at::Tensor SequenceShard::shard(const at::Tensor& x, int64_t dim, int rank) const {
  XF_CHECK(x.defined(), "SequenceShard::shard: undefined tensor");
  const int64_t d = at::maybe_wrap_dim(dim, x.dim());
  XF_CHECK(x.size(d) == tokens_, "SequenceShard::shard: tensor ", x.sizes(), " has ", x.size(d),
           " rows along dim ", d, ", expected ", tokens_);
  const int64_t n = valid(rank);
  auto sizes = x.sizes().vec();
  sizes[d] = chunk_;
  auto out = at::zeros(sizes, x.options());
  if (n > 0) out.narrow(d, 0, n).copy_(x.narrow(d, rank * chunk_, n));
  return out;
}

at::Tensor SequenceShard::gather(const at::Tensor& local, int64_t dim, Communicator& comm) const {
  XF_CHECK(local.defined(), "SequenceShard::gather: undefined tensor");
  XF_CHECK(comm.size() == parts_, "SequenceShard::gather: group '", comm.name(), "' has ",
           comm.size(), " ranks, the sequence is split over ", parts_);
  const int64_t d = at::maybe_wrap_dim(dim, local.dim());
  XF_CHECK(local.size(d) == chunk_, "SequenceShard::gather: local chunk ", local.sizes(), " has ",
           local.size(d), " rows along dim ", d, ", expected ", chunk_);
  if (parts_ == 1) return local.narrow(d, 0, tokens_);
  return comm.all_gather(local.contiguous(), d).narrow(d, 0, tokens_);
}

at::Tensor SequenceShard::unshard(const std::vector<at::Tensor>& chunks, int64_t dim) const {
  XF_CHECK(static_cast<int>(chunks.size()) == parts_, "SequenceShard::unshard: got ", chunks.size(),
           " chunks, expected ", parts_);
  return at::cat(chunks, dim).narrow(at::maybe_wrap_dim(dim, chunks[0].dim()), 0, tokens_);
}

}  // namespace xfuser::parallel
