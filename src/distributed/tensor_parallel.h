// Tensor parallelism over MPI: every rank runs every layer on its shard of
// the weights (model/tensor_shard.h). Per step, rank 0 sends the other ranks
// the step (step_codec.h, without sampling state: rank 0 samples), and every
// rank runs the same forward pass, meeting the others in four MPI_Allgatherv a
// layer (the heads' outputs, attn_output's rows, the activated FFN hidden,
// ffn_down's rows; a mixture-of-experts layer gathers its experts' output
// rows instead of the last two, and a shared expert's two as the FFN's) and
// in one MPI_Gatherv of the LM head's logits to rank 0.
// Rank 0 owns the scheduler and the KV block allocation; every rank's cache
// has the same blocks (agreed once at start) for its own KV heads.
//
// With a pipeline too (rank_layout.h), each stage is such a group of T ranks
// over that stage's layers, meeting on a communicator of its own; its leader
// gets the step (and after the first stage the residual stream) from the
// stage before and hands both to its peers before its own pass. The ranks of
// a stage before the last all end with the same stream (the gathered
// residual); the leader's goes on. The last stage's logits are gathered to
// its leader, which samples.
#pragma once
#include <chrono>
#include <cstdint>
#include <vector>

#include "distributed/mpi_world.h"
#include "engine/model_runner.h"
#include "engine/tensor_parallel_link.h"
#include "model/model.h"
#include "model/tensor_parallel_comm.h"

namespace inferd::distributed {

// The collectives of the forward pass, on this rank's stage's communicator
// (MpiWorld::tensor_comm: the whole world without a pipeline).
// Counts them and the time spent in them (the wait for the slowest rank
// included: what a step pays).
class MpiTensorComm final : public TensorParallelComm {
 public:
  explicit MpiTensorComm(const MpiWorld& world) : world_(world) {}
  bool root() const override { return world_.tensor_rank() == 0; }
  void all_gather_columns(const float* part, int64_t rows, float* whole, const ShardSplit& split) override {
    gather(part, rows, whole, split, /*to_all=*/true);
  }
  void gather_columns(const float* part, int64_t rows, float* whole, const ShardSplit& split) override {
    gather(part, rows, whole, split, /*to_all=*/false);
  }
  void all_gather_rows(float* rows, int64_t width, const ShardSplit& split) override;

  using Stats = CollectiveStats;
  // Since the start, and since the last take_step_stats() (a step's).
  Stats total() const { return total_; }
  Stats take_step_stats() {
    const Stats s = step_;
    step_ = {};
    return s;
  }

 private:
  void gather(const float* part, int64_t rows, float* whole, const ShardSplit& split, bool to_all);
  void count(std::chrono::steady_clock::time_point start);

  const MpiWorld& world_;
  Stats total_, step_;
  std::vector<int> counts_, displs_;  // the gathers', reused
  std::vector<float> staged_;         // rank-major, before the columns are put in place
};

// Rank 0's side (engine/tensor_parallel_link.h).
class MpiTensorParallelLink final : public TensorParallelLink {
 public:
  MpiTensorParallelLink(const MpiWorld& world, std::shared_ptr<MpiTensorComm> comm)
      : world_(world), comm_(std::move(comm)) {}
  ~MpiTensorParallelLink() override { shutdown(); }
  // Tells the other ranks to end their loops (once; the destructor does it if
  // nobody did), and logs the collectives' latency over the run.
  void shutdown();

  int32_t agree_on_blocks(int32_t local) override;
  void send_step(const SchedulerOutput& out) override;
  CollectiveStats collective_stats() const override { return comm_->total(); }

 private:
  const MpiWorld& world_;
  std::shared_ptr<MpiTensorComm> comm_;
  std::vector<uint8_t> bytes_;  // reused
  bool shut_down_ = false;
};

// A stage's leader: the step's bytes, and the residual stream when the
// stage is not the first, to each of its peers.
void hand_to_peers(const MpiWorld& world, const std::vector<uint8_t>& step, const std::vector<float>* hidden);

// Logs the collectives' latency over the run on this rank (at shutdown).
void log_collective_latency(const MpiWorld& world, const MpiTensorComm& comm);

// A peer (a rank other than its stage's leader): makes its shard's runner (as
// rank 0's engine makes its own, from the same config) and runs each step its
// leader hands it until the leader says it is done.
Status run_tensor_parallel_worker(const MpiWorld& world, Model& model, MpiTensorComm& comm, ModelRunnerConfig config);

}  // namespace inferd::distributed
