// Tensor parallelism (Megatron-style) for model code that must not know how it is parallelised.
//
// A model is constructed with a TensorParallel {rank, size}: its layers declare sharded
// parameters (Module::sharded_param), so load() reads only this rank's slices. The collectives
// come from an injected TensorParallelOps (the pipeline wires it to ProcessGroups::tp()); with
// size 1 no collective is called and every layer computes exactly what its unsharded
// counterpart in layers.h computes.
//
//   ColumnParallelLinear  weight [out/n, in], bias [out/n]: y_local = x W_r^T + b_r
//                         (forward_gathered: the full [.., out] by an all-gather of the last dim)
//   RowParallelLinear     weight [out, in/n], bias [out] replicated:
//                         y = all_reduce(x_local W_r^T) + b   (bias added once, after the sum)
//   ParallelFeedForward   net.0.proj column-parallel, net.2 row-parallel: one all-reduce
//   ParallelAdaLayerNormZero(Single)  the modulation linear column-parallel + all-gather of the
//                         small [B, k*D] conditioning output (exact, no reduction)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "models/common/layers.h"
#include "models/common/module.h"

namespace xfuser::models {

// This rank's place in the tensor-parallel group.
struct TensorParallel {
  int rank = 0;
  int size = 1;
  ParamShard shard(int64_t dim, std::vector<int64_t> segments = {}) const {
    return ParamShard{dim, std::move(segments), rank, size};
  }
};

// The collectives of the tensor-parallel group, injected by whoever runs the model.
struct TensorParallelOps {
  // Sums `t` (contiguous) over the group, in place.
  std::function<void(at::Tensor& t)> all_reduce;
  // Concatenation of every rank's `t` (same shape everywhere) along its LAST dim, in rank order.
  std::function<at::Tensor(const at::Tensor& t)> all_gather_last;
};

// Column-parallel nn.Linear (diffusers names `weight`, `bias`). `segments` splits the output
// features into blocks that are sharded separately (gated feed-forwards: {inner, inner}).
class ColumnParallelLinear : public Module {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features, const TensorParallel& tp,
                       bool bias = true, std::vector<int64_t> segments = {});
  at::Tensor forward(const at::Tensor& x) const;  // [..., in] -> [..., out/n] (this rank's part)
  // [..., in] -> [..., out]: the parts all-gathered (single segment only).
  at::Tensor forward_gathered(const at::Tensor& x, const TensorParallelOps& ops) const;
  int64_t in_features() const { return in_; }
  int64_t local_out_features() const { return local_out_; }

 private:
  int64_t in_, local_out_;
  int parts_, segments_;
  ParamSlot* weight_;
  ParamSlot* bias_ = nullptr;
};

// Row-parallel nn.Linear. `segments` splits the input features into blocks that are sharded
// separately (FLUX single blocks' proj_out over [attention D | MLP 4D]).
class RowParallelLinear : public Module {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, const TensorParallel& tp,
                    bool bias = true, std::vector<int64_t> segments = {});
  // x [..., in/n] (this rank's part of the input features) -> [..., out], summed over the group.
  at::Tensor forward(const at::Tensor& x, const TensorParallelOps& ops) const;
  int64_t local_in_features() const { return local_in_; }

 private:
  int64_t local_in_, out_;
  int parts_;
  ParamSlot* weight_;
  ParamSlot* bias_ = nullptr;
};

// diffusers FeedForward (`net.0.proj`, `net.2`) split column then row: one all-reduce.
class ParallelFeedForward : public Module {
 public:
  ParallelFeedForward(int64_t dim, int64_t dim_out, double mult, FeedForwardKind kind,
                      const TensorParallel& tp, bool bias = true);
  at::Tensor forward(const at::Tensor& x, const TensorParallelOps& ops) const;

 private:
  std::shared_ptr<ColumnParallelLinear> proj_;
  std::shared_ptr<RowParallelLinear> out_;
  FeedForwardKind kind_;
};

// AdaLayerNormZero / AdaLayerNormZeroSingle (layers.h) with the modulation linear sharded.
class ParallelAdaLayerNormZero : public Module {
 public:
  ParallelAdaLayerNormZero(int64_t dim, const TensorParallel& tp, double eps = 1e-6);
  AdaLayerNormZero::Output forward(const at::Tensor& x, const at::Tensor& temb,
                                   const TensorParallelOps& ops) const;

 private:
  std::shared_ptr<ColumnParallelLinear> linear_;
  double eps_;
};

class ParallelAdaLayerNormZeroSingle : public Module {
 public:
  ParallelAdaLayerNormZeroSingle(int64_t dim, const TensorParallel& tp, double eps = 1e-6);
  AdaLayerNormZeroSingle::Output forward(const at::Tensor& x, const at::Tensor& temb,
                                         const TensorParallelOps& ops) const;

 private:
  std::shared_ptr<ColumnParallelLinear> linear_;
  double eps_;
};

}  // namespace xfuser::models
