// The KV offload tiers with no model: host-memory LRU, disk files (round
// trips, restart, fingerprints, corruption, bounds) and the connector that
// moves blocks between them and a pool's memory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "kvstore/disk_tier.h"
#include "kvstore/host_tier.h"
#include "kvstore/tiered_connector.h"

namespace inferd::kvstore {
namespace {

namespace fs = std::filesystem;

constexpr size_t kBlockBytes = 1024;

BlockBytes block_of(uint64_t seed) {
  auto b = std::make_shared<std::vector<std::byte>>(kBlockBytes);
  std::mt19937_64 rng(seed);
  for (std::byte& x : *b) x = static_cast<std::byte>(rng());
  return b;
}

// A fresh directory per test, removed after it.
class TempDir {
 public:
  TempDir() {
    path_ = (fs::temp_directory_path() / ("inferd_kvstore_" + std::to_string(::getpid()) + "_" +
                                          std::to_string(counter_++)))
                .string();
    fs::remove_all(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

DiskTierConfig disk_config(const std::string& path, int64_t capacity_blocks, uint64_t fingerprint = 7) {
  DiskTierConfig c;
  c.path = path;
  c.capacity_bytes = capacity_blocks * static_cast<int64_t>(DiskTier::kHeaderBytes + kBlockBytes);
  c.fingerprint = fingerprint;
  c.block_bytes = kBlockBytes;
  return c;
}

TEST(HostTier, KeepsWithinCapacityDroppingLeastRecentlyUsed) {
  HostTier tier(3 * kBlockBytes);
  for (uint64_t k = 1; k <= 3; ++k) tier.put(k, block_of(k));
  EXPECT_EQ(tier.keys_by_recency(), (std::vector<kv::BlockHash>{3, 2, 1}));
  ASSERT_NE(tier.get(1), nullptr);  // 1 is now the most recently used
  tier.put(4, block_of(4));         // drops 2, the least recently used
  EXPECT_EQ(tier.keys_by_recency(), (std::vector<kv::BlockHash>{4, 1, 3}));
  EXPECT_FALSE(tier.contains(2));
  EXPECT_EQ(tier.stats().blocks, 3);
  EXPECT_EQ(tier.stats().bytes, static_cast<int64_t>(3 * kBlockBytes));
  EXPECT_EQ(tier.stats().evictions, 1);
  EXPECT_EQ(*tier.get(3), *block_of(3));
  EXPECT_TRUE(tier.touch(4));
  EXPECT_FALSE(tier.touch(2));
  tier.put(4, block_of(99));  // held: not replaced, not counted again
  EXPECT_EQ(*tier.get(4), *block_of(4));
  EXPECT_EQ(tier.stats().saves, 4);
}

TEST(HostTier, ABlockLargerThanTheTierIsNotKept) {
  HostTier tier(kBlockBytes / 2);
  tier.put(1, block_of(1));
  EXPECT_FALSE(tier.contains(1));
  EXPECT_EQ(tier.stats().bytes, 0);
}

TEST(DiskTier, RoundTripAndRestart) {
  TempDir dir;
  {
    auto tier = DiskTier::open(disk_config(dir.path(), 8));
    ASSERT_TRUE(tier) << tier.error().message;
    for (uint64_t k = 1; k <= 5; ++k) (*tier)->write(k * 1000003, block_of(k));
    (*tier)->flush();
    EXPECT_EQ((*tier)->stats().blocks, 5);
    EXPECT_EQ((*tier)->stats().saves, 5);
    std::vector<std::byte> got(kBlockBytes);
    ASSERT_TRUE((*tier)->read(3 * 1000003, got.data()));
    EXPECT_EQ(got, *block_of(3));
    EXPECT_FALSE((*tier)->read(42, got.data()));
  }
  // A new process on the same path finds every block.
  auto again = DiskTier::open(disk_config(dir.path(), 8));
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ((*again)->stats().blocks, 5);
  for (uint64_t k = 1; k <= 5; ++k) {
    ASSERT_TRUE((*again)->contains(k * 1000003));
    std::vector<std::byte> got(kBlockBytes);
    ASSERT_TRUE((*again)->read(k * 1000003, got.data()));
    EXPECT_EQ(got, *block_of(k));
  }
  EXPECT_EQ((*again)->stats().dropped, 0);
}

TEST(DiskTier, AnotherFingerprintSeesNoneOfTheBlocks) {
  TempDir dir;
  {
    auto tier = DiskTier::open(disk_config(dir.path(), 8, /*fingerprint=*/1));
    ASSERT_TRUE(tier);
    (*tier)->write(5, block_of(5));
    (*tier)->flush();
  }
  auto other = DiskTier::open(disk_config(dir.path(), 8, /*fingerprint=*/2));
  ASSERT_TRUE(other);
  EXPECT_FALSE((*other)->contains(5));
  EXPECT_EQ((*other)->stats().blocks, 0);

  // A file moved into another model's directory is refused by its header.
  fs::copy_file(fs::path(dir.path()) / "0000000000000001" / "0000000000000005.kvb",
                fs::path((*other)->directory()) / "0000000000000005.kvb");
  auto reopened = DiskTier::open(disk_config(dir.path(), 8, /*fingerprint=*/2));
  ASSERT_TRUE(reopened);
  ASSERT_TRUE((*reopened)->contains(5));
  std::vector<std::byte> got(kBlockBytes);
  EXPECT_FALSE((*reopened)->read(5, got.data()));
  EXPECT_FALSE((*reopened)->contains(5));
  EXPECT_EQ((*reopened)->stats().dropped, 1);
  EXPECT_FALSE(fs::exists(fs::path((*reopened)->directory()) / "0000000000000005.kvb"));
}

TEST(DiskTier, CorruptedFilesAreDroppedNeverUsed) {
  TempDir dir;
  auto tier = DiskTier::open(disk_config(dir.path(), 8));
  ASSERT_TRUE(tier);
  for (uint64_t k = 1; k <= 4; ++k) (*tier)->write(k, block_of(k));
  (*tier)->flush();
  auto flip = [&](kv::BlockHash key, size_t offset) {
    std::fstream f((*tier)->file_path(key), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&c, 1);
  };
  flip(1, DiskTier::kHeaderBytes + 500);  // payload: the checksum fails
  flip(2, 0);                             // magic
  flip(3, 16);                            // the key in the header
  std::vector<std::byte> got(kBlockBytes);
  for (uint64_t k = 1; k <= 3; ++k) EXPECT_FALSE((*tier)->read(k, got.data())) << k;
  EXPECT_TRUE((*tier)->read(4, got.data()));
  EXPECT_EQ(got, *block_of(4));
  EXPECT_EQ((*tier)->stats().dropped, 3);
  EXPECT_EQ((*tier)->stats().blocks, 1);
  for (uint64_t k = 1; k <= 3; ++k) EXPECT_FALSE(fs::exists((*tier)->file_path(k)));

  // Truncated files and leftovers of an interrupted write are removed at open.
  (*tier)->write(9, block_of(9));
  (*tier)->flush();
  tier->reset();
  const std::string d = dir.path() + "/0000000000000007";
  fs::resize_file(d + "/0000000000000009.kvb", 100);
  std::ofstream(d + "/000000000000000a.kvb.tmp") << "half";
  std::ofstream(d + "/notes.txt") << "not ours";
  auto reopened = DiskTier::open(disk_config(dir.path(), 8));
  ASSERT_TRUE(reopened);
  EXPECT_EQ((*reopened)->stats().blocks, 1);  // block 4
  EXPECT_EQ((*reopened)->stats().dropped, 2);
  EXPECT_FALSE(fs::exists(d + "/0000000000000009.kvb"));
  EXPECT_FALSE(fs::exists(d + "/000000000000000a.kvb.tmp"));
  EXPECT_TRUE(fs::exists(d + "/notes.txt"));
}

TEST(DiskTier, StaysWithinItsSizeLeastRecentlyUsedFirst) {
  TempDir dir;
  auto tier = DiskTier::open(disk_config(dir.path(), 3));
  ASSERT_TRUE(tier);
  for (uint64_t k = 1; k <= 3; ++k) (*tier)->write(k, block_of(k));
  (*tier)->flush();
  std::vector<std::byte> got(kBlockBytes);
  ASSERT_TRUE((*tier)->read(1, got.data()));  // 2 is now the least recently used
  (*tier)->write(4, block_of(4));
  (*tier)->flush();
  EXPECT_TRUE((*tier)->contains(1));
  EXPECT_FALSE((*tier)->contains(2));
  EXPECT_FALSE(fs::exists((*tier)->file_path(2)));
  EXPECT_EQ((*tier)->stats().blocks, 3);
  EXPECT_EQ((*tier)->stats().evictions, 1);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator((*tier)->directory())) files += e.is_regular_file();
  EXPECT_EQ(files, 3u);

  // Reopened with a smaller bound, the oldest files go first. (The clock
  // behind file times can be coarser than these writes: set them.)
  const auto now = fs::file_time_type::clock::now();
  fs::last_write_time((*tier)->file_path(3), now - std::chrono::seconds(30));
  fs::last_write_time((*tier)->file_path(1), now - std::chrono::seconds(20));
  fs::last_write_time((*tier)->file_path(4), now - std::chrono::seconds(10));
  tier->reset();
  auto smaller = DiskTier::open(disk_config(dir.path(), 1));
  ASSERT_TRUE(smaller);
  EXPECT_EQ((*smaller)->stats().blocks, 1);
  EXPECT_TRUE((*smaller)->contains(4));
}

TEST(DiskTier, RefusesABadConfig) {
  EXPECT_FALSE(DiskTier::open(disk_config("", 4)));
  TempDir dir;
  EXPECT_FALSE(DiskTier::open(disk_config(dir.path(), 0)));
  std::ofstream(dir.path()) << "a file where the directory should be";
  EXPECT_FALSE(DiskTier::open(disk_config(dir.path(), 4)));
}

// A pool's memory: n blocks of kBlockBytes.
class FakeStorage : public kv::KVBlockStorage {
 public:
  explicit FakeStorage(int32_t n) : blocks_(n, std::vector<std::byte>(kBlockBytes)) {}
  size_t block_bytes() const override { return kBlockBytes; }
  void read_block(int32_t b, std::byte* dst) const override {
    std::memcpy(dst, blocks_[b].data(), kBlockBytes);
  }
  void write_block(int32_t b, const std::byte* src) override { std::memcpy(blocks_[b].data(), src, kBlockBytes); }
  std::vector<std::byte>& at(int32_t b) { return blocks_[b]; }

 private:
  std::vector<std::vector<std::byte>> blocks_;
};

TEST(TieredConnector, EvictedBlocksComeBackFromHostThenDisk) {
  TempDir dir;
  FakeStorage pool(8);
  OffloadConfig config{.host_bytes = 2 * kBlockBytes, .disk_path = dir.path(), .disk_bytes = 1 << 20};
  auto c = TieredConnector::create(config, pool, /*fingerprint=*/11);
  ASSERT_TRUE(c) << c.error().message;
  TieredConnector& conn = **c;
  for (int32_t b = 1; b <= 3; ++b) pool.at(b) = *block_of(b);
  const std::vector<kv::BlockTransfer> evicted = {{101, 1}, {102, 2}, {103, 3}};
  conn.save_evicted(evicted);
  conn.flush();
  // Host keeps the last two; disk has all three.
  EXPECT_FALSE(conn.host()->contains(101));
  EXPECT_TRUE(conn.host()->contains(103));
  for (kv::BlockHash k : {101, 102, 103}) EXPECT_TRUE(conn.contains(k));
  EXPECT_FALSE(conn.contains(104));

  const std::vector<kv::BlockTransfer> loads = {{101, 5}, {103, 6}};
  EXPECT_EQ(conn.load(loads, /*stopped_at_miss=*/true), (std::vector<bool>{true, true}));
  EXPECT_EQ(pool.at(5), *block_of(1));
  EXPECT_EQ(pool.at(6), *block_of(3));
  const OffloadStats s = conn.stats();
  EXPECT_EQ(s.host.hits, 1);    // 103
  EXPECT_EQ(s.host.misses, 2);  // 101, and the block that ended the lookup
  EXPECT_EQ(s.disk.hits, 1);    // 101
  EXPECT_EQ(s.disk.misses, 1);  // the block that ended the lookup
  EXPECT_EQ(s.disk.saves, 3);
  EXPECT_TRUE(conn.host()->contains(101));  // read from disk, kept in memory
}

TEST(TieredConnector, ComputedBlocksGoToDiskOnlyAndOnce) {
  TempDir dir;
  FakeStorage pool(4);
  OffloadConfig config{.host_bytes = 4 * kBlockBytes, .disk_path = dir.path(), .disk_bytes = 1 << 20};
  auto c = TieredConnector::create(config, pool, 11);
  ASSERT_TRUE(c);
  pool.at(1) = *block_of(1);
  (*c)->save_computed(std::vector<kv::BlockTransfer>{{55, 1}});
  (*c)->save_computed(std::vector<kv::BlockTransfer>{{55, 1}});
  (*c)->flush();
  EXPECT_FALSE((*c)->host()->contains(55));  // the pool still holds it
  EXPECT_EQ((*c)->stats().disk.saves, 1);
  EXPECT_EQ((*c)->load(std::vector<kv::BlockTransfer>{{55, 3}}, false), (std::vector<bool>{true}));
  EXPECT_EQ(pool.at(3), *block_of(1));

  // Without a disk tier, computed blocks are not copied anywhere.
  OffloadConfig host_config;
  host_config.host_bytes = 4 * kBlockBytes;
  auto host_only = TieredConnector::create(host_config, pool, 11);
  ASSERT_TRUE(host_only);
  (*host_only)->save_computed(std::vector<kv::BlockTransfer>{{56, 1}});
  EXPECT_FALSE((*host_only)->contains(56));
}

TEST(TieredConnector, ABadDiskBlockIsReportedAndDropped) {
  TempDir dir;
  FakeStorage pool(4);
  OffloadConfig config{.host_bytes = 0, .disk_path = dir.path(), .disk_bytes = 1 << 20};
  auto c = TieredConnector::create(config, pool, 11);
  ASSERT_TRUE(c);
  pool.at(1) = *block_of(1);
  (*c)->save_evicted(std::vector<kv::BlockTransfer>{{77, 1}});
  (*c)->flush();
  {
    std::fstream f((*c)->disk()->file_path(77), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(DiskTier::kHeaderBytes + 3);
    f.put('\x5a');
  }
  EXPECT_EQ((*c)->load(std::vector<kv::BlockTransfer>{{77, 2}}, false), (std::vector<bool>{false}));
  EXPECT_FALSE((*c)->contains(77));
  EXPECT_EQ((*c)->stats().disk.dropped, 1);
}

// Random saves and loads against a model of what each tier must hold: every
// load returns exactly the bytes saved under that key, and the tiers stay
// within their bounds. (A block the writer evicts between a lookup and its
// load fails the load, which the scheduler answers by computing it; the
// lookups here follow a flush so that each load must succeed.)
TEST(TieredConnector, RandomOperationsKeepBytesAndBounds) {
  TempDir dir;
  FakeStorage pool(16);
  OffloadConfig config{.host_bytes = 5 * kBlockBytes,
                       .disk_path = dir.path(),
                       .disk_bytes = 9 * static_cast<int64_t>(DiskTier::kHeaderBytes + kBlockBytes)};
  auto c = TieredConnector::create(config, pool, 3);
  ASSERT_TRUE(c);
  std::mt19937 rng(1234);
  std::map<kv::BlockHash, uint64_t> content;  // key -> seed of its bytes
  for (int step = 0; step < 400; ++step) {
    const kv::BlockHash key = rng() % 24;
    const int32_t block = 1 + static_cast<int32_t>(rng() % 15);
    if (rng() % 2) {
      if (!content.count(key)) content[key] = key * 7919 + 1;  // a prefix's bytes never change
      pool.at(block) = *block_of(content[key]);
      if (rng() % 3) (*c)->save_evicted(std::vector<kv::BlockTransfer>{{key, block}});
      else (*c)->save_computed(std::vector<kv::BlockTransfer>{{key, block}});
      if (rng() % 4 == 0) (*c)->flush();
    } else if ((*c)->flush(), (*c)->contains(key)) {  // flushed: no eviction races the lookup
      std::fill(pool.at(block).begin(), pool.at(block).end(), std::byte{0});
      ASSERT_EQ((*c)->load(std::vector<kv::BlockTransfer>{{key, block}}, false), (std::vector<bool>{true}));
      ASSERT_EQ(pool.at(block), *block_of(content.at(key))) << "step " << step;
    }
    const OffloadStats s = (*c)->stats();
    ASSERT_LE(s.host.bytes, config.host_bytes);
    const Status inv = (*c)->check_invariants();
    ASSERT_TRUE(inv.ok()) << inv.error().message;
    ASSERT_LE(s.disk.bytes, config.disk_bytes);
  }
  (*c)->flush();
  EXPECT_EQ((*c)->stats().disk.dropped, 0);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator((*c)->disk()->directory())) files += e.is_regular_file();
  EXPECT_EQ(static_cast<int64_t>(files), (*c)->stats().disk.blocks);
}

}  // namespace
}  // namespace inferd::kvstore
