// FSDP (--use_fsdp): each rank of a group keeps 1/N of every sharded parameter and gathers a
// block's whole weights just before the block runs, as PyTorch's FSDP2 (fully_shard per block,
// dim-0 sharding) and xDiT's --use_fsdp.
//
// - Sharding: every parameter with at least N rows is split along dim 0 into N chunks of
//   ceil(rows / N) rows; rank r holds chunk r, zero-padded (LoadOptions::row_part/row_parts:
//   the loader reads only those rows from the checkpoint, so no rank ever holds the whole
//   model, not even while loading). Smaller parameters (biases of fewer than N rows, 0-dim
//   scalars) are held whole by every rank.
// - Gathering: a component's parameters form groups: one per block ("transformer_blocks.<i>.",
//   given by the model, or found for text encoders: "encoder.block.<i>.", "layers.<i>."...) and
//   one for the rest (embedders, final norm and projection). A group is gathered by one
//   all_gather_into of raw bytes at the first read of one of its parameters
//   (ParamSlot::ensure_resident, as CPU offload: no call from model code); the block before it
//   is freed and the next block's gather is posted at once, so it overlaps the current block's
//   compute (asynchronous on NCCL; MPI's non-blocking gathers progress as far as MPI allows).
//   Blocks are prefetched in forward order, cyclically, so a denoising loop finds block 0 on
//   its way after the last one. The rest of a component is freed when its first block runs and
//   gathered again when it is read after the blocks (the last block freed then), so a component
//   holds two blocks, or its rest and one block, at once. When another component is first
//   used, every group of the previous one is freed. At the end of a generation everything
//   returns to shards.
// - Lockstep: every rank of the group must gather the same groups in the same order (they run
//   the same forwards on different data: Ulysses, ring and CFG ranks). Each gather carries the
//   group's identity; a rank that gathered another group fails with both names.
// - fp8 weights are sharded and gathered as their values and per-row scales.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "models/common/module.h"

namespace xfuser::parallel {
class Communicator;
class Work;
}  // namespace xfuser::parallel

namespace xfuser::models {

// What FSDP holds and moved in one rank, in parameter bytes (fp8 values and scales as held).
struct FsdpStats {
  int group_size = 1;
  int components = 0;
  int blocks = 0;                // block groups over all components
  int64_t model_bytes = 0;       // the whole parameters of the sharded components
  int64_t shard_bytes = 0;       // this rank's chunks (padded), held all the time
  int64_t replicated_bytes = 0;  // parameters too small to shard, held whole
  int64_t gathered_bytes = 0;    // whole parameters gathered now
  int64_t peak_gathered_bytes = 0;
  int64_t resident_bytes = 0;  // shard + replicated + gathered, now
  int64_t peak_resident_bytes = 0;
  int64_t gathers = 0;       // groups gathered
  int64_t gather_bytes = 0;  // whole bytes of the gathered groups, in all
  int64_t largest_block_bytes = 0;
  int64_t largest_rest_bytes = 0;  // a component's parameters outside its blocks
  // shard + replicated + the most a component gathers at once (its two largest blocks, or its
  // rest and its largest block); peak_resident_bytes never exceeds it.
  int64_t bound_bytes = 0;
};

struct FsdpGroup;
struct FsdpComponent;

class FsdpSharder {
 public:
  // `group`: the ranks that shard among themselves (ProcessGroups::fsdp()); `device`: where the
  // gathered parameters are made (the shards' device).
  FsdpSharder(parallel::Communicator& group, c10::Device device);
  ~FsdpSharder();
  FsdpSharder(const FsdpSharder&) = delete;
  FsdpSharder& operator=(const FsdpSharder&) = delete;

  parallel::Communicator& group() const { return group_; }
  // Sets the loader's row sharding for a component this sharder will hold.
  void configure(LoadOptions& options) const;
  // Takes charge of `module`, loaded with configure()'s options: its row-sharded parameters
  // return to their shards until used. `block_prefixes`: the block lists in forward order;
  // empty: found from the parameter names (the outermost numbered list with two or more
  // entries, e.g. "encoder.block.").
  void add_component(const std::string& name, std::shared_ptr<Module> module,
                     std::vector<std::string> block_prefixes = {});
  // Every gathered group returns to shards (the end of a generation); checks the identities of
  // gathers made on a device.
  void release_all();
  FsdpStats stats() const { return stats_; }

  // Makes `group` gathered and in use (ParamSlot::ensure_resident through the group's use()).
  void use(FsdpGroup& group);

  // The block lists of `names` (see add_component), in order of first appearance.
  static std::vector<std::string> find_block_prefixes(const std::vector<std::string>& names);

 private:
  void gather(FsdpGroup& group);
  void wait(FsdpGroup& group);
  void release(FsdpGroup& group);
  void release_component(FsdpComponent& component);
  void check_identities();

  parallel::Communicator& group_;
  c10::Device device_;
  std::vector<std::unique_ptr<FsdpComponent>> components_;
  FsdpComponent* active_ = nullptr;
  FsdpGroup* active_block_ = nullptr;
  FsdpGroup* prefetched_ = nullptr;
  // Identities gathered on a device, copied to the host without a sync; checked at release_all.
  std::vector<std::pair<at::Tensor, FsdpGroup*>> unchecked_;
  FsdpStats stats_;
};

}  // namespace xfuser::models
