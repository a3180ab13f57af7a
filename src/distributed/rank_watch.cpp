#include "distributed/rank_watch.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace inferd::distributed {

namespace {

constexpr int kHostBytes = 256;

std::string this_host() {
  char name[kHostBytes] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

int open_pidfd(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

}  // namespace

std::vector<RankProcess> gather_rank_processes(const MpiWorld& world) {
  // Fixed-size records: a pid and a NUL-padded host name.
  struct Record {
    int64_t pid;
    char host[kHostBytes];
  };
  Record mine{};
  mine.pid = getpid();
  std::strncpy(mine.host, this_host().c_str(), kHostBytes - 1);
  std::vector<Record> all(world.rank() == 0 ? static_cast<size_t>(world.size()) : 0);
  MPI_Gather(&mine, sizeof(Record), MPI_BYTE, all.data(), sizeof(Record), MPI_BYTE, 0, world.pipeline_comm());
  std::vector<RankProcess> out;
  for (size_t r = 0; r < all.size(); ++r)
    out.push_back({static_cast<int>(r), static_cast<pid_t>(all[r].pid), std::string(all[r].host)});
  return out;
}

std::string describe(const RankProcess& p) { return fmt::format("rank {} (pid {} on {})", p.rank, p.pid, p.host); }

RankWatcher::RankWatcher(const std::vector<RankProcess>& ranks, OnLost on_lost) : on_lost_(std::move(on_lost)) {
  const std::string host = this_host();
  for (const RankProcess& p : ranks) {
    const int fd = p.host == host ? open_pidfd(p.pid) : -1;
    // Another host, or no pidfd here (another PID namespace, a kernel before
    // 5.3): left to the MPI runtime.
    if (fd < 0) {
      unwatched_.push_back(p);
      continue;
    }
    watched_.push_back(p);
    pidfds_.push_back(fd);
  }
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  thread_ = std::thread([this] { run(); });
}

RankWatcher::~RankWatcher() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t written = write(stop_fd_, &one, sizeof(one));
  thread_.join();
  for (int fd : pidfds_) close(fd);
  close(stop_fd_);
}

void RankWatcher::run() {
  std::vector<pollfd> fds;
  for (int fd : pidfds_) fds.push_back({fd, POLLIN, 0});
  fds.push_back({stop_fd_, POLLIN, 0});
  for (;;) {
    if (poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR
    if (fds.back().revents != 0) return;
    for (size_t i = 0; i + 1 < fds.size(); ++i)
      if (fds[i].revents != 0) {
        on_lost_(watched_[i]);
        return;
      }
  }
}

}  // namespace inferd::distributed
