// KVCacheManager: append-only block tables, allocation that succeeds whole or
// changes nothing, prefix lookup over full blocks only (capped so the last
// token is computed), caching of generated tokens, cache salts, eviction order
// on free, and the invariants that tie reference counts to tables.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace inferd::kv {
namespace {

#define EXPECT_INVARIANTS(m)                             \
  do {                                                   \
    Status s_ = (m).check_invariants();                  \
    EXPECT_TRUE(s_.ok()) << s_.error().message;          \
  } while (0)

std::vector<int32_t> tokens(int32_t n, int32_t first = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

std::vector<int32_t> table(const KVCacheManager& m, const std::string& id) {
  auto s = m.block_table(id);
  return {s.begin(), s.end()};
}

// Allocates and "computes" a whole sequence the way the scheduler would.
void run_sequence(KVCacheManager& m, const std::string& id, const std::vector<int32_t>& t,
                  uint64_t key = 0) {
  const PrefixHit hit = m.get_computed_blocks(t, key);
  const int64_t n = static_cast<int64_t>(t.size()) - hit.num_tokens;
  ASSERT_TRUE(m.allocate_slots(id, 0, n, hit).has_value());
  m.cache_full_blocks(id, t, static_cast<int64_t>(t.size()), key);
}

TEST(KvCacheManager, TablesGrowAppendOnlyByWholeBlocks) {
  KVCacheManager m({.n_blocks = 10, .block_size = 4});
  auto a = m.allocate_slots("a", 0, 5);  // 5 tokens: 2 blocks
  ASSERT_TRUE(a);
  EXPECT_EQ(a->size(), 2u);
  EXPECT_EQ(table(m, "a"), *a);
  EXPECT_EQ(m.num_free_blocks(), 7);

  auto b = m.allocate_slots("a", 5, 3);  // to 8 tokens: still 2 blocks
  ASSERT_TRUE(b);
  EXPECT_TRUE(b->empty());
  auto c = m.allocate_slots("a", 8, 1);  // 9th token: a third block
  ASSERT_TRUE(c);
  ASSERT_EQ(c->size(), 1u);
  std::vector<int32_t> expected = *a;
  expected.push_back((*c)[0]);
  EXPECT_EQ(table(m, "a"), expected);  // earlier entries never move
  EXPECT_INVARIANTS(m);

  m.free("a");
  EXPECT_FALSE(m.holds_blocks("a"));
  EXPECT_TRUE(table(m, "a").empty());
  EXPECT_EQ(m.num_free_blocks(), 9);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, FailedAllocationChangesNothing) {
  KVCacheManager m({.n_blocks = 5, .block_size = 4});  // 4 usable
  ASSERT_TRUE(m.allocate_slots("a", 0, 12));            // 3 blocks
  const std::vector<int32_t> before = table(m, "a");
  EXPECT_FALSE(m.allocate_slots("b", 0, 8).has_value());  // needs 2, 1 free
  EXPECT_FALSE(m.holds_blocks("b"));
  EXPECT_FALSE(m.allocate_slots("a", 12, 5).has_value());  // needs 2 more
  EXPECT_EQ(table(m, "a"), before);
  EXPECT_EQ(m.num_free_blocks(), 1);
  EXPECT_INVARIANTS(m);
  EXPECT_TRUE(m.allocate_slots("a", 12, 4).has_value());  // exactly the last one
  EXPECT_EQ(m.num_free_blocks(), 0);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, PrefixHitsCoverFullBlocksOnlyAndLeaveTheLastTokenToCompute) {
  KVCacheManager m({.n_blocks = 20, .block_size = 4});
  const std::vector<int32_t> t = tokens(10);  // blocks [0,4) [4,8) full, [8,10) partial
  EXPECT_EQ(m.get_computed_blocks(t, 0).num_tokens, 0);
  run_sequence(m, "a", t);
  EXPECT_EQ(m.pool().num_cached_blocks(), 2);  // the partial block is not findable

  // The same 10 tokens: 8 cached.
  PrefixHit hit = m.get_computed_blocks(t, 0);
  EXPECT_EQ(hit.num_tokens, 8);
  const std::vector<int32_t> a_blocks = table(m, "a");
  EXPECT_EQ(hit.blocks[0], std::vector<int32_t>(a_blocks.begin(), a_blocks.begin() + 2));
  EXPECT_EQ(hit.num_queried_tokens, 10);

  // Exactly 8 tokens: both blocks are cached, but the hit stops at one so the
  // 8th token is computed and yields logits.
  EXPECT_EQ(m.get_computed_blocks(tokens(8), 0).num_tokens, 4);
  EXPECT_EQ(m.get_computed_blocks(tokens(9), 0).num_tokens, 8);
  EXPECT_EQ(m.get_computed_blocks(tokens(1), 0).num_tokens, 0);

  // A different token in the first block breaks the chain for the whole prefix.
  std::vector<int32_t> u = t;
  u[1] = 7;
  EXPECT_EQ(m.get_computed_blocks(u, 0).num_tokens, 0);
  // A difference in the second block keeps the first.
  u = t;
  u[5] = 7;
  EXPECT_EQ(m.get_computed_blocks(u, 0).num_tokens, 4);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, SharedBlocksAreReferencedByEveryHolder) {
  KVCacheManager m({.n_blocks = 20, .block_size = 4});
  const std::vector<int32_t> t = tokens(10);
  run_sequence(m, "a", t);
  const int32_t free_before = m.num_free_blocks();
  const PrefixHit hit = m.get_computed_blocks(t, 0);
  auto appended = m.allocate_slots("b", 0, 2, hit);
  ASSERT_TRUE(appended);
  EXPECT_EQ(appended->size(), 3u);  // the two hit blocks, then one fresh
  EXPECT_EQ(m.num_free_blocks(), free_before - 1);
  for (int32_t blk : hit.blocks[0]) EXPECT_EQ(m.pool().ref_count(blk), 2);
  // Counted per admission: "a" (10 queried, 0 hit) and "b" (10 queried, 8 hit).
  EXPECT_EQ(m.prefix_cache_stats().requests, 2);
  EXPECT_EQ(m.prefix_cache_stats().queried_tokens, 20);
  EXPECT_EQ(m.prefix_cache_stats().hit_tokens, 8);
  EXPECT_INVARIANTS(m);

  m.free("a");
  for (int32_t blk : hit.blocks[0]) EXPECT_EQ(m.pool().ref_count(blk), 1);
  m.free("b");
  EXPECT_EQ(m.num_free_blocks(), m.num_usable_blocks());
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, TakingAFreedCachedPrefixCountsAgainstFreeBlocks) {
  KVCacheManager m({.n_blocks = 5, .block_size = 4});  // 4 usable
  const std::vector<int32_t> t = tokens(9);             // 3 blocks, 2 full
  run_sequence(m, "a", t);
  m.free("a");
  EXPECT_EQ(m.num_free_blocks(), 4);
  const PrefixHit hit = m.get_computed_blocks(t, 0);
  ASSERT_EQ(hit.num_tokens, 8);
  // 8 cached + 9 new = 17 tokens = 5 blocks: the 2 free cached ones plus 3
  // fresh is more than the 4 free, even though only 3 are "new".
  EXPECT_FALSE(m.allocate_slots("b", 0, 9, hit).has_value());
  EXPECT_EQ(m.pool().ref_count(hit.blocks[0][0]), 0);
  EXPECT_EQ(m.get_computed_blocks(t, 0).num_tokens, 8);  // the failed try evicted nothing
  // 8 + 8 = 16 tokens = 4 blocks fits, and must not evict the hit itself.
  auto ok = m.allocate_slots("b", 0, 8, hit);
  ASSERT_TRUE(ok);
  EXPECT_EQ(std::vector<int32_t>(ok->begin(), ok->begin() + 2), hit.blocks[0]);
  EXPECT_EQ(m.pool().lookup(hit.hashes[1]), hit.blocks[0][1]);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, GeneratedTokensAreCachedAsTheyFillBlocks) {
  KVCacheManager m({.n_blocks = 20, .block_size = 4});
  std::vector<int32_t> t = tokens(6);
  run_sequence(m, "a", t);
  EXPECT_EQ(m.pool().num_cached_blocks(), 1);
  // Decode: each step appends one token and computes the previous one.
  for (int32_t step = 0; step < 5; ++step) {
    const int64_t computed = static_cast<int64_t>(t.size());
    t.push_back(900 + step);  // sampled
    ASSERT_TRUE(m.allocate_slots("a", computed, 1));
    m.cache_full_blocks("a", t, computed + 1, 0);
    EXPECT_INVARIANTS(m);
  }
  // 11 tokens computed: two full blocks, the second holding generated tokens.
  EXPECT_EQ(m.pool().num_cached_blocks(), 2);
  std::vector<int32_t> resumed = t;
  resumed.push_back(1);
  EXPECT_EQ(m.get_computed_blocks(resumed, 0).num_tokens, 8);
}

TEST(KvCacheManager, CacheSaltsSeparatePrefixes) {
  KVCacheManager m({.n_blocks = 20, .block_size = 4});
  const std::vector<int32_t> t = tokens(9);
  const uint64_t alice = hash_bytes("alice"), bob = hash_bytes("bob");
  run_sequence(m, "a", t, alice);
  EXPECT_EQ(m.get_computed_blocks(t, alice).num_tokens, 8);
  EXPECT_EQ(m.get_computed_blocks(t, bob).num_tokens, 0);
  EXPECT_EQ(m.get_computed_blocks(t, 0).num_tokens, 0);
}

TEST(KvCacheManager, FreeingEvictsTheTailOfASequenceFirst) {
  KVCacheManager m({.n_blocks = 5, .block_size = 2});  // 4 usable
  const std::vector<int32_t> t = tokens(7);             // 3 full blocks + 1 partial
  run_sequence(m, "a", t);
  const std::vector<int32_t> blocks = table(m, "a");
  m.free("a");
  // Partial block first (nothing to keep), then the full ones last-to-first.
  EXPECT_EQ(m.pool().free_list(), (std::vector<int32_t>{blocks[3], blocks[2], blocks[1], blocks[0]}));
  // Needing two blocks evicts the partial one and the third block: the first
  // two blocks of the prefix are still a hit.
  ASSERT_TRUE(m.allocate_slots("b", 0, 4, {}));
  EXPECT_EQ(m.get_computed_blocks(t, 0).num_tokens, 4);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, PrefixCachingCanBeDisabled) {
  KVCacheManager m({.n_blocks = 20, .block_size = 4, .enable_prefix_caching = false});
  const std::vector<int32_t> t = tokens(9);
  run_sequence(m, "a", t);
  EXPECT_EQ(m.pool().num_cached_blocks(), 0);
  const PrefixHit hit = m.get_computed_blocks(t, 0);
  EXPECT_EQ(hit.num_tokens, 0);
  EXPECT_EQ(hit.num_queried_tokens, 0);
  EXPECT_EQ(m.prefix_cache_stats().requests, 0);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, InvariantCheckSeesAMissingTable) {
  // A reference taken behind the manager's back is a leak the check reports.
  KVCacheManager m({.n_blocks = 6, .block_size = 4});
  run_sequence(m, "a", tokens(9));
  EXPECT_INVARIANTS(m);
  const_cast<BlockPool&>(m.pool()).touch(std::vector<int32_t>{m.block_table("a")[0]});
  Status s = m.check_invariants();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("reference count 2 but 1 tables"), std::string::npos)
      << s.error().message;
}

// --- KV groups: one full-attention group and a windowed one (window 6, blocks of 4).

KVCacheConfig windowed(int32_t n_blocks, bool caching = true) {
  return {.n_blocks = n_blocks, .block_size = 4, .enable_prefix_caching = caching, .group_windows = {0, 6}};
}

TEST(KVCacheManager, WindowedGroupNullsBlocksTheNextTokenCannotSee) {
  KVCacheManager m(windowed(40));
  ASSERT_TRUE(m.allocate_slots("a", 0, 20));  // 5 blocks in each group
  EXPECT_EQ(m.num_blocks_held("a"), 10);
  EXPECT_INVARIANTS(m);
  // The token at position 20 sees 15..20: blocks 0-2 (positions 0..11) are out.
  auto b = m.allocate_slots("a", 20, 1);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->size(), 2u);  // a sixth block in each group
  const std::vector<int32_t> w(m.block_table("a", 1).begin(), m.block_table("a", 1).end());
  ASSERT_EQ(w.size(), 6u);
  EXPECT_EQ(std::count(w.begin(), w.end(), BlockPool::kNullBlock), 3);
  EXPECT_EQ(w[0], BlockPool::kNullBlock);
  EXPECT_NE(w[3], BlockPool::kNullBlock);
  EXPECT_EQ(m.block_table("a", 0).size(), 6u);
  EXPECT_EQ(m.num_blocks_held("a"), 6 + 3);
  EXPECT_EQ(m.num_used_blocks(), 9);
  EXPECT_INVARIANTS(m);
  m.free("a");
  EXPECT_EQ(m.num_free_blocks(), m.num_usable_blocks());
  EXPECT_INVARIANTS(m);
}

