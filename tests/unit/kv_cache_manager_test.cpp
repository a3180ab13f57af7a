// KVCacheManager: append-only block tables, allocation that succeeds whole or
// changes nothing, prefix lookup over full blocks only (capped so the last
// token is computed), caching of generated tokens, cache salts, eviction order
// on free, and the invariants that tie reference counts to tables; beam
// search's forks, which share blocks, and copy on write of the partial one.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
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

// --- Forks (beam search): shared blocks and copy on write.

TEST(KvCacheManager, ForkSharesTheParentsBlocksByReference) {
  KVCacheManager m({.n_blocks = 20, .block_size = 4});
  const std::vector<int32_t> t = tokens(10);  // 2 full blocks + a partial one
  run_sequence(m, "p", t);
  const std::vector<int32_t> parent = table(m, "p");
  const int32_t free_before = m.num_free_blocks();
  m.fork("p", "c", 10);
  EXPECT_EQ(table(m, "c"), parent);
  EXPECT_EQ(m.num_free_blocks(), free_before);  // nothing allocated, nothing copied
  for (int32_t b : parent) EXPECT_EQ(m.pool().ref_count(b), 2);
  EXPECT_INVARIANTS(m);  // the child's hashes agree with the shared full blocks

  // A shorter fork takes only the blocks its tokens need.
  m.fork("p", "d", 8);
  EXPECT_EQ(table(m, "d"), std::vector<int32_t>(parent.begin(), parent.begin() + 2));
  EXPECT_EQ(m.pool().ref_count(parent[2]), 2);
  EXPECT_INVARIANTS(m);

  // The shared blocks outlive any one holder.
  m.free("p");
  for (int32_t b : parent) EXPECT_GE(m.pool().ref_count(b), 1);
  m.free("c");
  EXPECT_EQ(m.pool().ref_count(parent[2]), 0);
  m.free("d");
  EXPECT_EQ(m.num_free_blocks(), m.num_usable_blocks());
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, TheFirstWriteOfASharedPartialBlockCopiesItAndTheLastWritesInPlace) {
  KVCacheManager m({.n_blocks = 20, .block_size = 4});
  std::vector<int32_t> t = tokens(10);
  run_sequence(m, "p", t);
  const std::vector<int32_t> parent = table(m, "p");
  m.fork("p", "c", 10);
  m.fork("p", "d", 10);
  EXPECT_EQ(m.pool().ref_count(parent[2]), 3);

  std::vector<BlockCopy> copies;
  auto appended = m.allocate_slots("c", 10, 1, {}, &copies);  // position 10 is in the shared block 2
  ASSERT_TRUE(appended);
  EXPECT_TRUE(appended->empty());  // a copy replaces an entry; nothing is appended
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, parent[2]);
  const std::vector<int32_t> c = table(m, "c");
  EXPECT_EQ(copies[0].dst, c[2]);
  EXPECT_NE(c[2], parent[2]);
  EXPECT_EQ(std::vector<int32_t>(c.begin(), c.begin() + 2), std::vector<int32_t>(parent.begin(), parent.begin() + 2));
  EXPECT_EQ(m.pool().ref_count(c[2]), 1);
  EXPECT_EQ(m.pool().ref_count(parent[2]), 2);
  EXPECT_INVARIANTS(m);

  ASSERT_TRUE(m.allocate_slots("d", 10, 1, {}, &copies));
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[1].src, parent[2]);
  EXPECT_EQ(m.pool().ref_count(parent[2]), 1);
  // The parent is the last holder: it writes its block in place.
  ASSERT_TRUE(m.allocate_slots("p", 10, 1, {}, &copies));
  EXPECT_EQ(copies.size(), 2u);
  EXPECT_EQ(table(m, "p"), parent);
  EXPECT_INVARIANTS(m);

  // Writing again where it already wrote (a step computed again) copies nothing.
  ASSERT_TRUE(m.allocate_slots("c", 10, 1, {}, &copies));
  EXPECT_EQ(copies.size(), 2u);
  for (const char* id : {"p", "c", "d"}) m.free(id);
  EXPECT_EQ(m.num_free_blocks(), m.num_usable_blocks());
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, AForkAtABlockBoundaryNeverCopies) {
  KVCacheManager m({.n_blocks = 20, .block_size = 4});
  run_sequence(m, "p", tokens(8));
  m.fork("p", "c", 8);
  std::vector<BlockCopy> copies;
  auto a = m.allocate_slots("c", 8, 1, {}, &copies);  // position 8 opens block 2
  ASSERT_TRUE(a);
  EXPECT_EQ(a->size(), 1u);
  auto b = m.allocate_slots("p", 8, 1, {}, &copies);
  ASSERT_TRUE(b);
  EXPECT_NE((*a)[0], (*b)[0]);
  EXPECT_TRUE(copies.empty());
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, ACopyThatFindsNoFreeBlockChangesNothing) {
  KVCacheManager m({.n_blocks = 4, .block_size = 4});  // 3 usable
  run_sequence(m, "p", tokens(6));                      // 2 blocks
  m.fork("p", "c", 6);
  ASSERT_TRUE(m.allocate_slots("x", 0, 1));  // the last free block
  const std::vector<int32_t> before = table(m, "c");
  std::vector<BlockCopy> copies;
  EXPECT_FALSE(m.allocate_slots("c", 6, 1, {}, &copies).has_value());
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(table(m, "c"), before);
  EXPECT_EQ(m.pool().ref_count(before[1]), 2);
  EXPECT_INVARIANTS(m);
  m.free("x");
  ASSERT_TRUE(m.allocate_slots("c", 6, 1, {}, &copies).has_value());
  EXPECT_EQ(copies.size(), 1u);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManager, AForkedChildCachesItsOwnFullBlocksChainedOnTheParents) {
  KVCacheManager m({.n_blocks = 20, .block_size = 4});
  std::vector<int32_t> p = tokens(6);
  run_sequence(m, "p", p);
  m.fork("p", "c", 6);
  std::vector<int32_t> c = p;
  std::vector<BlockCopy> copies;
  // Each writes positions 6 and 7 with tokens of its own, filling block 1.
  for (int32_t i = 0; i < 2; ++i) {
    p.push_back(500 + i);
    c.push_back(600 + i);
    ASSERT_TRUE(m.allocate_slots("p", 6 + i, 1, {}, &copies));
    ASSERT_TRUE(m.allocate_slots("c", 6 + i, 1, {}, &copies));
    m.cache_full_blocks("p", p, 7 + i, 0);
    m.cache_full_blocks("c", c, 7 + i, 0);
  }
  EXPECT_EQ(copies.size(), 1u);
  EXPECT_INVARIANTS(m);
  // Both 8-token prefixes are findable, each in its own block.
  p.push_back(1);
  c.push_back(1);
  const PrefixHit hp = m.get_computed_blocks(p, 0), hc = m.get_computed_blocks(c, 0);
  ASSERT_EQ(hp.num_tokens, 8);
  ASSERT_EQ(hc.num_tokens, 8);
  EXPECT_EQ(hp.blocks[0][0], hc.blocks[0][0]);
  EXPECT_NE(hp.blocks[0][1], hc.blocks[0][1]);
  const std::vector<int32_t> tp = table(m, "p"), tc = table(m, "c");
  EXPECT_EQ(hp.blocks[0], std::vector<int32_t>(tp.begin(), tp.begin() + 2));
  EXPECT_EQ(hc.blocks[0], std::vector<int32_t>(tc.begin(), tc.begin() + 2));
}

