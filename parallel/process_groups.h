// ProcessGroups: the communicators of this rank, one per mesh dimension of a WorldConfig.
//
// Built collectively (every rank of the world communicator constructs it with the same config):
// each dimension's group comes from world.split(color = lowest member, key = coordinate), so the
// group rank of a member equals its coordinate in that dimension. Groups are named after the
// dimension and their members' ranks in the world communicator: "ulysses[0,1]", "ring[0,2]",
// "sp[0,1,2,3]", "tp[5]" (degree 1 groups exist too, with one member).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/world_config.h"

namespace xfuser::parallel {

class ProcessGroups {
 public:
  // `world` must have config.world_size() members; this rank is world->rank().
  ProcessGroups(const WorldConfig& config, std::shared_ptr<Communicator> world);

  const WorldConfig& config() const { return config_; }
  int rank() const { return world_->rank(); }  // rank in the world communicator
  const RankCoords& coords() const { return coords_; }

  Communicator& tp() const { return group(MeshDim::kTp); }
  Communicator& ulysses() const { return group(MeshDim::kUlysses); }
  Communicator& ring() const { return group(MeshDim::kRing); }
  Communicator& sp() const { return group(MeshDim::kSp); }
  Communicator& pp() const { return group(MeshDim::kPp); }
  Communicator& cfg() const { return group(MeshDim::kCfg); }
  Communicator& dp() const { return group(MeshDim::kDp); }
  Communicator& world() const { return *world_; }
  // Every rank that holds the same images: the ranks with this rank's dp coordinate (the
  // product of the tp, sp, pp and cfg groups), ordered by world rank; named "replica[0,1,..]".
  // The patch-parallel VAE splits its decode over it.
  Communicator& replica() const { return *replica_; }
  // FSDP (--use_fsdp): the ranks that hold the same weights and run every forward together,
  // those with this rank's tp, pp and dp coordinates (the product of the ulysses, ring and cfg
  // groups), ordered by world rank; named "fsdp[0,1,..]". Data-parallel groups run different
  // prompts (a different number of forwards), so each keeps its own sharded copy: sharded
  // within a generation's ranks, replicated across data-parallel groups. Created by
  // create_fsdp_group() (collective over the world); null before.
  // With `hosts` (every world rank's host name): hybrid sharding, the group narrowed to the
  // ranks on this rank's host ("fsdp[0,1]" on one host, "fsdp[2,3]" on the next), replicated
  // across hosts. Every rank checks every host's group alike, so a host holding a single rank
  // of a group is an error on all of them, before any split.
  void create_fsdp_group(const std::vector<std::string>& hosts = {});
  // The world ranks of rank `rank`'s fsdp group (narrowed to its host with `hosts`).
  std::vector<int> fsdp_members(int rank, const std::vector<std::string>& hosts = {}) const;
  Communicator* fsdp() const { return fsdp_.get(); }
  Communicator& group(MeshDim dim) const;

  // Run-report counters: group name -> operation -> OpStats, for the world and every group that
  // has counted at least one call.
  std::map<std::string, std::map<std::string, OpStats>> stats() const;
  void reset_stats();

 private:
  WorldConfig config_;
  RankCoords coords_;
  std::shared_ptr<Communicator> world_;
  std::map<MeshDim, std::unique_ptr<Communicator>> groups_;
  std::unique_ptr<Communicator> replica_;
  std::unique_ptr<Communicator> fsdp_;
};

}  // namespace xfuser::parallel
