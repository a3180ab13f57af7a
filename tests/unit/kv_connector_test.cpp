// The KV connector seam at the KV manager: a prefix lookup that looks past the
// pool's own blocks into a connector, external blocks that get fresh blocks to
// load into, and evictions offered while their blocks still hold their
// prefix. A fake connector stands for the tiers and a fake memory records
// which prefix block each pool block holds, so every hit, load and save is
// checked against what the block really contains.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "kv/kv_cache_manager.h"

namespace inferd::kv {
namespace {

#define ASSERT_INVARIANTS(m)                    \
  do {                                          \
    Status s_ = (m).check_invariants();         \
    ASSERT_TRUE(s_.ok()) << s_.error().message; \
  } while (0)

// What each pool block holds (0: nothing known), written by "computing" and
// by loads, read by saves.
using Memory = std::vector<BlockHash>;

// Remembers the keys saved to it; a load fills the block with its key unless
// the key is marked bad (then it is dropped, as a tier drops a corrupt block).
class FakeConnector : public KVConnector {
 public:
  explicit FakeConnector(Memory& memory) : memory_(memory) {}
  bool contains(BlockHash key) const override { return held.count(key) > 0; }
  std::vector<bool> load(std::span<const BlockTransfer> loads, bool) override {
    std::vector<bool> ok;
    for (const BlockTransfer& l : loads) {
      EXPECT_TRUE(held.count(l.key));
      const bool good = !bad.count(l.key);
      if (good) memory_[l.block] = l.key;
      else held.erase(l.key);
      ok.push_back(good);
      ++loaded;
    }
    return ok;
  }
  void save_computed(std::span<const BlockTransfer> computed) override {
    for (const BlockTransfer& b : computed) EXPECT_EQ(memory_[b.block], b.key) << "block " << b.block;
    computed_saves += static_cast<int64_t>(computed.size());
  }
  void save_evicted(std::span<const BlockTransfer> evicted) override {
    for (const BlockTransfer& e : evicted) {
      // The block must still hold the prefix it was cached under.
      EXPECT_EQ(memory_[e.block], e.key) << "block " << e.block;
      held.insert(e.key);
      ++saved;
    }
  }

  std::set<BlockHash> held, bad;
  int64_t loaded = 0, saved = 0, computed_saves = 0;

 private:
  Memory& memory_;
};

// The chained hashes of a sequence's full blocks.
std::vector<BlockHash> chain(const std::vector<int32_t>& t, int32_t bs) {
  std::vector<BlockHash> h;
  BlockHash parent = kRootBlockHash;
  for (size_t i = 0; i + bs <= t.size(); i += bs)
    h.push_back(parent = hash_block(parent, std::span(t).subspan(i, bs), 0));
  return h;
}

// Admits a request as the scheduler does: the hit (with the connector),
// evictions saved, loads done, a failed load answered by taking the pool's
// own hit instead. Returns false when it does not fit.
bool admit(KVCacheManager& m, FakeConnector& c, const std::string& id, const std::vector<int32_t>& t) {
  const PrefixCacheStats stats_before = m.prefix_cache_stats();
  PrefixHit hit = m.get_computed_blocks(t, 0, &c);
  std::vector<BlockTransfer> loads;
  auto blocks = m.allocate_slots(id, 0, static_cast<int64_t>(t.size()) - hit.num_tokens, hit, nullptr, &loads);
  if (!blocks) return false;
  c.save_evicted(m.take_evictions());
  const std::vector<bool> ok = c.load(loads, hit.stopped_at_miss);
  if (std::find(ok.begin(), ok.end(), false) != ok.end()) {
    m.free(id);
    m.restore_prefix_cache_stats(stats_before);
    hit = m.get_computed_blocks(t, 0);
    blocks = m.allocate_slots(id, 0, static_cast<int64_t>(t.size()) - hit.num_tokens, hit);
    if (!blocks) return false;
    c.save_evicted(m.take_evictions());
  } else {
    m.cache_loaded(loads);
  }
  return true;
}

// Writes the blocks of a request's computed tokens and caches the full ones.
void compute(KVCacheManager& m, Memory& memory, const std::string& id, const std::vector<int32_t>& t,
             int64_t computed_before) {
  const int32_t bs = m.block_size();
  const std::vector<BlockHash> h = chain(t, bs);
  for (int32_t g = 0; g < m.num_groups(); ++g) {
    std::span<const int32_t> table = m.block_table(id, g);
    for (size_t i = computed_before / bs; i < h.size(); ++i)
      if (table[i] != BlockPool::kNullBlock) memory[table[i]] = group_block_hash(h[i], g);
  }
  m.cache_full_blocks(id, t, static_cast<int64_t>(t.size()), 0);
}

// What the scheduler does after a step: newly findable blocks to the connector.
void offer_computed(KVCacheManager& m, FakeConnector& c) { c.save_computed(m.take_newly_cached()); }

// A 9-block pool where request a (17 tokens: 4 full blocks) ran and left,
// then b (32 tokens) took every block: a's 4 cached blocks were evicted into
// the connector.
class KvConnectorAfterEviction : public ::testing::Test {
 protected:
  void SetUp() override {
    m.record_transitions(true);
    for (int32_t i = 0; i < 17; ++i) a.push_back(100 + i);
    for (int32_t i = 0; i < 32; ++i) b.push_back(500 + i);
    ASSERT_TRUE(admit(m, c, "a", a));
    compute(m, memory, "a", a, 0);
    m.free("a");  // 4 cached blocks (+1 partial) free
    ASSERT_TRUE(admit(m, c, "b", b));  // takes all 8 blocks: evicts a's 4
    EXPECT_EQ(c.saved, 4);
    compute(m, memory, "b", b, 0);
    m.free("b");
    ASSERT_INVARIANTS(m);
  }