TEST(KvCacheManagerDeathTest, WritingASharedBlockWithoutTakingCopiesIsAContractViolation) {
  KVCacheManager m({.n_blocks = 10, .block_size = 4});
  run_sequence(m, "p", tokens(6));
  m.fork("p", "c", 6);
  EXPECT_DEATH((void)m.allocate_slots("c", 6, 1), "caller takes no copies");
}

// Random forks, decodes, new sequences (with shared prefixes) and frees over a
// fake cache that stores each slot's token: after every operation every
// request must read its own tokens back through its tables, so a write into a
// block another request still reads, or a copy not made, shows. At the end
// every reference count is zero.
void randomized_forks(const KVCacheConfig& config, uint32_t seed) {
  KVCacheManager m(config);
  const int64_t bs = config.block_size;
  std::vector<int32_t> slot_token(static_cast<size_t>(config.n_blocks * bs), -1);
  struct Seq {
    std::vector<int32_t> tokens;  // every one computed
  };
  std::map<std::string, Seq> live;
  std::mt19937 rng(seed);
  int next_id = 0;
  int64_t n_copies = 0, n_forks = 0, n_failed = 0;

  auto write = [&](const std::string& id, int64_t pos, int32_t token) {
    for (int32_t g = 0; g < m.num_groups(); ++g) {
      const std::span<const int32_t> t = m.block_table(id, g);
      const int32_t b = t[pos / bs];
      ASSERT_NE(b, BlockPool::kNullBlock);
      ASSERT_EQ(m.pool().ref_count(b), 1) << "writing a block another request holds";
      slot_token[static_cast<size_t>(b * bs + pos % bs)] = token;
    }
  };
  auto check_all = [&] {
    EXPECT_INVARIANTS(m);
    for (const auto& [id, seq] : live) {
      const int64_t n = static_cast<int64_t>(seq.tokens.size());
      for (int32_t g = 0; g < m.num_groups(); ++g) {
        const std::span<const int32_t> t = m.block_table(id, g);
        const int64_t w = config.window(g);
        // What the next token may still read: all of it, or its window.
        for (int64_t q = w > 0 ? std::max<int64_t>(0, n + 1 - w) : 0; q < n; ++q) {
          const int32_t b = t[q / bs];
          ASSERT_NE(b, BlockPool::kNullBlock) << id << " lost position " << q;
          ASSERT_EQ(slot_token[static_cast<size_t>(b * bs + q % bs)], seq.tokens[q])
              << id << " (group " << g << ") reads another token at " << q;
        }
      }
    }
  };

  for (int op = 0; op < 3000; ++op) {
    const int kind = static_cast<int>(rng() % 10);
    auto pick = [&]() -> std::string {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      return it->first;
    };
    if (live.empty() || kind < 2) {  // a new sequence, often sharing a prefix with earlier ones
      const std::string id = "s" + std::to_string(next_id++);
      std::vector<int32_t> t(1 + rng() % 14);
      for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>(i < 6 ? rng() % 2 : rng() % 50);
      const PrefixHit hit = m.get_computed_blocks(t, 0);
      const int64_t n = static_cast<int64_t>(t.size()) - hit.num_tokens;
      if (!m.allocate_slots(id, 0, n, hit)) {
        ++n_failed;
        continue;
      }
      for (int64_t p = hit.num_tokens; p < static_cast<int64_t>(t.size()); ++p) write(id, p, t[p]);
      m.cache_full_blocks(id, t, static_cast<int64_t>(t.size()), 0);
      live[id].tokens = t;
    } else if (kind < 6) {  // a decode: one more token
      const std::string id = pick();
      Seq& seq = live[id];
      const int64_t n = static_cast<int64_t>(seq.tokens.size());
      std::vector<BlockCopy> copies;
      const std::vector<int32_t> before(m.block_table(id).begin(), m.block_table(id).end());
      if (!m.allocate_slots(id, n, 1, {}, &copies)) {
        ++n_failed;
        EXPECT_TRUE(copies.empty());
        EXPECT_EQ(std::vector<int32_t>(m.block_table(id).begin(), m.block_table(id).begin() + before.size()), before);
        continue;
      }
      // The runner's part: copy, then write.
      for (const BlockCopy& c : copies)
        std::copy_n(slot_token.begin() + c.src * bs, bs, slot_token.begin() + c.dst * bs);
      n_copies += static_cast<int64_t>(copies.size());
      seq.tokens.push_back(static_cast<int32_t>(rng() % 50));
      write(id, n, seq.tokens.back());
      m.cache_full_blocks(id, seq.tokens, n + 1, 0);
    } else if (kind < 8) {  // a fork
      const std::string parent = pick();
      const std::string id = "s" + std::to_string(next_id++);
      m.fork(parent, id, static_cast<int64_t>(live[parent].tokens.size()));
      live[id] = live[parent];
      ++n_forks;
    } else {
      const std::string id = pick();
      m.free(id);
      live.erase(id);
    }
    check_all();
    if (testing::Test::HasFailure()) return;
  }
  for (const auto& [id, seq] : live) m.free(id);
  for (int32_t b = 0; b < m.pool().num_blocks(); ++b) EXPECT_EQ(m.pool().ref_count(b), 0) << "block " << b;
  EXPECT_EQ(m.num_free_blocks(), m.num_usable_blocks());
  EXPECT_EQ(m.num_requests(), 0);
  EXPECT_INVARIANTS(m);
  // The run exercised what it is about.
  EXPECT_GT(n_forks, 100);
  EXPECT_GT(n_copies, 20);
  EXPECT_GT(n_failed, 0);
}

