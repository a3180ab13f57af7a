// ThreadPool: run() reaches every thread, barriers separate phases, and a
// waiting thread does its idle work without being held past the barrier.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace inferd {
namespace {

TEST(ThreadPool, BarriersSeparatePhases) {
  ThreadPool pool(3);
  std::vector<int> written(3, 0);
  std::atomic<int> mismatches{0};
  pool.run([&](int ti, int nt) {
    for (int phase = 1; phase <= 100; ++phase) {
      written[ti] = phase;
      pool.barrier();
      for (int other = 0; other < nt; ++other) mismatches += written[other] != phase;
      pool.barrier();
    }
  });
  EXPECT_EQ(mismatches.load(), 0);
}

// The idle work runs while a thread waits for a slower one, and stops
// counting as work once it reports that it has nothing left.
TEST(ThreadPool, WaitingThreadsDoTheirIdleWork) {
  ThreadPool pool(2);
  struct Work {
    int left = 50;
    int done = 0;
  } work[2];
  auto step = [](void* ctx) {
    auto* w = static_cast<Work*>(ctx);
    if (w->left == 0) return false;
    --w->left;
    ++w->done;
    return true;
  };
  std::atomic<bool> late_passed{false};
  pool.run([&](int ti, int) {
    if (ti == 1) {  // the late thread: the other one waits for it
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      late_passed = true;
    }
    pool.barrier(BarrierIdle{step, &work[ti]});
    EXPECT_TRUE(late_passed.load());
  });
  EXPECT_EQ(work[0].done, 50);  // all of it: it waited 20 ms
  EXPECT_EQ(work[1].done, 0);   // the last to arrive does not wait
}

TEST(ThreadPool, SplitCoversTheRangeOnAlignedBoundaries) {
  for (int nt = 1; nt <= 5; ++nt) {
    int64_t next = 0;
    for (int ti = 0; ti < nt; ++ti) {
      const auto [b, e] = ThreadPool::split(100, ti, nt, 8);
      EXPECT_EQ(b, next);
      EXPECT_TRUE(b % 8 == 0 || b == 100);
      next = e;
    }
    EXPECT_EQ(next, 100);
  }
}

}  // namespace
}  // namespace inferd
