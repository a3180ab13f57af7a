// WorkShares: every unit of every share is run exactly once, by its owner or
// by a thread that finished its own share first, whatever the shares' sizes
// and however unevenly the threads run.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "core/work_shares.h"

namespace inferd {
namespace {

TEST(WorkShares, OneThreadRunsItsShareFrontToBackThenTheOthersFromTheBack) {
  WorkShares shares;
  shares.resize(1, 2);
  shares.set(0, 0, 0, 8);
  shares.set(0, 1, 8, 12);
  std::vector<std::pair<int64_t, int64_t>> chunks;
  shares.run(0, 0, [&](int64_t u0, int64_t u1) { chunks.emplace_back(u0, u1); });
  // Its own share in shrinking chunks from the front (a quarter of what is
  // left, at least one), then the other share, half of what is left from the back.
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6},
                                                         {6, 7}, {7, 8}, {10, 12}, {9, 10}, {8, 9}};
  EXPECT_EQ(chunks, want);
  // Everything was taken: the owner of the second share finds nothing left.
  int runs = 0;
  shares.run(0, 1, [&](int64_t, int64_t) { ++runs; });
  EXPECT_EQ(runs, 0);
}

TEST(WorkShares, WithoutStealingEachThreadRunsItsWholeShareOnly) {
  WorkShares shares;
  shares.resize(1, 2);
  shares.set(0, 0, 0, 8);
  shares.set(0, 1, 8, 12);
  std::vector<std::pair<int64_t, int64_t>> chunks;
  shares.run(0, 0, [&](int64_t u0, int64_t u1) { chunks.emplace_back(u0, u1); }, /*steal=*/false);
  EXPECT_EQ(chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 8}}));
  chunks.clear();
  shares.run(0, 1, [&](int64_t u0, int64_t u1) { chunks.emplace_back(u0, u1); }, /*steal=*/false);
  EXPECT_EQ(chunks, (std::vector<std::pair<int64_t, int64_t>>{{8, 12}}));
}

TEST(WorkShares, EveryUnitRunsOnceWhenThreadsRunUnevenly) {
  constexpr int kThreads = 4, kSlots = 3;
  std::mt19937 rng(3);
  WorkShares shares;
  shares.resize(kSlots, kThreads);
  for (int round = 0; round < 200; ++round) {
    // Shares of random sizes, some empty, laid end to end per slot.
    std::vector<int64_t> total(kSlots, 0);
    for (int slot = 0; slot < kSlots; ++slot)
      for (int ti = 0; ti < kThreads; ++ti) {
        const int64_t n = std::uniform_int_distribution<int64_t>(0, 40)(rng);
        shares.set(slot, ti, total[slot], total[slot] + n);
        total[slot] += n;
      }
    std::vector<std::vector<std::atomic<int>>> runs(kSlots);
    for (int slot = 0; slot < kSlots; ++slot) runs[slot] = std::vector<std::atomic<int>>(total[slot]);
    std::vector<std::thread> threads;
    for (int ti = 0; ti < kThreads; ++ti)
      threads.emplace_back([&, ti, seed = rng()] {
        std::mt19937 r(seed);
        for (int slot = 0; slot < kSlots; ++slot)
          shares.run(slot, ti, [&](int64_t u0, int64_t u1) {
            for (int64_t u = u0; u < u1; ++u) runs[slot][u].fetch_add(1);
            // Some threads dawdle, so others finish first and steal.
            const int spins = std::uniform_int_distribution<int>(0, 2000)(r) * (ti % 2);
            for (int i = 0; i < spins; ++i) std::atomic_signal_fence(std::memory_order_seq_cst);
          });
      });
    for (std::thread& t : threads) t.join();
    for (int slot = 0; slot < kSlots; ++slot)
      for (int64_t u = 0; u < total[slot]; ++u)
        ASSERT_EQ(runs[slot][u].load(), 1) << "round " << round << ", slot " << slot << ", unit " << u;
  }
}

}  // namespace
}  // namespace inferd