TEST(KvCacheManager, RandomizedForksDecodesAndFreesKeepEveryReaderCorrectAndEndAtZero) {
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    randomized_forks({.n_blocks = 40, .block_size = 4}, seed);
    randomized_forks({.n_blocks = 40, .block_size = 4, .enable_prefix_caching = false}, seed);
  }
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

TEST(KVCacheManager, RandomizedForksWithAWindowedGroupKeepEveryReaderCorrectAndEndAtZero) {
  for (uint32_t seed = 1; seed <= 3; ++seed) randomized_forks(windowed(60), seed);
}


// --- Recurrent state slots (hybrid models: Gated DeltaNet beside attention).

KVCacheConfig hybrid(int32_t n_blocks, int32_t n_slots) {
  return {.n_blocks = n_blocks, .block_size = 4, .enable_prefix_caching = true, .group_windows = {},
          .n_state_slots = n_slots};
}

TEST(KvCacheManagerStateSlots, AFirstAllocationTakesASlotAndFreeReturnsIt) {
  KVCacheManager m(hybrid(20, 2));
  EXPECT_TRUE(m.has_state_slots());
  EXPECT_EQ(m.num_free_state_slots(), 2);
  ASSERT_TRUE(m.allocate_slots("a", 0, 5).has_value());
  EXPECT_EQ(m.state_slot("a"), 0);
  ASSERT_TRUE(m.allocate_slots("a", 5, 4).has_value());  // growing keeps the slot
  EXPECT_EQ(m.state_slot("a"), 0);
  ASSERT_TRUE(m.allocate_slots("b", 0, 3).has_value());
  EXPECT_EQ(m.state_slot("b"), 1);
  EXPECT_EQ(m.num_free_state_slots(), 0);
  EXPECT_INVARIANTS(m);
  m.free("a");
  EXPECT_FALSE(m.state_slot("a").has_value());
  EXPECT_EQ(m.num_free_state_slots(), 1);
  ASSERT_TRUE(m.allocate_slots("c", 0, 3).has_value());
  EXPECT_EQ(m.state_slot("c"), 0);  // the lowest free slot
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManagerStateSlots, NoFreeSlotFailsTheAllocationAndChangesNothing) {
  KVCacheManager m(hybrid(20, 1));
  ASSERT_TRUE(m.allocate_slots("a", 0, 5).has_value());
  const int32_t free_blocks = m.num_free_blocks();
  EXPECT_FALSE(m.allocate_slots("b", 0, 3).has_value());  // blocks to spare, but no slot
  EXPECT_FALSE(m.holds_blocks("b"));
  EXPECT_EQ(m.num_free_blocks(), free_blocks);
  EXPECT_INVARIANTS(m);
  // Running requests still grow: they hold their slot already.
  EXPECT_TRUE(m.allocate_slots("a", 5, 8).has_value());
  m.free("a");
  EXPECT_TRUE(m.allocate_slots("b", 0, 3).has_value());
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManagerStateSlots, NoBlocksFailsTheAllocationWithoutTakingASlot) {
  KVCacheManager m(hybrid(3, 4));  // two usable blocks
  EXPECT_FALSE(m.allocate_slots("a", 0, 12).has_value());
  EXPECT_EQ(m.num_free_state_slots(), 4);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManagerStateSlots, PrefixCachingIsOffForAHybridCacheWithoutSnapshots) {
  KVCacheManager m(hybrid(20, 2));
  EXPECT_FALSE(m.prefix_caching_enabled());
  const std::vector<int32_t> t = tokens(9);
  run_sequence(m, "a", t);
  m.free("a");
  const PrefixHit hit = m.get_computed_blocks(t, 0);
  EXPECT_EQ(hit.num_tokens, 0);  // the blocks would come without their state
  EXPECT_EQ(m.pool().num_cached_blocks(), 0);
  EXPECT_INVARIANTS(m);
}

