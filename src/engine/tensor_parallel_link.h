// The seam between rank 0's model runner and the other ranks of a
// tensor-parallel model (distributed/tensor_parallel.h carries it over MPI).
// Every rank runs every layer on its shard of each step: rank 0 tells the
// others what the step runs before its own pass, and the passes meet in their
// all-gathers (model/tensor_parallel_comm.h). Sampling stays on rank 0, where
// the gathered logits are.
#pragma once
#include <cstdint>

#include "engine/scheduler_output.h"

namespace inferd {

// The collectives of the forward passes so far on this rank: the layers'
// all-gathers and the logits' gather (each one's time includes the wait for
// the slowest rank: what a step pays).
struct CollectiveStats {
  int64_t calls = 0;
  double seconds = 0.0;
  double mean_us() const { return calls > 0 ? seconds * 1e6 / static_cast<double>(calls) : 0.0; }
};

class TensorParallelLink {
 public:
  virtual ~TensorParallelLink() = default;
  // The KV block count every rank can hold: the least of the ranks' `local`
  // counts (a collective: each rank offers its own once, at start).
  virtual int32_t agree_on_blocks(int32_t local) = 0;
  // Sends the step to every other rank, before rank 0 runs its own pass.
  virtual void send_step(const SchedulerOutput& out) = 0;
  // Read between steps (the engine's thread, after the pass).
  virtual CollectiveStats collective_stats() const = 0;
};

}  // namespace inferd
