// WorldConfig: the rank formula and every group, pinned by hand-written tables.
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backends/error.h"
#include "parallel/world_config.h"

namespace xfuser::parallel {
namespace {

using Groups = std::vector<std::vector<int>>;

Groups singletons(int n) {
  Groups g;
  for (int r = 0; r < n; ++r) g.push_back({r});
  return g;
}

// Checks coords(r) for every rank against `table` ({tp, ulysses, ring, sp, pp, cfg, dp} per
// rank), rank_of() back, groups(dim) against `groups`, and group(dim, r) for every rank.
void expect_layout(const WorldConfig& c, const std::vector<RankCoords>& table,
                   const std::map<MeshDim, Groups>& groups) {
  ASSERT_EQ(static_cast<int>(table.size()), c.world_size());
  for (int r = 0; r < c.world_size(); ++r) {
    EXPECT_EQ(c.coords(r), table[r])
        << "rank " << r << ": got " << c.coords(r).to_string() << ", want " << table[r].to_string();
    EXPECT_EQ(c.rank_of(table[r]), r);
  }
  ASSERT_EQ(groups.size(), kAllMeshDims.size());
  for (const auto& [dim, want] : groups) {
    EXPECT_EQ(c.groups(dim), want) << mesh_dim_name(dim);
    for (const auto& g : want) {
      for (int r : g) EXPECT_EQ(c.group(dim, r), g) << mesh_dim_name(dim) << " of rank " << r;
    }
  }
}

// The worked example of xdit-parallel-spec.md section 1: rank = sp_r + 4*cfg_r.
TEST(WorldConfig, SpecExampleWorld8Ulysses2Ring2Cfg2) {
  const auto c = WorldConfig::from_degrees(8, /*dp=*/1, /*cfg=*/2, /*pp=*/1, /*ulysses=*/2,
                                           /*ring=*/2, /*tp=*/1);
  EXPECT_EQ(c.sp(), 4);
  //                                tp u  r  sp pp cfg dp
  const std::vector<RankCoords> table = {
      {0, 0, 0, 0, 0, 0, 0}, {0, 1, 0, 1, 0, 0, 0}, {0, 0, 1, 2, 0, 0, 0}, {0, 1, 1, 3, 0, 0, 0},
      {0, 0, 0, 0, 0, 1, 0}, {0, 1, 0, 1, 0, 1, 0}, {0, 0, 1, 2, 0, 1, 0}, {0, 1, 1, 3, 0, 1, 0}};
  expect_layout(c, table,
                {{MeshDim::kTp, singletons(8)},
                 {MeshDim::kUlysses, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
                 {MeshDim::kRing, {{0, 2}, {1, 3}, {4, 6}, {5, 7}}},
                 {MeshDim::kSp, {{0, 1, 2, 3}, {4, 5, 6, 7}}},
                 {MeshDim::kPp, singletons(8)},
                 {MeshDim::kCfg, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}},
                 {MeshDim::kDp, singletons(8)}});
  EXPECT_EQ(c.group_name(MeshDim::kUlysses, 1), "ulysses[0,1]");
  EXPECT_EQ(c.group_name(MeshDim::kRing, 5), "ring[5,7]");
  EXPECT_EQ(c.group_name(MeshDim::kSp, 6), "sp[4,5,6,7]");
  EXPECT_EQ(c.group_name(MeshDim::kTp, 3), "tp[3]");
}

// tp 2 x ulysses 2 x pp 2 x dp 2: rank = tp_r + 2*ulysses_r + 4*pp_r + 8*dp_r; SP groups are
// strided by tp.
TEST(WorldConfig, World16Tp2Ulysses2Pp2Dp2) {
  const auto c = WorldConfig::from_degrees(16, /*dp=*/2, /*cfg=*/1, /*pp=*/2, /*ulysses=*/2,
                                           /*ring=*/1, /*tp=*/2);
  const std::vector<RankCoords> table = {
      {0, 0, 0, 0, 0, 0, 0}, {1, 0, 0, 0, 0, 0, 0}, {0, 1, 0, 1, 0, 0, 0}, {1, 1, 0, 1, 0, 0, 0},
      {0, 0, 0, 0, 1, 0, 0}, {1, 0, 0, 0, 1, 0, 0}, {0, 1, 0, 1, 1, 0, 0}, {1, 1, 0, 1, 1, 0, 0},
      {0, 0, 0, 0, 0, 0, 1}, {1, 0, 0, 0, 0, 0, 1}, {0, 1, 0, 1, 0, 0, 1}, {1, 1, 0, 1, 0, 0, 1},
      {0, 0, 0, 0, 1, 0, 1}, {1, 0, 0, 0, 1, 0, 1}, {0, 1, 0, 1, 1, 0, 1}, {1, 1, 0, 1, 1, 0, 1}};
  const Groups ulysses = {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}};
  expect_layout(
      c, table,
      {{MeshDim::kTp, {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}},
       {MeshDim::kUlysses, ulysses},
       {MeshDim::kRing, singletons(16)},
       {MeshDim::kSp, ulysses},
       {MeshDim::kPp, {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}},
       {MeshDim::kCfg, singletons(16)},
       {MeshDim::kDp, {{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}}});
}

// ulysses 4 x ring 2 x cfg 2: rank = ulysses_r + 4*ring_r + 8*cfg_r.
TEST(WorldConfig, World16Ulysses4Ring2Cfg2) {
  const auto c = WorldConfig::from_degrees(16, /*dp=*/1, /*cfg=*/2, /*pp=*/1, /*ulysses=*/4,
                                           /*ring=*/2, /*tp=*/1);
  const std::vector<RankCoords> table = {
      {0, 0, 0, 0, 0, 0, 0}, {0, 1, 0, 1, 0, 0, 0}, {0, 2, 0, 2, 0, 0, 0}, {0, 3, 0, 3, 0, 0, 0},
      {0, 0, 1, 4, 0, 0, 0}, {0, 1, 1, 5, 0, 0, 0}, {0, 2, 1, 6, 0, 0, 0}, {0, 3, 1, 7, 0, 0, 0},
      {0, 0, 0, 0, 0, 1, 0}, {0, 1, 0, 1, 0, 1, 0}, {0, 2, 0, 2, 0, 1, 0}, {0, 3, 0, 3, 0, 1, 0},
      {0, 0, 1, 4, 0, 1, 0}, {0, 1, 1, 5, 0, 1, 0}, {0, 2, 1, 6, 0, 1, 0}, {0, 3, 1, 7, 0, 1, 0}};
  expect_layout(
      c, table,
      {{MeshDim::kTp, singletons(16)},
       {MeshDim::kUlysses, {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}},
       {MeshDim::kRing, {{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}},
       {MeshDim::kSp, {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}}},
       {MeshDim::kPp, singletons(16)},
       {MeshDim::kCfg, {{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}},
       {MeshDim::kDp, singletons(16)}});
}

// tp 2 x ulysses 2 x ring 2 x cfg 2, spot checks on rank 13 = tp 1, sp 2 (ulysses 0, ring 1),
// cfg 1: every group of it written out.
TEST(WorldConfig, World16Tp2Ulysses2Ring2Cfg2Rank13) {
  const auto c = WorldConfig::from_degrees(16, 1, 2, 1, 2, 2, 2);
  EXPECT_EQ(c.coords(13), (RankCoords{1, 0, 1, 2, 0, 1, 0}));
  EXPECT_EQ(c.group(MeshDim::kTp, 13), (std::vector<int>{12, 13}));
  EXPECT_EQ(c.group(MeshDim::kUlysses, 13), (std::vector<int>{13, 15}));
  EXPECT_EQ(c.group(MeshDim::kRing, 13), (std::vector<int>{9, 13}));
  EXPECT_EQ(c.group(MeshDim::kSp, 13), (std::vector<int>{9, 11, 13, 15}));
  EXPECT_EQ(c.group(MeshDim::kCfg, 13), (std::vector<int>{5, 13}));
  EXPECT_EQ(c.group(MeshDim::kPp, 13), (std::vector<int>{13}));
  EXPECT_EQ(c.group(MeshDim::kDp, 13), (std::vector<int>{13}));
}

// Every factorisation (cfg 1 or 2) of 8, 12 and 16: coords/rank_of round trips, and per
// dimension the groups partition the world, have the degree's size, are ordered by the
// coordinate and differ only in that coordinate.
TEST(WorldConfig, RoundTripsForAllFactorisations) {
  int configs = 0;
  for (int world : {8, 12, 16}) {
    for (int dp = 1; dp <= world; ++dp)
      for (int cfg = 1; cfg <= 2; ++cfg)
        for (int pp = 1; pp <= world; ++pp)
          for (int u = 1; u <= world; ++u)
            for (int ring = 1; ring <= world; ++ring)
              for (int tp = 1; tp <= world; ++tp) {
                if (dp * cfg * pp * u * ring * tp != world) continue;
                ++configs;
                const auto c = WorldConfig::from_degrees(world, dp, cfg, pp, u, ring, tp);
                SCOPED_TRACE(c.to_string());
                for (int r = 0; r < world; ++r) {
                  const RankCoords rc = c.coords(r);
                  ASSERT_EQ(c.rank_of(rc), r);
                  ASSERT_EQ(rc.sp, rc.ulysses + u * rc.ring);
                }
                for (MeshDim dim : kAllMeshDims) {
                  std::vector<int> seen(world, 0);
                  const auto groups = c.groups(dim);
                  ASSERT_EQ(static_cast<int>(groups.size()), world / c.degree(dim));
                  for (const auto& g : groups) {
                    ASSERT_EQ(static_cast<int>(g.size()), c.degree(dim));
                    const RankCoords first = c.coords(g[0]);
                    for (int i = 0; i < static_cast<int>(g.size()); ++i) {
                      ++seen[g[i]];
                      RankCoords rc = c.coords(g[i]);
                      ASSERT_EQ(rc.get(dim), i) << mesh_dim_name(dim);
                      ASSERT_EQ(c.group(dim, g[i]), g);
                      // Only this dimension's coordinates may differ from the first member.
                      RankCoords masked = rc;
                      if (dim == MeshDim::kSp) {
                        masked.ulysses = first.ulysses;
                        masked.ring = first.ring;
                      }
                      if (dim == MeshDim::kUlysses || dim == MeshDim::kRing) {
                        masked.sp = first.sp;
                      }
                      switch (dim) {
                        case MeshDim::kTp:
                          masked.tp = first.tp;
                          break;
                        case MeshDim::kUlysses:
                          masked.ulysses = first.ulysses;
                          break;
                        case MeshDim::kRing:
                          masked.ring = first.ring;
                          break;
                        case MeshDim::kSp:
                          masked.sp = first.sp;
                          break;
                        case MeshDim::kPp:
                          masked.pp = first.pp;
                          break;
                        case MeshDim::kCfg:
                          masked.cfg = first.cfg;
                          break;
                        case MeshDim::kDp:
                          masked.dp = first.dp;
                          break;
                      }
                      ASSERT_EQ(masked, first) << mesh_dim_name(dim) << " member " << g[i];
                    }
                  }
                  for (int r = 0; r < world; ++r) {
                    ASSERT_EQ(seen[r], 1) << "rank " << r << " in " << mesh_dim_name(dim);
                  }
                }
              }
  }
  // 8: 2^3 over 6 slots with cfg <= 2; counted by hand: cfg 1 -> C(3+4,4)=35 (3 twos over
  // dp,pp,u,ring,tp), cfg 2 -> 15 (2 twos); 12 = 2^2*3: cfg 1 -> 15*5, cfg 2 -> 5*5;
  // 16 = 2^4: cfg 1 -> 70, cfg 2 -> 35.
  EXPECT_EQ(configs, (35 + 15) + (75 + 25) + (70 + 35));
}

std::string error_of(int world, int dp, int cfg, int pp, int u, int ring, int tp) {
  try {
    WorldConfig::from_degrees(world, dp, cfg, pp, u, ring, tp);
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(WorldConfig, ProductMismatchNamesEveryDegreeAndTheWorld) {
  const std::string msg = error_of(8, 1, 2, 3, 2, 1, 1);
  ASSERT_FALSE(msg.empty());
  for (const char* part :
       {"dp 1", "cfg 2", "pp 3", "ulysses 2", "ring 1", "tp 1", "= 12", "world size is 8"}) {
    EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
  }
}

TEST(WorldConfig, RejectsDegreesBelowOneAndCfgAboveTwo) {
  for (const auto& [msg, name] :
       std::vector<std::pair<std::string, std::string>>{{error_of(4, 0, 1, 1, 4, 1, 1), "dp"},
                                                        {error_of(4, 1, 1, 1, 4, 1, -1), "tp"},
                                                        {error_of(4, 1, 1, 1, 0, 1, 4), "ulysses"},
                                                        {error_of(4, 1, 1, 1, 4, 0, 1), "ring"}}) {
    EXPECT_NE(msg.find("parallel degree " + name + " must be >= 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("world 4 = dp "), std::string::npos) << msg;
  }
  EXPECT_NE(error_of(3, 1, 3, 1, 1, 1, 1).find("cfg degree must be 1 or 2"), std::string::npos);
  EXPECT_NE(error_of(0, 1, 1, 1, 1, 1, 1).find("world size must be >= 1"), std::string::npos);
}

TEST(WorldConfig, RankAndCoordinateRangesAreChecked) {
  const auto c = WorldConfig::from_degrees(4, 1, 1, 1, 2, 2, 1);
  EXPECT_THROW(c.coords(4), Error);
  EXPECT_THROW(c.coords(-1), Error);
  EXPECT_THROW(c.rank_of(RankCoords{0, 2, 0, 2, 0, 0, 0}), Error);  // ulysses out of range
  EXPECT_THROW(c.rank_of(RankCoords{0, 1, 1, 1, 0, 0, 0}), Error);  // sp != u + U*ring
  EXPECT_EQ(c.rank_of(RankCoords{0, 1, 1, 3, 0, 0, 0}), 3);
}

TEST(WorldConfig, DefaultIsASingleRankValue) {
  const WorldConfig c;
  EXPECT_EQ(c.world_size(), 1);
  EXPECT_EQ(c, WorldConfig::from_degrees(1, 1, 1, 1, 1, 1, 1));
  EXPECT_NE(c, WorldConfig::from_degrees(2, 1, 2, 1, 1, 1, 1));
  for (MeshDim dim : kAllMeshDims) EXPECT_EQ(c.group(dim, 0), std::vector<int>{0});
  EXPECT_EQ(c.to_string(), "world 1 = dp 1 x cfg 1 x pp 1 x ulysses 1 x ring 1 x tp 1");
}

}  // namespace
}  // namespace xfuser::parallel
