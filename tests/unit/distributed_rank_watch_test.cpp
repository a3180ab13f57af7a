// Rank 0's watch over the other ranks' processes (distributed/rank_watch.h),
// on real child processes: the one that ends is named, once; processes that
// live on are never reported; one on another host is left unwatched.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "distributed/rank_watch.h"

namespace inferd::distributed {
namespace {

std::string host() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

pid_t sleeper() {
  const pid_t pid = fork();
  if (pid == 0) {
    for (;;) pause();
  }
  return pid;
}

struct Reports {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<RankProcess> lost;
  bool wait_for_one(std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return !lost.empty(); });
  }
};

TEST(RankWatcher, NamesTheRankWhoseProcessEnds) {
  const pid_t a = sleeper(), b = sleeper();
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  Reports reports;
  {
    RankWatcher watcher({{1, a, host()}, {2, b, host()}, {3, 1, "another-host.invalid"}}, [&](const RankProcess& p) {
      std::lock_guard<std::mutex> lock(reports.mu);
      reports.lost.push_back(p);
      reports.cv.notify_all();
    });
    ASSERT_EQ(watcher.watched().size(), 2u);
    ASSERT_EQ(watcher.unwatched().size(), 1u);
    EXPECT_EQ(watcher.unwatched()[0].rank, 3);
    // Both alive: nothing reported.
    EXPECT_FALSE(reports.wait_for_one(std::chrono::seconds(0)));
    kill(b, SIGKILL);
    ASSERT_TRUE(reports.wait_for_one(std::chrono::seconds(10)));
    waitpid(b, nullptr, 0);
    // Once only, even though the other ends too.
    kill(a, SIGKILL);
    waitpid(a, nullptr, 0);
  }
  ASSERT_EQ(reports.lost.size(), 1u);
  EXPECT_EQ(reports.lost[0].rank, 2);
  EXPECT_EQ(reports.lost[0].pid, b);
  EXPECT_EQ(describe(reports.lost[0]), "rank 2 (pid " + std::to_string(b) + " on " + host() + ")");
}

TEST(RankWatcher, StopsQuietlyWhileEveryProcessLives) {
  const pid_t a = sleeper();
  ASSERT_GT(a, 0);
  int reported = 0;
  {
    RankWatcher watcher({{1, a, host()}}, [&](const RankProcess&) { ++reported; });
  }  // stopped before the process ends: its end is not news
  kill(a, SIGKILL);
  waitpid(a, nullptr, 0);
  EXPECT_EQ(reported, 0);
}

}  // namespace
}  // namespace inferd::distributed