// --- State snapshots: prefix caching beside recurrent layers.

KVCacheConfig hybrid_cached(int32_t n_blocks, int32_t n_slots, int32_t n_snapshots, int64_t interval,
                            int32_t checkpoints = 0) {
  KVCacheConfig c = hybrid(n_blocks, n_slots);
  c.n_state_snapshots = n_snapshots;
  c.state_snapshot_interval = interval;
  c.state_checkpoints = checkpoints;
  return c;
}

// One step of a request over [begin, end) of t, as the scheduler runs it:
// slots, snapshot reservations, then (after the pass) the hashes.
std::vector<StateSave> step(KVCacheManager& m, const std::string& id, const std::vector<int32_t>& t, int64_t begin,
                            int64_t end, int64_t prompt, const PrefixHit& hit = {}) {
  EXPECT_TRUE(m.allocate_slots(id, begin, end - begin - hit.num_tokens, hit).has_value());
  std::vector<StateSave> saves = m.reserve_state_snapshots(id, begin, end, prompt);
  m.cache_full_blocks(id, t, end, 0);
  return saves;
}

TEST(KvCacheManagerStateSnapshots, SlotsAreNumberedAfterTheRunningSlotsAndCheckpoints) {
  KVCacheManager m(hybrid_cached(40, 3, 5, 8, /*checkpoints=*/1));
  EXPECT_TRUE(m.prefix_caching_enabled());
  EXPECT_EQ(m.num_state_slots_in_cache(), 3 + 3 + 5);
  EXPECT_EQ(state_slots_in_cache(hybrid_cached(40, 3, 5, 8, 1)), 11);
  ASSERT_TRUE(m.allocate_slots("a", 0, 5));
  ASSERT_TRUE(m.allocate_slots("b", 0, 5));
  EXPECT_EQ(m.state_checkpoint_slot("b"), 3 + 1);
  const std::vector<StateSave> saves = m.reserve_state_snapshots("a", 0, 5, 5);
  ASSERT_EQ(saves.size(), 1u);
  EXPECT_EQ(saves[0], (StateSave{4, 6}));  // the prompt's last full block; the first snapshot slot
  EXPECT_FALSE(KVCacheManager(hybrid(20, 2)).state_checkpoint_slot("a").has_value());
  EXPECT_INVARIANTS(m);
}

