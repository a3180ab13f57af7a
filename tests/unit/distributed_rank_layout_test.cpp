// Where the ranks of a tensor x pipeline split sit (distributed/rank_layout.h):
// vLLM's order, stage-major, with each stage's shard 0 its leader.
#include <gtest/gtest.h>

#include <vector>

#include "distributed/rank_layout.h"

namespace inferd::distributed {
namespace {

TEST(RankLayout, StagesAreContiguousGroupsOfTShardsLedByShardZero) {
  const RankLayout l{2, 3};  // T = 2, P = 3: stages {0, 1}, {2, 3}, {4, 5}
  EXPECT_EQ(l.world_size(), 6);
  const std::vector<int> stage = {0, 0, 1, 1, 2, 2}, shard = {0, 1, 0, 1, 0, 1};
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(l.stage_of(r), stage[r]) << r;
    EXPECT_EQ(l.shard_of(r), shard[r]) << r;
    EXPECT_EQ(l.is_leader(r), shard[r] == 0) << r;
    EXPECT_EQ(l.leader(l.stage_of(r)) + l.shard_of(r), r) << r;  // the two numberings agree
  }
  EXPECT_EQ(l.leader(1), 2);
  EXPECT_EQ(l.last_leader(), 4);
  EXPECT_TRUE(l.first_stage(1));
  EXPECT_FALSE(l.first_stage(2));
  EXPECT_TRUE(l.last_stage(5));
  EXPECT_FALSE(l.last_stage(3));
  EXPECT_EQ(l.peers(0), std::vector<int>({1}));
  EXPECT_EQ(l.peers(2), std::vector<int>({5}));
}

TEST(RankLayout, OneKindAloneIsTheLayoutItHadBefore) {
  // A pipeline alone: rank r is stage r, each its own leader, no peers.
  const RankLayout pp{1, 4};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(pp.stage_of(r), r);
    EXPECT_TRUE(pp.is_leader(r));
    EXPECT_TRUE(pp.peers(r).empty());
  }
  EXPECT_EQ(pp.last_leader(), 3);
  // Tensor parallelism alone: one stage, rank 0 leads and samples, every
  // other rank its peer.
  const RankLayout tp{4, 1};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(tp.stage_of(r), 0);
    EXPECT_EQ(tp.shard_of(r), r);
    EXPECT_TRUE(tp.first_stage(r) && tp.last_stage(r));
  }
  EXPECT_EQ(tp.last_leader(), 0);
  EXPECT_EQ(tp.peers(0), std::vector<int>({1, 2, 3}));
}

TEST(RankLayout, TwoByTwo) {
  const RankLayout l{2, 2};  // the e2e tests' 4 ranks
  EXPECT_EQ(l.last_leader(), 2);
  EXPECT_EQ(l.peers(0), std::vector<int>({1}));
  EXPECT_EQ(l.peers(1), std::vector<int>({3}));
  EXPECT_FALSE(l.is_leader(3));
  EXPECT_EQ(l.stage_of(3), 1);
}

}  // namespace
}  // namespace inferd::distributed
