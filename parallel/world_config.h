// WorldConfig: the parallel degrees of a run and the rank layout of the process mesh.
//
// Degrees: dp (data parallel), cfg (1, or 2 for the two guidance branches), pp (PipeFusion
// stages), ulysses (U) and ring (R) with sp = U * R (sequence parallel), tp (tensor parallel).
// world = dp * cfg * pp * sp * tp.
//
// Rank formula, innermost (fastest-varying) dimension first, order "tp-sp-pp-cfg-dp":
//
//     global = tp_r + tp*(sp_r + sp*(pp_r + pp*(cfg_r + cfg*dp_r)))
//     sp_r   = ulysses_r + U*ring_r
//
// so Ulysses groups inside one SP group are contiguous (in units of tp) and ring groups are
// strided by U. The group of a rank along one dimension is the set of ranks whose coordinates
// differ only in that dimension (for sp: in ulysses and ring together), ordered by that
// coordinate. Pinned by the exhaustive tables in tests/test_world_config.cpp.
#pragma once

#include <array>
#include <string>
#include <vector>

namespace xfuser::parallel {

enum class MeshDim { kTp, kUlysses, kRing, kSp, kPp, kCfg, kDp };

inline constexpr std::array<MeshDim, 7> kAllMeshDims = {
    MeshDim::kTp, MeshDim::kUlysses, MeshDim::kRing, MeshDim::kSp,
    MeshDim::kPp, MeshDim::kCfg,     MeshDim::kDp};

// "tp", "ulysses", "ring", "sp", "pp", "cfg", "dp".
const char* mesh_dim_name(MeshDim dim);

// The coordinates of one rank. `sp` is redundant: always ulysses + U * ring.
struct RankCoords {
  int tp = 0;
  int ulysses = 0;
  int ring = 0;
  int sp = 0;
  int pp = 0;
  int cfg = 0;
  int dp = 0;

  int get(MeshDim dim) const;
  bool operator==(const RankCoords& o) const;
  bool operator!=(const RankCoords& o) const { return !(*this == o); }
  std::string to_string() const;  // "tp 0, ulysses 1, ring 0, sp 1, pp 0, cfg 1, dp 0"
};

class WorldConfig {
 public:
  // A world of one rank (every degree 1).
  WorldConfig() = default;

  // Every degree must be >= 1, cfg 1 or 2, and the product must equal `world`; the error names
  // every degree and the world size.
  static WorldConfig from_degrees(int world, int dp, int cfg, int pp, int ulysses, int ring,
                                  int tp);

  int world_size() const { return world_; }
  int dp() const { return dp_; }
  int cfg() const { return cfg_; }
  int pp() const { return pp_; }
  int ulysses() const { return ulysses_; }
  int ring() const { return ring_; }
  int sp() const { return ulysses_ * ring_; }
  int tp() const { return tp_; }
  int degree(MeshDim dim) const;

  // Coordinates of `rank` (0 <= rank < world_size()).
  RankCoords coords(int rank) const;
  // Inverse of coords(); uses tp, ulysses, ring, pp, cfg, dp and checks sp is consistent.
  int rank_of(const RankCoords& c) const;

  // Members of the `dim` group containing `rank`, ordered by their `dim` coordinate
  // (so group(dim, rank)[coords(rank).get(dim)] == rank).
  std::vector<int> group(MeshDim dim, int rank) const;
  // Every `dim` group, ordered by their lowest member; together they partition the world.
  std::vector<std::vector<int>> groups(MeshDim dim) const;
  // "ulysses[0,1]": the dimension and the member list of group(dim, rank).
  std::string group_name(MeshDim dim, int rank) const;

  // "world 8 = dp 1 x cfg 2 x pp 1 x ulysses 2 x ring 2 x tp 1"
  std::string to_string() const;

  bool operator==(const WorldConfig& o) const;
  bool operator!=(const WorldConfig& o) const { return !(*this == o); }

 private:
  int world_ = 1;
  int dp_ = 1;
  int cfg_ = 1;
  int pp_ = 1;
  int ulysses_ = 1;
  int ring_ = 1;
  int tp_ = 1;
};

}  // namespace xfuser::parallel