// Per-position states: k checkpoints per running slot, each slot's together,
// before the snapshots.
TEST(KvCacheManagerStateSnapshots, EachSlotsCheckpointsAreNumberedTogether) {
  KVCacheManager m(hybrid_cached(40, 3, 5, 8, /*checkpoints=*/4));
  EXPECT_EQ(m.num_state_slots_in_cache(), 3 + 3 * 4 + 5);
  EXPECT_EQ(m.num_state_checkpoints(), 4);
  ASSERT_TRUE(m.allocate_slots("a", 0, 5));
  ASSERT_TRUE(m.allocate_slots("b", 0, 5));
  EXPECT_EQ(m.state_checkpoint_slot("a", 0), 3 + 0);
  EXPECT_EQ(m.state_checkpoint_slot("a", 3), 3 + 3);
  EXPECT_EQ(m.state_checkpoint_slot("b", 0), 3 + 4);
  EXPECT_EQ(m.state_checkpoint_slot("b", 3), 3 + 7);
  const std::vector<StateSave> saves = m.reserve_state_snapshots("a", 0, 5, 5);
  ASSERT_EQ(saves.size(), 1u);
  EXPECT_EQ(saves[0].slot, 3 + 12);  // the first snapshot slot
  EXPECT_EQ(KVCacheManager(hybrid(20, 2)).num_state_checkpoints(), 0);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManagerStateSnapshots, SnapshotsAtEveryIntervalAndTheLastFullBlockOfThePrompt) {
  KVCacheManager m(hybrid_cached(40, 2, 10, 8));
  const std::vector<int32_t> t = tokens(30);
  // A prompt of 30 in chunks [0, 12) and [12, 30): 8 in the first; 16, 24 and
  // 28 (the last full block of 4) in the second.
  std::vector<StateSave> saves = step(m, "a", t, 0, 12, 30);
  ASSERT_EQ(saves.size(), 1u);
  EXPECT_EQ(saves[0].position, 8);
  saves = step(m, "a", t, 12, 30, 30);
  ASSERT_EQ(saves.size(), 3u);
  EXPECT_EQ(saves[0].position, 16);
  EXPECT_EQ(saves[1].position, 24);
  EXPECT_EQ(saves[2].position, 28);
  EXPECT_EQ(m.state_snapshots().num_cached(), 4);
  // Output tokens get none.
  EXPECT_TRUE(m.reserve_state_snapshots("a", 30, 40, 30).empty());
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManagerStateSnapshots, AHitEndsAtTheLongestCachedPrefixWithASnapshot) {
  KVCacheManager m(hybrid_cached(40, 2, 10, 8));
  const std::vector<int32_t> a = tokens(22);
  step(m, "a", a, 0, 22, 22);  // snapshots at 8, 16 and 20
  m.free("a");
  // A prompt sharing 18 tokens: 4 full blocks are cached, the snapshot at 16 is the last within them.
  std::vector<int32_t> b = tokens(30);
  b[18] = 7;
  const PrefixHit hit = m.get_computed_blocks(b, 0);
  EXPECT_EQ(hit.num_tokens, 16);
  ASSERT_GE(hit.state_snapshot, 0);
  EXPECT_EQ(m.state_snapshots().lookup(hit.hashes.back()), hit.state_snapshot);
  ASSERT_TRUE(m.allocate_slots("b", 0, 14, hit));
  EXPECT_EQ(m.state_snapshots().pins(hit.state_snapshot), 1);  // read by b's coming step
  EXPECT_INVARIANTS(m);
  m.cache_full_blocks("b", b, 30, 0);
  EXPECT_EQ(m.state_snapshots().pins(hit.state_snapshot), 0);
  EXPECT_EQ(m.prefix_cache_stats().hit_tokens, 16);
  EXPECT_INVARIANTS(m);
  // Without snapshots the same blocks give no hit: they come without their state.
  KVCacheManager none(hybrid_cached(40, 2, 10, 0));
  step(none, "a", a, 0, 22, 22);
  none.free("a");
  EXPECT_EQ(none.get_computed_blocks(tokens(30), 0).num_tokens, 20);  // the last full block of a's prompt
  std::vector<int32_t> c = tokens(30);
  c[19] = 7;
  EXPECT_EQ(none.get_computed_blocks(c, 0).num_tokens, 0);
}

