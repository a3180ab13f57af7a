// The host-memory tier of the KV offload store: copies of KV blocks the pool
// evicted, keyed by their prefix-block key, bounded in bytes, least recently
// used dropped first. Not thread-safe: the engine loop owns it. Blocks are
// shared immutable buffers, so the disk tier's writer can hold one while this
// tier drops it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "kv/block_hash.h"

namespace inferd::kvstore {

using BlockBytes = std::shared_ptr<const std::vector<std::byte>>;

struct TierStats {
  int64_t blocks = 0;     // held now
  int64_t bytes = 0;      // held now
  int64_t capacity_bytes = 0;
  int64_t hits = 0;       // lookups of a block it held (one per block loaded from it)
  int64_t misses = 0;     // lookups of a block it did not hold
  int64_t loads = 0;      // blocks copied from it into the pool
  int64_t saves = 0;      // blocks written to it
  int64_t evictions = 0;  // blocks dropped to stay within capacity
  int64_t dropped = 0;    // blocks found bad (size, checksum, fingerprint, I/O) and deleted
};

class HostTier {
 public:
  explicit HostTier(int64_t capacity_bytes) { stats_.capacity_bytes = capacity_bytes; }

  bool contains(kv::BlockHash key) const { return index_.count(key) > 0; }
  // Makes a held block the most recently used; false if absent.
  bool touch(kv::BlockHash key);
  // The block, made the most recently used; null if absent.
  BlockBytes get(kv::BlockHash key);
  // Keeps the block (or, if held, makes it the most recently used), then drops
  // least recently used blocks until the tier fits its capacity. A block
  // larger than the whole capacity is not kept.
  void put(kv::BlockHash key, BlockBytes bytes);

  const TierStats& stats() const { return stats_; }
  TierStats& stats() { return stats_; }
  // The counts agree with the blocks held, which fit the capacity.
  Status check_invariants() const;
  // Keys from most to least recently used (tests).
  std::vector<kv::BlockHash> keys_by_recency() const;

 private:
  struct Entry {
    kv::BlockHash key;
    BlockBytes bytes;
  };
  std::list<Entry> lru_;  // front: most recently used
  std::unordered_map<kv::BlockHash, std::list<Entry>::iterator> index_;
  TierStats stats_;
};

}  // namespace inferd::kvstore
