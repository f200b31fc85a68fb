// The memory a transformer encoder layer needs beyond its weights, shared by the text and image
// encoders' Component::activation_bytes (the memory plan).
#pragma once

#include <cstdint>

namespace xfuser::models {

// A transformer encoder layer's peak over its weights, for activation_bytes: the attention's
// scores (`score_bytes` per query-key pair and batch row) or the MLP's three [B, S, intermediate]
// tensors, whichever is larger, beside four fp32 [B, S, hidden] residual-stream tensors.
inline uint64_t encoder_layer_peak_bytes(int64_t batch, int64_t tokens, uint64_t score_bytes,
                                         int64_t intermediate, int64_t hidden, int bytes) {
  const auto b = static_cast<uint64_t>(batch < 1 ? 1 : batch);
  const auto s = static_cast<uint64_t>(tokens);
  const uint64_t scores = b * s * s * score_bytes;
  const uint64_t mlp =
      3 * b * s * static_cast<uint64_t>(intermediate) * static_cast<uint64_t>(bytes);
  return (scores > mlp ? scores : mlp) + 4 * b * s * static_cast<uint64_t>(hidden) * 4;
}

}  // namespace xfuser::models
