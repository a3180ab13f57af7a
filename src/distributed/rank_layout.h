// Where each of the T x P ranks of a split model sits (vLLM's order): stage s
// of the pipeline is world ranks [s*T, s*T + T), and within a stage rank
// s*T + i holds tensor shard i of that stage's layers. Shard 0 of a stage is
// its leader: it alone talks to the stages before and after it (the step and
// the residual stream in, the stream or the samples out) and hands what it
// receives to its stage's other shards, its peers. Rank 0 is stage 0's leader
// and runs the scheduler. T = 1 is a plain pipeline (every rank a leader),
// P = 1 plain tensor parallelism (rank 0 the only leader). No MPI here: pure
// arithmetic, so that the mapping is tested on its own.
#pragma once
#include <vector>

namespace inferd::distributed {

struct RankLayout {
  int tensor = 1;    // T: shards per stage
  int pipeline = 1;  // P: stages

  int world_size() const { return tensor * pipeline; }
  int stage_of(int rank) const { return rank / tensor; }
  // The tensor shard a rank holds within its stage (its rank on the stage's
  // communicator: MPI_Comm_split by stage, keyed by this).
  int shard_of(int rank) const { return rank % tensor; }
  int leader(int stage) const { return stage * tensor; }
  bool is_leader(int rank) const { return shard_of(rank) == 0; }
  bool first_stage(int rank) const { return stage_of(rank) == 0; }
  bool last_stage(int rank) const { return stage_of(rank) == pipeline - 1; }
  // The leader that samples: the last stage's, where its logits are gathered.
  int last_leader() const { return leader(pipeline - 1); }
  // A stage's ranks other than its leader.
  std::vector<int> peers(int stage) const {
    std::vector<int> out;
    for (int i = 1; i < tensor; ++i) out.push_back(leader(stage) + i);
    return out;
  }
};

}  // namespace inferd::distributed
