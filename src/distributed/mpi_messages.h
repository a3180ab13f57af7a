// Point-to-point messages between ranks on the world's message communicator
// (MpiWorld::pipeline_comm), shared by the pipeline and tensor parallelism.
// A failed call leaves the ranks out of step: it ends them all, saying which.
#pragma once
#include <spdlog/spdlog.h>

#include <string>
#include <vector>

#include "distributed/mpi_world.h"

namespace inferd::distributed {

inline void check(const MpiWorld& world, int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  spdlog::critical("rank {}: {} failed: {}; ending every rank", world.rank(), what, std::string(text, len));
  world.abort(1);
}

template <typename T>
void send(const MpiWorld& world, const std::vector<T>& data, int dest, int tag, const char* what) {
  check(world, MPI_Send(data.data(), static_cast<int>(data.size() * sizeof(T)), MPI_BYTE, dest, tag,
                        world.pipeline_comm()),
        what);
}

// A message of any length: its size from MPI_Probe.
template <typename T>
void receive(const MpiWorld& world, std::vector<T>& data, int source, int tag, const char* what) {
  MPI_Status status;
  check(world, MPI_Probe(source, tag, world.pipeline_comm(), &status), what);
  int bytes = 0;
  MPI_Get_count(&status, MPI_BYTE, &bytes);
  data.resize(static_cast<size_t>(bytes) / sizeof(T));
  check(world, MPI_Recv(data.data(), bytes, MPI_BYTE, source, tag, world.pipeline_comm(), MPI_STATUS_IGNORE), what);
}

}  // namespace inferd::distributed
