// kv::ChainedConnector: offload tiers (loads at once) in front of a KV transfer
// (loads deferred), behind the scheduler's one connector. Two fakes stand for
// them and record what each was asked: which blocks each loads, in which
// order the answers come back, when a pull starts (never after a failed local
// load), and where saves go.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "kv/chained_connector.h"

namespace inferd::kv {
namespace {

class FakeLocal : public KVConnector {
 public:
  bool contains(BlockHash key) const override { return held.count(key) > 0; }
  std::vector<bool> load(std::span<const BlockTransfer> loads, bool stopped_at_miss) override {
    last_stopped_at_miss = stopped_at_miss;
    std::vector<bool> ok;
    for (const BlockTransfer& l : loads) {
      loaded.push_back(l);
      ok.push_back(!bad.count(l.key));
    }
    return ok;
  }
  void save_evicted(std::span<const BlockTransfer> e) override { evicted += static_cast<int>(e.size()); }
  void save_computed(std::span<const BlockTransfer> c) override { computed += static_cast<int>(c.size()); }

  std::set<BlockHash> held, bad;
  std::vector<BlockTransfer> loaded;
  bool last_stopped_at_miss = false;
  int evicted = 0, computed = 0;
};

// Loads only by deferral (a network pull): start_load records the pull, and
// take_finished_loads reports it once finish() is called.
class FakeRemote : public KVConnector {
 public:
  bool contains(BlockHash key) const override { return held.count(key) > 0; }
  std::vector<bool> load(std::span<const BlockTransfer> loads, bool) override {
    return std::vector<bool>(loads.size(), false);
  }
  std::optional<std::vector<bool>> start_load(const std::string& id, std::span<const BlockTransfer> loads, bool,
                                              bool may_defer) override {
    if (!may_defer) return std::vector<bool>(loads.size(), false);
    pulls.push_back({id, std::vector<BlockTransfer>(loads.begin(), loads.end())});
    return std::nullopt;
  }
  std::vector<FinishedLoad> take_finished_loads() override { return std::exchange(finished, {}); }
  bool has_unfinished_loads() const override { return pulls.size() > finished_count; }
  void save_evicted(std::span<const BlockTransfer>) override { ++saves; }
  void save_computed(std::span<const BlockTransfer>) override { ++saves; }

  void finish(bool ok) {
    finished.push_back({pulls.at(finished_count).first, ok});
    ++finished_count;
  }

  std::set<BlockHash> held;
  std::vector<std::pair<std::string, std::vector<BlockTransfer>>> pulls;
  std::vector<FinishedLoad> finished;
  size_t finished_count = 0;
  int saves = 0;
};

std::vector<BlockTransfer> loads_of(std::initializer_list<BlockHash> keys) {
  std::vector<BlockTransfer> v;
  int32_t block = 10;
  for (BlockHash k : keys) v.push_back({k, block++});
  return v;
}

TEST(KvChainedConnector, FindsABlockInEither) {
  FakeLocal local;
  FakeRemote remote;
  ChainedConnector c(local, remote);
  local.held = {1};
  remote.held = {2};
  EXPECT_TRUE(c.contains(1));
  EXPECT_TRUE(c.contains(2));
  EXPECT_FALSE(c.contains(3));
}

TEST(KvChainedConnector, LocalBlocksLoadAtOnceAndOnlyTheRestIsPulled) {
  FakeLocal local;
  FakeRemote remote;
  ChainedConnector c(local, remote);
  local.held = {1, 2, 4};
  remote.held = {1, 2, 3, 4, 5};  // the producer has the whole prompt
  const std::vector<BlockTransfer> loads = loads_of({1, 2, 3, 4, 5});
  EXPECT_FALSE(c.start_load("r", loads, false, true).has_value());  // the pull is under way
  ASSERT_EQ(local.loaded.size(), 3u);
  EXPECT_EQ(local.loaded[0].key, 1u);
  EXPECT_EQ(local.loaded[1].key, 2u);
  EXPECT_EQ(local.loaded[2].key, 4u);
  EXPECT_EQ(local.loaded[2].block, 13);  // into the block the scheduler gave key 4
  EXPECT_TRUE(local.last_stopped_at_miss) << "the lookup went past the tiers";
  ASSERT_EQ(remote.pulls.size(), 1u);
  EXPECT_EQ(remote.pulls[0].first, "r");
  ASSERT_EQ(remote.pulls[0].second.size(), 2u);
  EXPECT_EQ(remote.pulls[0].second[0].key, 3u);
  EXPECT_EQ(remote.pulls[0].second[1].key, 5u);
  EXPECT_EQ(remote.pulls[0].second[1].block, 14);
  EXPECT_TRUE(c.has_unfinished_loads());
  remote.finish(true);
  const std::vector<FinishedLoad> done = c.take_finished_loads();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].request_id, "r");
  EXPECT_TRUE(done[0].ok);
  EXPECT_FALSE(c.has_unfinished_loads());
}

TEST(KvChainedConnector, EverythingLocalIsAnsweredAtOnceWithoutAPull) {
  FakeLocal local;
  FakeRemote remote;
  ChainedConnector c(local, remote);
  local.held = {1, 2};
  remote.held = {1, 2};
  const auto got = c.start_load("r", loads_of({1, 2}), true, true);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, (std::vector<bool>{true, true}));
  EXPECT_TRUE(local.last_stopped_at_miss) << "the lookup's own miss is passed on";
  EXPECT_TRUE(remote.pulls.empty());
}

TEST(KvChainedConnector, AFailedLocalLoadPullsNothingAndIsTheAnswer) {
  FakeLocal local;
  FakeRemote remote;
  ChainedConnector c(local, remote);
  local.held = {1, 2};
  local.bad = {2};  // a corrupt block: the tier drops it
  remote.held = {1, 2, 3};
  const auto got = c.start_load("r", loads_of({1, 2, 3}), false, true);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, (std::vector<bool>{true, false, false}));
  EXPECT_TRUE(remote.pulls.empty());
}

TEST(KvChainedConnector, WithoutDeferralTheRemotePartFailsAtOnce) {
  FakeLocal local;
  FakeRemote remote;
  ChainedConnector c(local, remote);
  local.held = {1};
  remote.held = {2};
  const auto got = c.start_load("r", loads_of({1, 2}), false, false);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, (std::vector<bool>{true, false}));
  EXPECT_EQ(c.load(loads_of({1, 2}), false), (std::vector<bool>{true, false}));
}

TEST(KvChainedConnector, SavesGoToTheLocalConnectorOnly) {
  FakeLocal local;
  FakeRemote remote;
  ChainedConnector c(local, remote);
  const std::vector<BlockTransfer> blocks = loads_of({7, 8});
  c.save_evicted(blocks);
  c.save_computed(blocks);
  EXPECT_EQ(local.evicted, 2);
  EXPECT_EQ(local.computed, 2);
  EXPECT_EQ(remote.saves, 0);
}

}  // namespace
}  // namespace inferd::kv
