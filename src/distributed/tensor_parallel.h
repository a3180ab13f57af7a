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

// The collectives of the forward pass, on the world's tensor communicator.
// Counts them and the time spent in them (the wait for the slowest rank
// included: what a step pays).
class MpiTensorComm final : public TensorParallelComm {
 public:
  explicit MpiTensorComm(const MpiWorld& world) : world_(world) {}
  bool root() const override { return world_.rank() == 0; }
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

// Logs the collectives' latency over the run on this rank (at shutdown).
void log_collective_latency(const MpiWorld& world, const MpiTensorComm& comm);

// A rank other than 0: makes its shard's runner (as rank 0's engine makes its
// own, from the same config) and runs each step rank 0 sends until it says
// it is done.
Status run_tensor_parallel_worker(const MpiWorld& world, Model& model, MpiTensorComm& comm, ModelRunnerConfig config);

}  // namespace inferd::distributed