TEST(KVCacheManager, WindowedBlocksAreGivenBackEvenWhenTheAllocationFails) {
  KVCacheManager m(windowed(11));  // 10 usable
  ASSERT_TRUE(m.allocate_slots("a", 0, 16));  // 4 + 4
  // Position 16 sees 11..16: blocks 0 and 1 of the windowed group go back, so
  // 2 + 2 free blocks are not enough for 3 + 3 more (positions 16..27).
  EXPECT_FALSE(m.allocate_slots("a", 16, 12).has_value());
  EXPECT_EQ(m.num_free_blocks(), 4);
  EXPECT_INVARIANTS(m);
  EXPECT_TRUE(m.allocate_slots("a", 16, 8).has_value());  // 2 + 2
  EXPECT_EQ(m.num_free_blocks(), 0);
  EXPECT_INVARIANTS(m);
}

TEST(KVCacheManager, PrefixHitWithAWindowNeedsOnlyTheBlocksTheWindowReaches) {
  KVCacheManager m(windowed(60));
  const std::vector<int32_t> t = tokens(30);
  run_sequence(m, "a", t);  // 7 full blocks cached in both groups (28 tokens)
  m.free("a");
  PrefixHit hit = m.get_computed_blocks(t, 0);
  ASSERT_EQ(hit.num_tokens, 28);
  ASSERT_EQ(hit.blocks.size(), 2u);
  EXPECT_EQ(hit.blocks[0].size(), 7u);
  // The token at 28 sees 23..28: blocks 5 and 6 of the windowed group.
  ASSERT_EQ(hit.blocks[1].size(), 7u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(hit.blocks[1][i], BlockPool::kNullBlock) << i;
  EXPECT_NE(hit.blocks[1][5], BlockPool::kNullBlock);
  auto got = m.allocate_slots("b", 0, 2, hit);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->size(), 7u + 1 + 2 + 1);  // hit blocks and one fresh block per group
  EXPECT_EQ(m.prefix_cache_stats().hit_tokens, 28);
  EXPECT_INVARIANTS(m);
  m.free("b");

  // Evict the windowed group's block 6 (the cached blocks go from the free
  // list's head): the longest hit whose window is whole is shorter.
  const BlockHash h6 = group_block_hash(hit.hashes[6], 1);
  ASSERT_TRUE(m.pool().lookup(h6).has_value());
  int32_t n_alloc = 0;
  while (m.pool().lookup(h6)) {
    ASSERT_TRUE(m.allocate_slots("filler" + std::to_string(n_alloc), 0, 1));
    ++n_alloc;
  }
  for (int i = 0; i < n_alloc; ++i) m.free("filler" + std::to_string(i));
  PrefixHit shorter = m.get_computed_blocks(t, 0);
  EXPECT_LT(shorter.num_tokens, 28);
  for (int32_t g = 0; g < 2; ++g)
    for (int32_t blk : shorter.blocks[g])
      if (blk != BlockPool::kNullBlock) EXPECT_TRUE(m.pool().block_hash(blk).has_value());
  EXPECT_INVARIANTS(m);
}

TEST(KVCacheManager, MaxBlocksHeldCountsAWindowPerWindowedGroup) {
  const KVCacheConfig c = windowed(100);
  // 100 tokens: 25 blocks in the full group; the windowed group at most
  // (6 + 8 - 2) / 4 + 2 = 5 with steps of 8 tokens.
  EXPECT_EQ(max_blocks_held(c, 100, 8), 25 + 5);
  EXPECT_EQ(max_blocks_held(c, 10, 8), 3 + 3);  // short: no more than the request's blocks
  EXPECT_EQ(max_blocks_held({.n_blocks = 10, .block_size = 4}, 100, 8), 25);
}

}  // namespace
}  // namespace inferd::kv