TEST(KvCacheManagerStateSnapshots, ASnapshotIsEvictedWithItsBlock) {
  KVCacheManager m(hybrid_cached(6, 1, 4, 0));  // 5 usable blocks
  const std::vector<int32_t> a = tokens(9);
  step(m, "a", a, 0, 9, 9);  // a snapshot at 8
  m.free("a");
  EXPECT_EQ(m.state_snapshots().num_cached(), 1);
  EXPECT_EQ(m.get_computed_blocks(tokens(12), 0).num_tokens, 8);
  // Another request takes every block: a's are evicted, and its snapshot with them.
  ASSERT_TRUE(m.allocate_slots("b", 0, 20));
  EXPECT_EQ(m.state_snapshots().num_cached(), 0);
  EXPECT_EQ(m.state_snapshots().num_free(), 4);
  m.free("b");
  EXPECT_EQ(m.get_computed_blocks(tokens(12), 0).num_tokens, 0);
  EXPECT_INVARIANTS(m);
}

TEST(KvCacheManagerStateSnapshots, ReservationsEvictTheLeastRecentlyUsedUnpinnedSnapshot) {
  KVCacheManager m(hybrid_cached(60, 4, 2, 0));
  const std::vector<int32_t> p1 = tokens(9, 100), p2 = tokens(9, 200), p3 = tokens(9, 300);
  step(m, "a", p1, 0, 9, 9);
  m.free("a");
  step(m, "b", p2, 0, 9, 9);
  m.free("b");
  // p1's snapshot is read again (pinned, then used): p2's is now the least recently used.
  const PrefixHit hit = m.get_computed_blocks(p1, 0);
  ASSERT_EQ(hit.num_tokens, 8);
  ASSERT_TRUE(m.allocate_slots("c", 0, 1, hit));
  // While c is to read it, it cannot be evicted: d's reservation takes p2's.
  step(m, "d", p3, 0, 9, 9);
  EXPECT_TRUE(m.get_computed_blocks(p1, 0).state_snapshot >= 0);
  EXPECT_EQ(m.get_computed_blocks(p2, 0).num_tokens, 0);
  EXPECT_EQ(m.get_computed_blocks(p3, 0).num_tokens, 8);
  // p3's is not pinned: the next reservation evicts it; then one slot is
  // pinned and the other reserved, and a further reservation gets none.
  ASSERT_TRUE(m.allocate_slots("e", 0, 9));
  EXPECT_EQ(m.reserve_state_snapshots("e", 0, 9, 9).size(), 1u);
  EXPECT_EQ(m.get_computed_blocks(p3, 0).num_tokens, 0);
  ASSERT_TRUE(m.allocate_slots("f", 0, 9));
  EXPECT_TRUE(m.reserve_state_snapshots("f", 0, 9, 9).empty());
  EXPECT_INVARIANTS(m);
  for (const char* id : {"c", "d", "e", "f"}) m.free(id);
  EXPECT_EQ(m.state_snapshots().num_reserved(), 0);
  EXPECT_INVARIANTS(m);
}

