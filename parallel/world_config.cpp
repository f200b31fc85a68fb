#include "parallel/world_config.h"

#include <sstream>

#include "backends/error.h"

namespace xfuser::parallel {

const char* mesh_dim_name(MeshDim dim) {
  switch (dim) {
    case MeshDim::kTp:
      return "tp";
    case MeshDim::kUlysses:
      return "ulysses";
    case MeshDim::kRing:
      return "ring";
    case MeshDim::kSp:
      return "sp";
    case MeshDim::kPp:
      return "pp";
    case MeshDim::kCfg:
      return "cfg";
    case MeshDim::kDp:
      return "dp";
  }
  XF_THROW("unknown MeshDim ", static_cast<int>(dim));
}

int RankCoords::get(MeshDim dim) const {
  switch (dim) {
    case MeshDim::kTp:
      return tp;
    case MeshDim::kUlysses:
      return ulysses;
    case MeshDim::kRing:
      return ring;
    case MeshDim::kSp:
      return sp;
    case MeshDim::kPp:
      return pp;
    case MeshDim::kCfg:
      return cfg;
    case MeshDim::kDp:
      return dp;
  }
  XF_THROW("unknown MeshDim ", static_cast<int>(dim));
}

bool RankCoords::operator==(const RankCoords& o) const {
  return tp == o.tp && ulysses == o.ulysses && ring == o.ring && sp == o.sp && pp == o.pp &&
         cfg == o.cfg && dp == o.dp;
}

std::string RankCoords::to_string() const {
  return detail::str_cat("tp ", tp, ", ulysses ", ulysses, ", ring ", ring, ", sp ", sp, ", pp ",
                         pp, ", cfg ", cfg, ", dp ", dp);
}

WorldConfig WorldConfig::from_degrees(int world, int dp, int cfg, int pp, int ulysses, int ring,
                                      int tp) {
  WorldConfig c;
  c.world_ = world;
  c.dp_ = dp;
  c.cfg_ = cfg;
  c.pp_ = pp;
  c.ulysses_ = ulysses;
  c.ring_ = ring;
  c.tp_ = tp;
  const std::string all = c.to_string();
  XF_CHECK(world >= 1, "world size must be >= 1, got ", world, " (", all, ")");
  const std::pair<const char*, int> degrees[] = {{"dp", dp},           {"cfg", cfg},   {"pp", pp},
                                                 {"ulysses", ulysses}, {"ring", ring}, {"tp", tp}};
  for (const auto& [name, value] : degrees) {
    XF_CHECK(value >= 1, "parallel degree ", name, " must be >= 1, got ", value, " (", all, ")");
  }
  XF_CHECK(cfg <= 2, "cfg degree must be 1 or 2 (one rank per guidance branch), got ", cfg, " (",
           all, ")");
  const int64_t product = int64_t{dp} * cfg * pp * ulysses * ring * tp;
  XF_CHECK(product == world, "parallel degrees do not multiply to the world size: dp ", dp,
           " x cfg ", cfg, " x pp ", pp, " x ulysses ", ulysses, " x ring ", ring, " x tp ", tp,
           " = ", product, ", but the world size is ", world);
  return c;
}

int WorldConfig::degree(MeshDim dim) const {
  switch (dim) {
    case MeshDim::kTp:
      return tp_;
    case MeshDim::kUlysses:
      return ulysses_;
    case MeshDim::kRing:
      return ring_;
    case MeshDim::kSp:
      return sp();
    case MeshDim::kPp:
      return pp_;
    case MeshDim::kCfg:
      return cfg_;
    case MeshDim::kDp:
      return dp_;
  }
  XF_THROW("unknown MeshDim ", static_cast<int>(dim));
}

RankCoords WorldConfig::coords(int rank) const {
  XF_CHECK(rank >= 0 && rank < world_, "rank ", rank, " is outside the world of ", world_,
           " ranks (", to_string(), ")");
  RankCoords c;
  int r = rank;
  c.tp = r % tp_;
  r /= tp_;
  c.sp = r % sp();
  r /= sp();
  c.pp = r % pp_;
  r /= pp_;
  c.cfg = r % cfg_;
  c.dp = r / cfg_;
  c.ulysses = c.sp % ulysses_;
  c.ring = c.sp / ulysses_;
  return c;
}

int WorldConfig::rank_of(const RankCoords& c) const {
  const std::pair<MeshDim, int> checks[] = {
      {MeshDim::kTp, c.tp}, {MeshDim::kUlysses, c.ulysses}, {MeshDim::kRing, c.ring},
      {MeshDim::kPp, c.pp}, {MeshDim::kCfg, c.cfg},         {MeshDim::kDp, c.dp}};
  for (const auto& [dim, value] : checks) {
    XF_CHECK(value >= 0 && value < degree(dim), "coordinate ", mesh_dim_name(dim), " = ", value,
             " is outside [0, ", degree(dim), ") (", to_string(), ")");
  }
  XF_CHECK(c.sp == c.ulysses + ulysses_ * c.ring, "inconsistent coordinates: sp ", c.sp,
           " != ulysses ", c.ulysses, " + ", ulysses_, " * ring ", c.ring);
  return c.tp + tp_ * (c.sp + sp() * (c.pp + pp_ * (c.cfg + cfg_ * c.dp)));
}

std::vector<int> WorldConfig::group(MeshDim dim, int rank) const {
  const RankCoords base = coords(rank);
  const int n = degree(dim);
  std::vector<int> members;
  members.reserve(n);
  for (int i = 0; i < n; ++i) {
    RankCoords c = base;
    switch (dim) {
      case MeshDim::kTp:
        c.tp = i;
        break;
      case MeshDim::kUlysses:
        c.ulysses = i;
        break;
      case MeshDim::kRing:
        c.ring = i;
        break;
      case MeshDim::kSp:
        c.ulysses = i % ulysses_;
        c.ring = i / ulysses_;
        break;
      case MeshDim::kPp:
        c.pp = i;
        break;
      case MeshDim::kCfg:
        c.cfg = i;
        break;
      case MeshDim::kDp:
        c.dp = i;
        break;
    }
    c.sp = c.ulysses + ulysses_ * c.ring;
    members.push_back(rank_of(c));
  }
  return members;
}

std::vector<std::vector<int>> WorldConfig::groups(MeshDim dim) const {
  std::vector<std::vector<int>> out;
  std::vector<bool> seen(world_, false);
  for (int r = 0; r < world_; ++r) {
    if (seen[r]) continue;
    out.push_back(group(dim, r));
    for (int m : out.back()) seen[m] = true;
  }
  return out;
}

std::string WorldConfig::group_name(MeshDim dim, int rank) const {
  std::ostringstream os;
  os << mesh_dim_name(dim) << "[";
  const auto members = group(dim, rank);
  for (size_t i = 0; i < members.size(); ++i) os << (i ? "," : "") << members[i];
  os << "]";
  return os.str();
}

std::string WorldConfig::to_string() const {
  return detail::str_cat("world ", world_, " = dp ", dp_, " x cfg ", cfg_, " x pp ", pp_,
                         " x ulysses ", ulysses_, " x ring ", ring_, " x tp ", tp_);
}

bool WorldConfig::operator==(const WorldConfig& o) const {
  return world_ == o.world_ && dp_ == o.dp_ && cfg_ == o.cfg_ && pp_ == o.pp_ &&
         ulysses_ == o.ulysses_ && ring_ == o.ring_ && tp_ == o.tp_;
}

}  // namespace xfuser::parallel
