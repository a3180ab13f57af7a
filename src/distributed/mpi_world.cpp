#include "distributed/mpi_world.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace inferd::distributed {

int launched_world_size() {
  // OpenMPI's launcher, then any PMIx-based one (MPICH's hydra sets PMI_SIZE).
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(name); v && *v) return std::max(1, std::atoi(v));
  return 1;
}

Result<std::unique_ptr<MpiWorld>> MpiWorld::init(RankLayout layout) {
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    return make_error("MPI_Init_thread failed");
  std::unique_ptr<MpiWorld> world(new MpiWorld());
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    return make_error("this MPI library does not allow calls from a thread other than the main one "
                      "(MPI_THREAD_SERIALIZED), which the serving engine makes");
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &world->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world->size_);
  world->layout_ = layout;
  MPI_Comm_dup(MPI_COMM_WORLD, &world->pipeline_);
  // A failed call returns its error, which the caller reports with the rank
  // and the call before it aborts (the default would abort without saying).
  MPI_Comm_set_errhandler(world->pipeline_, MPI_ERRORS_RETURN);
  // One communicator per pipeline stage (the whole world without a pipeline).
  MPI_Comm_split(MPI_COMM_WORLD, layout.stage_of(world->rank_), layout.shard_of(world->rank_), &world->tensor_);
  MPI_Comm_set_errhandler(world->tensor_, MPI_ERRORS_RETURN);
  return world;
}

MpiWorld::~MpiWorld() {
  if (pipeline_ != MPI_COMM_NULL) MPI_Comm_free(&pipeline_);
  if (tensor_ != MPI_COMM_NULL) MPI_Comm_free(&tensor_);
  MPI_Finalize();
}

void MpiWorld::abort(int exit_code) const {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

}  // namespace inferd::distributed