// Random admissions (with prefix hits), prefill chunks, decodes, snapshot
// saves, preemptions and finishes over prompts that share prefixes: no slot,
// snapshot, pin or block leaks, the invariants hold after every operation,
// and everything is free at the end.
TEST(KvCacheManagerStateSnapshots, RandomizedAdmitGrowSnapshotHitPreemptFinishLeakNothing) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    std::mt19937 rng(seed);
    const int32_t n_slots = 1 + static_cast<int32_t>(rng() % 4);
    const int32_t n_snapshots = 1 + static_cast<int32_t>(rng() % 6);
    KVCacheManager m(hybrid_cached(12 + static_cast<int32_t>(rng() % 40), n_slots, n_snapshots,
                                   4 * static_cast<int64_t>(rng() % 4), rng() % 2 == 0));
    struct Running {
      std::vector<int32_t> tokens;
      int64_t prompt = 0, computed = 0;
    };
    std::map<std::string, Running> running;
    // Prompts from a few shared stems, so that later ones hit earlier ones' snapshots.
    std::vector<std::vector<int32_t>> stems;
    for (int i = 0; i < 3; ++i) stems.push_back(tokens(40, 1000 * (i + 1)));
    int next_id = 0;
    int64_t hits = 0, saved = 0, preempted = 0;
    for (int op = 0; op < 3000; ++op) {
      const int kind = static_cast<int>(rng() % 10);
      auto pick = [&]() {
        auto it = running.begin();
        std::advance(it, static_cast<long>(rng() % running.size()));
        return it->first;
      };
      if (running.empty() || kind < 3) {  // admit, taking the cache's hit
        const std::string id = "r" + std::to_string(next_id++);
        Running r;
        const std::vector<int32_t>& stem = stems[rng() % stems.size()];
        r.tokens.assign(stem.begin(), stem.begin() + 1 + static_cast<long>(rng() % stem.size()));
        r.tokens.push_back(static_cast<int32_t>(rng() % 50));
        r.prompt = static_cast<int64_t>(r.tokens.size());
        const PrefixHit hit = m.get_computed_blocks(r.tokens, 0);
        EXPECT_EQ(hit.num_tokens > 0, hit.state_snapshot >= 0);
        const int64_t n = std::min<int64_t>(r.prompt - hit.num_tokens, 1 + static_cast<int64_t>(rng() % 16));
        if (m.allocate_slots(id, 0, n, hit)) {
          hits += hit.num_tokens > 0;
          r.computed = hit.num_tokens;
          saved += static_cast<int64_t>(m.reserve_state_snapshots(id, r.computed, r.computed + n, r.prompt).size());
          r.computed += n;
          if (rng() % 8 != 0) m.cache_full_blocks(id, r.tokens, r.computed, 0);  // else preempted before its update
          running[id] = std::move(r);
        }
      } else if (kind < 7) {  // the next chunk, or a decode
        const std::string id = pick();
        Running& r = running[id];
        if (r.computed >= static_cast<int64_t>(r.tokens.size())) r.tokens.push_back(static_cast<int32_t>(rng() % 50));
        const int64_t left = static_cast<int64_t>(r.tokens.size()) - r.computed;
        const int64_t n = std::min<int64_t>(left, 1 + static_cast<int64_t>(rng() % 8));
        if (m.allocate_slots(id, r.computed, n)) {
          saved += static_cast<int64_t>(m.reserve_state_snapshots(id, r.computed, r.computed + n, r.prompt).size());
          r.computed += n;
          m.cache_full_blocks(id, r.tokens, r.computed, 0);
        }
      } else {  // finished, or preempted by recompute
        const std::string id = pick();
        preempted += kind == 9;
        m.free(id);
        running.erase(id);
      }
      EXPECT_EQ(m.num_state_slots() - m.num_free_state_slots(), static_cast<int32_t>(running.size()));
      EXPECT_INVARIANTS(m);
      if (testing::Test::HasFailure()) return;
    }
    for (const auto& [id, r] : running) m.free(id);
    EXPECT_EQ(m.num_free_state_slots(), n_slots);
    EXPECT_EQ(m.state_snapshots().num_reserved(), 0);
    EXPECT_EQ(m.state_snapshots().num_free() + m.state_snapshots().num_cached(), n_snapshots);
    for (int32_t s = 0; s < n_snapshots; ++s)
      EXPECT_EQ(m.state_snapshots().pins(m.num_state_slots_in_cache() - n_snapshots + s), 0);
    EXPECT_EQ(m.num_free_blocks(), m.num_usable_blocks());
    EXPECT_EQ(m.num_requests(), 0);
    EXPECT_INVARIANTS(m);
    EXPECT_GT(hits, 20) << "seed " << seed;
    EXPECT_GT(saved, 20) << "seed " << seed;
    EXPECT_GT(preempted, 0);
  }
}