  Memory memory = Memory(9, 0);
  FakeConnector c{memory};
  KVCacheManager m{{.n_blocks = 9, .block_size = 4, .group_windows = {}}};
  std::vector<int32_t> a, b;
};

TEST_F(KvConnectorAfterEviction, EvictedPrefixComesBackAsLoads) {
  const PrefixHit hit = m.get_computed_blocks(a, 0, &c);
  EXPECT_EQ(hit.num_tokens, 16);
  EXPECT_EQ(hit.external.size(), 4u);
  EXPECT_EQ(hit.num_external_tokens, 16);
  EXPECT_TRUE(hit.consulted_connector);
  EXPECT_FALSE(hit.stopped_at_miss);  // a's 17 tokens: 4 full blocks, all found
  ASSERT_TRUE(admit(m, c, "a2", a));
  EXPECT_EQ(c.loaded, 4);
  std::span<const int32_t> t = m.block_table("a2");
  const std::vector<BlockHash> h = chain(a, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(memory[t[i]], h[i]);
  EXPECT_EQ(m.prefix_cache_stats().external_hit_tokens, 16);
  ASSERT_INVARIANTS(m);
  // Loaded blocks are cached: a third request finds them in the pool.
  const PrefixHit again = m.get_computed_blocks(a, 0, &c);
  EXPECT_EQ(again.num_tokens, 16);
  EXPECT_TRUE(again.external.empty());
  m.free("a2");
  ASSERT_INVARIANTS(m);
}

TEST_F(KvConnectorAfterEviction, AFailedLoadFallsBackToThePoolsOwnHit) {
  c.bad.insert(chain(a, 4)[2]);
  ASSERT_TRUE(admit(m, c, "a2", a));
  EXPECT_EQ(m.num_blocks_held("a2"), 5);
  EXPECT_EQ(m.prefix_cache_stats().external_hit_tokens, 0);  // the failed admission is not counted
  EXPECT_FALSE(c.contains(chain(a, 4)[2]));
  ASSERT_INVARIANTS(m);
  m.free("a2");
  ASSERT_INVARIANTS(m);
  EXPECT_EQ(m.num_free_blocks(), m.num_usable_blocks());
}

// Random admissions, growth and frees of requests sharing prefixes, on a
// small pool with a full-attention and a sliding-window group: every block a
// request's table covers holds the right prefix block, evictions are saved
// while intact, and once everything is freed no block is held.
TEST(KvConnector, RandomOperationsKeepContentsAndLeakNothing) {
  for (bool windowed : {false, true}) {
    SCOPED_TRACE(windowed ? "with a sliding-window group" : "one full-attention group");
    const int32_t bs = 4;
    KVCacheConfig config{.n_blocks = 40, .block_size = bs, .group_windows = {}};
    if (windowed) config.group_windows = {0, 10};
    Memory memory(config.n_blocks, 0);
    FakeConnector c(memory);
    KVCacheManager m(config);
    m.record_transitions(true);
    std::mt19937 rng(windowed ? 7 : 3);
    // Prompts built from a few shared stems, so prefixes recur.
    std::vector<std::vector<int32_t>> stems(4);
    for (size_t s = 0; s < stems.size(); ++s)
      for (int32_t i = 0; i < 24; ++i) stems[s].push_back(static_cast<int32_t>(1000 * s + i));
    struct Live {
      std::vector<int32_t> tokens;
    };
    std::map<std::string, Live> live;
    int next = 0;
    for (int step = 0; step < 600; ++step) {
      const int op = static_cast<int>(rng() % 3);
      if (op == 0 || live.empty()) {
        std::vector<int32_t> t = stems[rng() % stems.size()];
        t.resize(4 + rng() % 21);
        const int tail = static_cast<int>(rng() % 9);
        for (int i = 0; i < tail; ++i) t.push_back(static_cast<int32_t>(50000 + rng() % 3));
        if (rng() % 5 == 0) c.bad.insert(chain(t, bs).empty() ? 0 : chain(t, bs).back());
        const std::string id = "r" + std::to_string(next++);
        if (!admit(m, c, id, t)) continue;
        compute(m, memory, id, t, 0);
        offer_computed(m, c);
        // The whole table holds the right prefix blocks.
        const std::vector<BlockHash> h = chain(t, bs);
        for (int32_t g = 0; g < m.num_groups(); ++g) {
          std::span<const int32_t> table = m.block_table(id, g);
          for (size_t i = 0; i < h.size(); ++i) {
            if (table[i] != BlockPool::kNullBlock) {
              ASSERT_EQ(memory[table[i]], group_block_hash(h[i], g));
            }
          }
        }
        live[id] = {t};
      } else if (op == 1) {
        auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
        const int64_t before = static_cast<int64_t>(it->second.tokens.size());
        const int64_t n = 1 + rng() % 6;
        if (!m.allocate_slots(it->first, before, n)) continue;
        c.save_evicted(m.take_evictions());
        for (int64_t i = 0; i < n; ++i) it->second.tokens.push_back(static_cast<int32_t>(60000 + rng() % 2));
        compute(m, memory, it->first, it->second.tokens, before);
        offer_computed(m, c);
      } else {
        auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
        m.free(it->first);
        live.erase(it);
      }
      ASSERT_INVARIANTS(m);
    }
    EXPECT_GT(c.loaded, 0);
    EXPECT_GT(c.saved, 0);
    EXPECT_GT(c.computed_saves, 0);
    for (const auto& [id, l] : live) m.free(id);
    ASSERT_INVARIANTS(m);
    EXPECT_EQ(m.num_free_blocks(), m.num_usable_blocks());
    EXPECT_EQ(m.num_requests(), 0);
  }
}

}  // namespace
}  // namespace inferd::kv
