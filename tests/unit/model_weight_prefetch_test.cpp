// WeightPrefetcher's accounting: how far ahead of the reading it has gone, and
// that it neither runs past its lead nor goes back over what has been read.
#include "model/weight_prefetch.h"

#include <gtest/gtest.h>

#include <vector>

namespace inferd {
namespace {

// A prefetcher over `memory` as two ranges of half its size each.
void add_two_halves(WeightPrefetcher& pf, std::vector<uint8_t>& memory) {
  pf.add(memory.data(), memory.size() / 2);
  pf.add(memory.data() + memory.size() / 2, memory.size() / 2);
}

TEST(WeightPrefetcher, StopsAtTheLeadAndGoesOnAsRangesAreRead) {
  std::vector<uint8_t> memory(4096);
  WeightPrefetcher pf;
  pf.add(memory.data(), 1000);         // 16 lines, the last one 40 bytes
  pf.add(memory.data() + 1024, 0);     // a projection this thread has no share of
  pf.add(memory.data() + 1024, 2000);
  EXPECT_EQ(pf.size(), 3u);

  // 1000 bytes of range 0, then one line of range 2 takes it to the lead.
  EXPECT_TRUE(pf.advance(100, 1024));
  EXPECT_EQ(pf.ahead(), 1000u + 64u);
  EXPECT_FALSE(pf.advance(100, 1024));  // at the lead: nothing to do
  EXPECT_EQ(pf.ahead(), 1064u);

  pf.read_first(1);  // range 0 read: only range 2's line is ahead now
  EXPECT_EQ(pf.ahead(), 64u);
  EXPECT_TRUE(pf.advance(2, 1024));  // at most `lines` lines per call
  EXPECT_EQ(pf.ahead(), 192u);
  EXPECT_TRUE(pf.advance(1000, 1 << 20));  // the rest of range 2
  EXPECT_EQ(pf.ahead(), 2000u);
  EXPECT_FALSE(pf.advance(1000, 1 << 20));  // everything prefetched

  pf.read_first(3);
  EXPECT_EQ(pf.ahead(), 0u);
}

TEST(WeightPrefetcher, SkipsWhatWasReadBeforeItGotThere) {
  std::vector<uint8_t> memory(8192);
  WeightPrefetcher pf;
  add_two_halves(pf, memory);
  ASSERT_TRUE(pf.advance(2, 1 << 20));
  EXPECT_EQ(pf.ahead(), 128u);
  pf.read_first(1);  // range 0 was read while the cursor was still in it
  EXPECT_EQ(pf.ahead(), 0u);
  ASSERT_TRUE(pf.advance(64, 1 << 20));  // the cursor goes on in range 1
  EXPECT_EQ(pf.ahead(), 4096u);
  EXPECT_FALSE(pf.advance(1, 1 << 20));
}

TEST(WeightPrefetcher, ClearStartsAnewStep) {
  std::vector<uint8_t> memory(1024);
  WeightPrefetcher pf;
  pf.add(memory.data(), 1024);
  ASSERT_TRUE(pf.advance(16, 1 << 20));
  pf.clear();
  EXPECT_EQ(pf.size(), 0u);
  EXPECT_EQ(pf.ahead(), 0u);
  EXPECT_FALSE(pf.advance(16, 1 << 20));
  pf.add(memory.data(), 1024);
  EXPECT_TRUE(pf.advance(16, 1 << 20));
  EXPECT_EQ(pf.ahead(), 1024u);
}

TEST(WeightPrefetcher, RestartKeepsTheRangesForTheNextStep) {
  std::vector<uint8_t> memory(2048);
  WeightPrefetcher pf;
  add_two_halves(pf, memory);
  ASSERT_TRUE(pf.advance(1000, 1 << 20));
  pf.read_first(2);
  EXPECT_FALSE(pf.advance(1, 1 << 20));  // this step has nothing left
  pf.restart();
  EXPECT_EQ(pf.size(), 2u);
  EXPECT_EQ(pf.ahead(), 0u);
  EXPECT_TRUE(pf.advance(1000, 1 << 20));  // the next step prefetches both ranges again
  EXPECT_EQ(pf.ahead(), 2048u);
}

}  // namespace
}  // namespace inferd
