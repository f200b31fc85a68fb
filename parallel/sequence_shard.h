// How a token sequence is split over the P ranks of a sequence-parallel group.
//
// Image tokens: N tokens are padded at the end to P * c rows, c = ceil(N / P); rank r holds rows
// [r*c, (r+1)*c) of the padded sequence. The padding rows are zeros, are never attended as keys
// (UspAttention masks them) and are dropped again by gather().
//
// Text tokens of joint attention (FLUX, SD3, HunyuanVideo): kSplit when L % P == 0 (rank r holds
// text rows [r*L/P, (r+1)*L/P)), else kReplicated (every rank holds all L rows and the same text
// outputs). Text is never padded.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "parallel/communicator.h"

namespace xfuser::parallel {

enum class TextMode { kSplit, kReplicated };

const char* text_mode_name(TextMode mode);

// kSplit when text_tokens % parts == 0 (including no text), else kReplicated.
TextMode choose_text_mode(int64_t text_tokens, int parts);

// Text rows held by each rank: L / P (kSplit) or L (kReplicated).
int64_t local_text_tokens(TextMode mode, int64_t text_tokens, int parts);

class SequenceShard {
 public:
  // `tokens` real rows split over `parts` ranks.
  SequenceShard(int64_t tokens, int parts);

  int64_t tokens() const { return tokens_; }
  int parts() const { return parts_; }
  int64_t chunk() const { return chunk_; }            // rows per rank, c = ceil(N / P)
  int64_t padded() const { return chunk_ * parts_; }  // P * c
  int64_t padding() const { return padded() - tokens_; }
  // Real rows in rank r's chunk: the first valid(r) local rows are real, the rest are padding.
  int64_t valid(int rank) const;
  std::vector<int64_t> valid_counts() const;  // valid(0), ..., valid(P-1)
  // [c] bool: True for the real rows of rank r's chunk.
  at::Tensor valid_mask(int rank, const at::TensorOptions& options = {}) const;

  // Rank r's chunk of x (x.size(dim) == N): c rows along `dim`, zero padding rows at the end.
  at::Tensor shard(const at::Tensor& x, int64_t dim, int rank) const;
  // The inverse over the group: all_gather of every rank's chunk along `dim` (comm.size() == P,
  // comm.rank() == the chunk index), padding dropped: x.size(dim) == N.
  at::Tensor gather(const at::Tensor& local, int64_t dim, Communicator& comm) const;
  // The same without communication: `chunks` are the P chunks in rank order.
  at::Tensor unshard(const std::vector<at::Tensor>& chunks, int64_t dim) const;

 private:
  int64_t tokens_;
  int parts_;
  int64_t chunk_;
};

}  // namespace xfuser::parallel