TEST(KvCacheManagerStateSlotsDeathTest, ForkingAHybridRequestIsAContractViolation) {
  KVCacheManager m(hybrid(20, 2));
  ASSERT_TRUE(m.allocate_slots("a", 0, 5).has_value());
  EXPECT_DEATH(m.fork("a", "b", 5), "recurrent state");
}

// Random admissions, growth (decode steps and prefill chunks), preemptions
// and finishes: slots and blocks are held exactly by the requests that hold
// the other, nothing leaks, and everything is free at the end.
TEST(KvCacheManagerStateSlots, RandomizedAdmitGrowPreemptFinishLeakNothing) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    std::mt19937 rng(seed);
    const int32_t n_slots = 1 + static_cast<int32_t>(rng() % 4);
    KVCacheManager m(hybrid(10 + static_cast<int32_t>(rng() % 30), n_slots));
    std::map<std::string, int64_t> computed;  // running request -> tokens it has slots for
    int next_id = 0;
    int64_t no_slot = 0, admitted = 0, preempted = 0;
    for (int op = 0; op < 3000; ++op) {
      const int kind = static_cast<int>(rng() % 10);
      auto pick = [&]() {
        auto it = computed.begin();
        std::advance(it, static_cast<long>(rng() % computed.size()));
        return it->first;
      };
      if (computed.empty() || kind < 3) {  // admit a prompt's first chunk
        const std::string id = "r" + std::to_string(next_id++);
        const int64_t n = 1 + static_cast<int64_t>(rng() % 12);
        const bool slot_free = m.num_free_state_slots() > 0;
        if (m.allocate_slots(id, 0, n)) {
          EXPECT_TRUE(slot_free);
          EXPECT_TRUE(m.state_slot(id).has_value());
          computed[id] = n;
          ++admitted;
        } else {
          no_slot += !slot_free;
          EXPECT_FALSE(m.state_slot(id).has_value());
          EXPECT_FALSE(m.holds_blocks(id));
        }
      } else if (kind < 7) {  // a decode step or the next prefill chunk
        const std::string id = pick();
        const std::optional<int32_t> slot = m.state_slot(id);
        const int64_t n = kind < 5 ? 1 : 1 + static_cast<int64_t>(rng() % 8);
        if (m.allocate_slots(id, computed[id], n)) computed[id] += n;
        EXPECT_EQ(m.state_slot(id), slot);  // a request keeps its slot while it runs
      } else {  // finished, or preempted by recompute: both free everything
        const std::string id = pick();
        preempted += kind == 9;
        m.free(id);
        computed.erase(id);
        EXPECT_FALSE(m.state_slot(id).has_value());
      }
      EXPECT_EQ(m.num_state_slots() - m.num_free_state_slots(), static_cast<int32_t>(computed.size()));
      EXPECT_INVARIANTS(m);
      if (testing::Test::HasFailure()) return;
    }
    for (const auto& [id, n] : computed) m.free(id);
    EXPECT_EQ(m.num_free_state_slots(), n_slots);
    EXPECT_EQ(m.num_free_blocks(), m.num_usable_blocks());
    EXPECT_EQ(m.num_requests(), 0);
    EXPECT_INVARIANTS(m);
    EXPECT_GT(admitted, 50);
    EXPECT_GT(no_slot, 0);
    EXPECT_GT(preempted, 0);
  }
}

}  // namespace
}  // namespace inferd::kv
