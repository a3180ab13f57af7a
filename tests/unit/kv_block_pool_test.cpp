// BlockPool and block hashing: reference counts, the free list's eviction
// order, freed cached blocks staying findable until reused, and the contract
// checks that stop a caller from corrupting the pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "kv/block_hash.h"
#include "kv/block_pool.h"

namespace inferd::kv {
namespace {

std::vector<int32_t> iota_blocks(int32_t from, int32_t to) {
  std::vector<int32_t> v(to - from);
  std::iota(v.begin(), v.end(), from);
  return v;
}

#define EXPECT_INVARIANTS(pool)                          \
  do {                                                   \
    Status s_ = (pool).check_invariants();               \
    EXPECT_TRUE(s_.ok()) << s_.error().message;          \
  } while (0)

TEST(KvBlockHash, DependsOnParentTokensExtraKeyAndOrder) {
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 4, 3}, c = {1, 2, 3};
  const BlockHash h = hash_block(kRootBlockHash, a, 0);
  EXPECT_EQ(h, hash_block(kRootBlockHash, a, 0));
  EXPECT_NE(h, hash_block(kRootBlockHash, b, 0));        // order matters
  EXPECT_NE(h, hash_block(kRootBlockHash, c, 0));        // length matters
  EXPECT_NE(h, hash_block(kRootBlockHash + 1, a, 0));    // the parent chains in
  EXPECT_NE(h, hash_block(kRootBlockHash, a, 12345));    // the extra key separates caches
  // Token 0 at the end is not the same as a shorter block.
  EXPECT_NE(hash_block(kRootBlockHash, std::vector<int32_t>{5, 0}, 0),
            hash_block(kRootBlockHash, std::vector<int32_t>{5}, 0));
  // Negative ids and the high half of the packed word both count.
  EXPECT_NE(hash_block(kRootBlockHash, std::vector<int32_t>{-1, 7}, 0),
            hash_block(kRootBlockHash, std::vector<int32_t>{-1, 8}, 0));
}

TEST(KvBlockHash, NoCollisionsAmongManySmallBlocks) {
  // Every 3-token block over a 40-token vocabulary under two parents: a weak
  // mix (e.g. a plain sum or xor) collides here at once.
  std::set<BlockHash> seen;
  size_t n = 0;
  for (BlockHash parent : {kRootBlockHash, BlockHash{42}})
    for (int32_t x = 0; x < 40; ++x)
      for (int32_t y = 0; y < 40; ++y)
        for (int32_t z = 0; z < 40; ++z, ++n)
          seen.insert(hash_block(parent, std::vector<int32_t>{x, y, z}, 0));
  EXPECT_EQ(seen.size(), n);
}

TEST(KvBlockHash, SaltBytes) {
  EXPECT_EQ(hash_bytes(""), 0u);  // no salt: no extra key
  EXPECT_NE(hash_bytes("a"), 0u);
  EXPECT_NE(hash_bytes("a"), hash_bytes("b"));
  EXPECT_NE(hash_bytes("a"), hash_bytes(std::string("a\0", 2)));
  EXPECT_NE(hash_bytes("12345678"), hash_bytes("123456789"));
  EXPECT_EQ(hash_bytes("tenant-7"), hash_bytes("tenant-7"));
}

TEST(KvBlockPool, StartsWithEveryUsableBlockFreeAndTheNullBlockReserved) {
  BlockPool pool(8);
  EXPECT_EQ(pool.num_blocks(), 8);
  EXPECT_EQ(pool.num_usable_blocks(), 7);
  EXPECT_EQ(pool.num_free_blocks(), 7);
  EXPECT_EQ(pool.free_list(), iota_blocks(1, 8));
  EXPECT_DOUBLE_EQ(pool.usage(), 0.0);
  EXPECT_INVARIANTS(pool);

  const std::vector<int32_t> all = pool.allocate(7);
  EXPECT_EQ(all, iota_blocks(1, 8));  // from the head, never block 0
  EXPECT_EQ(pool.num_free_blocks(), 0);
  EXPECT_DOUBLE_EQ(pool.usage(), 1.0);
  for (int32_t b : all) EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_EQ(pool.ref_count(BlockPool::kNullBlock), 0);
  EXPECT_INVARIANTS(pool);
}

TEST(KvBlockPool, RefCountsAndTouch) {
  BlockPool pool(6);
  const std::vector<int32_t> a = pool.allocate(2);
  pool.touch(a);  // a second holder
  EXPECT_EQ(pool.ref_count(a[0]), 2);
  pool.free(a);
  EXPECT_EQ(pool.ref_count(a[0]), 1);
  EXPECT_EQ(pool.num_free_blocks(), 3);  // still held once
  pool.free(a);
  EXPECT_EQ(pool.num_free_blocks(), 5);
  EXPECT_INVARIANTS(pool);
}

TEST(KvBlockPool, FreedCachedBlocksStayFindableUntilReused) {
  BlockPool pool(5);  // 4 usable
  const std::vector<int32_t> b = pool.allocate(2);
  ASSERT_TRUE(pool.cache(b[0], 111));
  ASSERT_TRUE(pool.cache(b[1], 222));
  EXPECT_EQ(pool.lookup(111), b[0]);
  EXPECT_EQ(pool.num_cached_blocks(), 2);

  pool.free(b);  // unreferenced, still cached
  EXPECT_EQ(pool.num_free_blocks(), 4);
  EXPECT_EQ(pool.lookup(111), b[0]);
  EXPECT_EQ(pool.block_hash(b[1]), BlockHash{222});
  EXPECT_INVARIANTS(pool);

  // Taking one back removes it from the free list without dropping its hash.
  pool.touch(std::vector<int32_t>{b[0]});
  EXPECT_EQ(pool.ref_count(b[0]), 1);
  EXPECT_EQ(pool.num_free_blocks(), 3);
  EXPECT_EQ(pool.lookup(111), b[0]);
  EXPECT_INVARIANTS(pool);

  // Allocating every free block reuses b[1]: its hash is dropped then.
  const std::vector<int32_t> rest = pool.allocate(3);
  EXPECT_TRUE(std::find(rest.begin(), rest.end(), b[1]) != rest.end());
  EXPECT_FALSE(pool.lookup(222).has_value());
  EXPECT_FALSE(pool.block_hash(b[1]).has_value());
  EXPECT_EQ(pool.num_evictions(), 1);
  EXPECT_EQ(pool.lookup(111), b[0]);  // the touched one survived
  EXPECT_INVARIANTS(pool);
}

TEST(KvBlockPool, EvictionOrderIsLeastRecentlyFreedFirstAndEmptyBlocksBeforeCachedOnes) {
  BlockPool pool(7);  // blocks 1..6
  const std::vector<int32_t> b = pool.allocate(6);
  // Cache 1..4; 5 and 6 hold nothing reusable (say, partial blocks).
  for (int32_t i = 0; i < 4; ++i) ASSERT_TRUE(pool.cache(b[i], 1000 + i));
  pool.free(std::vector<int32_t>{3});
  pool.free(std::vector<int32_t>{1});
  pool.free(std::vector<int32_t>{5});  // uncached: goes to the head
  pool.free(std::vector<int32_t>{4});
  pool.free(std::vector<int32_t>{6});  // uncached: goes to the head
  pool.free(std::vector<int32_t>{2});
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{6, 5, 3, 1, 4, 2}));
  EXPECT_INVARIANTS(pool);

  // Allocation evicts in that order: empty blocks, then cached ones LRU-first.
  EXPECT_EQ(pool.allocate(3), (std::vector<int32_t>{6, 5, 3}));
  EXPECT_FALSE(pool.lookup(1002).has_value());  // block 3's prefix is gone
  EXPECT_EQ(pool.lookup(1000), 1);
  EXPECT_EQ(pool.lookup(1003), 4);

  // Touching a cached free block and freeing it again makes it most recent.
  pool.touch(std::vector<int32_t>{1});
  pool.free(std::vector<int32_t>{1});
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{4, 2, 1}));
  EXPECT_EQ(pool.allocate(1), (std::vector<int32_t>{4}));
  EXPECT_EQ(pool.num_evictions(), 2);
  EXPECT_INVARIANTS(pool);
}

