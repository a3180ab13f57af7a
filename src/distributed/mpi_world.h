// The MPI world of a model split across processes (Debian's OpenMPI: shared
// memory within a machine, TCP between machines). `mpirun -np N inferd ...`
// starts the ranks; rank 0 serves, the others run their stage. MPI is only
// started when a run asks for more than one process: a single process never
// calls into it.
#pragma once
#include <mpi.h>

#include <memory>

#include "core/result.h"
#include "distributed/rank_layout.h"

namespace inferd::distributed {

// The processes the launcher started, from its environment (1 when this
// process was not started by mpirun), read before MPI is started.
int launched_world_size();

class MpiWorld {
 public:
  // Starts MPI with the ranks laid out as `layout` (its world size is the
  // launched one: check_parallel_sizes). The serving engine calls MPI from its
  // own thread (one thread at a time), so MPI_THREAD_SERIALIZED is required.
  static Result<std::unique_ptr<MpiWorld>> init(RankLayout layout);
  ~MpiWorld();  // MPI_Finalize
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const RankLayout& layout() const { return layout_; }
  // The point-to-point messages (steps, streams, samples) between any two
  // ranks, in world ranks, go on a communicator of their own.
  MPI_Comm pipeline_comm() const { return pipeline_; }
  // Tensor parallelism's collectives inside the forward pass go on another,
  // so that they never match a step message: this rank's stage's ranks only
  // (MPI_Comm_split by stage), ranked by their shard.
  MPI_Comm tensor_comm() const { return tensor_; }
  int tensor_rank() const { return layout_.shard_of(rank_); }
  int tensor_size() const { return layout_.tensor; }
  // Ends every rank at once (a failure after the ranks started to depend on
  // each other, where a clean exit of one would leave the others waiting).
  [[noreturn]] void abort(int exit_code) const;

 private:
  MpiWorld() = default;
  int rank_ = 0, size_ = 1;
  RankLayout layout_;
  MPI_Comm pipeline_ = MPI_COMM_NULL;
  MPI_Comm tensor_ = MPI_COMM_NULL;
};

}  // namespace inferd::distributed
