#include "parallel/process_groups.h"

#include "backends/error.h"

namespace xfuser::parallel {

ProcessGroups::ProcessGroups(const WorldConfig& config, std::shared_ptr<Communicator> world)
    : config_(config), world_(std::move(world)) {
  XF_CHECK(world_ != nullptr, "ProcessGroups: no world communicator");
  XF_CHECK(world_->size() == config_.world_size(), "ProcessGroups: communicator '", world_->name(),
           "' has ", world_->size(), " ranks but the parallel config is ", config_.to_string());
  coords_ = config_.coords(world_->rank());
  for (MeshDim dim : kAllMeshDims) {
    XF_CONTEXT("creating the ", mesh_dim_name(dim), " group of rank ", world_->rank());
    const auto members = config_.group(dim, world_->rank());
    auto comm =
        world_->split(members.front(), coords_.get(dim), config_.group_name(dim, world_->rank()));
    std::vector<int> expected;
    for (int m : members) expected.push_back(world_->world_ranks()[m]);
    XF_CHECK(comm->size() == config_.degree(dim) && comm->rank() == coords_.get(dim) &&
                 comm->world_ranks() == expected,
             "group '", comm->name(), "' came out with rank ", comm->rank(), " of ", comm->size(),
             ", expected rank ", coords_.get(dim), " of ", config_.degree(dim));
    groups_[dim] = std::move(comm);
  }
  {
    XF_CONTEXT("creating the replica group of rank ", world_->rank());
    std::vector<int> members;
    std::string name = "replica[";
    for (int r = 0; r < config_.world_size(); ++r) {
      if (config_.coords(r).dp != coords_.dp) continue;
      name += (members.empty() ? "" : ",") + std::to_string(r);
      members.push_back(r);
    }
    replica_ = world_->split(members.front(), world_->rank(), name + "]");
    XF_CHECK(replica_->size() == static_cast<int>(members.size()), "group '", replica_->name(),
             "' came out with ", replica_->size(), " ranks, expected ", members.size());
  }
}

std::vector<int> ProcessGroups::fsdp_members(int rank,
                                             const std::vector<std::string>& hosts) const {
  // Rank `rank`'s tp, pp and dp coordinates (and host, when hybrid).
  const RankCoords a = config_.coords(rank);
  std::vector<int> out;
  for (int m = 0; m < config_.world_size(); ++m) {
    const RankCoords c = config_.coords(m);
    if (c.tp != a.tp || c.pp != a.pp || c.dp != a.dp) continue;
    if (!hosts.empty() && hosts.at(m) != hosts.at(rank)) continue;
    out.push_back(m);
  }
  return out;
}

void ProcessGroups::create_fsdp_group(const std::vector<std::string>& hosts) {
  if (fsdp_) return;
  XF_CONTEXT("creating the fsdp group of rank ", world_->rank());
  const int world = config_.world_size();
  XF_CHECK(hosts.empty() || static_cast<int>(hosts.size()) == world,
           "create_fsdp_group: ", hosts.size(), " host names for ", world, " ranks");
  auto group_of = [&](int r) { return fsdp_members(r, hosts); };
  if (!hosts.empty()) {
    for (int r = 0; r < world; ++r) {
      XF_CHECK(group_of(r).size() > 1, "--hybrid_fsdp shards within each host, and rank ", r,
               " is the only rank of its generation group on host '", hosts[r],
               "': nothing to shard there. Place at least two ranks of every group on each host "
               "(consecutive ranks per host: mpirun --map-by slot), or drop --hybrid_fsdp");
    }
  }
  const std::vector<int> members = group_of(world_->rank());
  std::string name = "fsdp[";
  for (size_t i = 0; i < members.size(); ++i) name += (i ? "," : "") + std::to_string(members[i]);
  fsdp_ = world_->split(members.front(), world_->rank(), name + "]");
  XF_CHECK(fsdp_->size() == static_cast<int>(members.size()), "group '", fsdp_->name(),
           "' came out with ", fsdp_->size(), " ranks, expected ", members.size());
}

Communicator& ProcessGroups::group(MeshDim dim) const { return *groups_.at(dim); }

std::map<std::string, std::map<std::string, OpStats>> ProcessGroups::stats() const {
  std::map<std::string, std::map<std::string, OpStats>> out;
  if (!world_->stats().empty()) out[world_->name()] = world_->stats();
  for (const auto& [dim, comm] : groups_) {
    if (!comm->stats().empty()) out[comm->name()] = comm->stats();
  }
  if (!replica_->stats().empty()) out[replica_->name()] = replica_->stats();
  if (fsdp_ && !fsdp_->stats().empty()) out[fsdp_->name()] = fsdp_->stats();
  return out;
}

void ProcessGroups::reset_stats() {
  world_->reset_stats();
  for (auto& [dim, comm] : groups_) comm->reset_stats();
  replica_->reset_stats();
  if (fsdp_) fsdp_->reset_stats();
}

}  // namespace xfuser::parallel