TEST(KvBlockPool, FirstCachedCopyOfAPrefixWins) {
  BlockPool pool(4);
  const std::vector<int32_t> b = pool.allocate(2);
  EXPECT_TRUE(pool.cache(b[0], 7));
  EXPECT_FALSE(pool.cache(b[1], 7));  // same prefix computed twice: keep the first
  EXPECT_FALSE(pool.block_hash(b[1]).has_value());
  EXPECT_TRUE(pool.cache(b[0], 7));   // caching again under the same hash is a no-op
  EXPECT_EQ(pool.lookup(7), b[0]);
  // The uncached duplicate is freed to the head, the cached one to the tail.
  pool.free(b);
  EXPECT_EQ(pool.free_list(), (std::vector<int32_t>{b[1], 3, b[0]}));
  EXPECT_INVARIANTS(pool);
}

TEST(KvBlockPoolDeathTest, ContractViolationsAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        BlockPool pool(3);
        pool.allocate(3);
      },
      "more blocks than are free");
  EXPECT_DEATH(
      {
        BlockPool pool(3);
        pool.free(pool.allocate(1));
        pool.free(std::vector<int32_t>{1});
      },
      "no reference");
  EXPECT_DEATH(
      {
        BlockPool pool(3);
        pool.touch(std::vector<int32_t>{BlockPool::kNullBlock});
      },
      "invalid block");
}

}  // namespace
}  // namespace inferd::kv
