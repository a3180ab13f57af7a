// Rank 0 watching the processes of the other ranks. OpenMPI 4 (no ULFM)
// reports no dead peer to the survivors: a receive from a rank that was
// killed waits forever, and mpirun ends the job about a second later with
// SIGTERM and then SIGKILL. So rank 0 watches each rank's process itself
// (a pidfd per rank on its own host: the kernel says at once when it ends)
// and can fail its requests, answer /health and exit with a message naming
// the rank before the runtime's signals arrive.
#pragma once
#include <sys/types.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "distributed/mpi_world.h"

namespace inferd::distributed {

struct RankProcess {
  int rank = 0;
  pid_t pid = 0;
  std::string host;
};

// Every rank's process, gathered on rank 0 (a collective of every rank, once
// at start); empty on the other ranks.
std::vector<RankProcess> gather_rank_processes(const MpiWorld& world);

// "rank 1 (pid 1234 on host)": how the messages name a rank.
std::string describe(const RankProcess& p);

// Watches processes on a thread of its own and calls `on_lost` (on that
// thread, once) with the first one that ends. A process on another host
// cannot be watched from here: it is left to the MPI runtime (unwatched()).
class RankWatcher {
 public:
  using OnLost = std::function<void(const RankProcess&)>;
  RankWatcher(const std::vector<RankProcess>& ranks, OnLost on_lost);
  ~RankWatcher();  // stops watching
  RankWatcher(const RankWatcher&) = delete;
  RankWatcher& operator=(const RankWatcher&) = delete;

  const std::vector<RankProcess>& watched() const { return watched_; }
  const std::vector<RankProcess>& unwatched() const { return unwatched_; }

 private:
  void run();

  std::vector<RankProcess> watched_, unwatched_;
  std::vector<int> pidfds_;  // per watched process
  int stop_fd_ = -1;         // an eventfd: the destructor's wake-up
  OnLost on_lost_;
  std::thread thread_;
};

}  // namespace inferd::distributed
