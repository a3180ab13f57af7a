// The seam through which KV blocks leave the pool and come back (vLLM v1's
// KVConnector, scheduler side): offload tiers below the pool, and later the
// transfer between prefill and decode instances, implement it. The scheduler
// consults it; the forward pass never knows it exists.
//
// Blocks are named by the key the pool caches them under (group_block_hash of
// a chained prefix hash), so a block found again anywhere is the same prefix
// of the same layers. What the bytes of a block are is the KVBlockStorage's
// business; a connector copies them whole.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/block_hash.h"

namespace inferd::kv {

// The pool's memory as a connector sees it: block b is block_bytes() bytes
// (every layer of its group, keys and values), read and written whole.
class KVBlockStorage {
 public:
  virtual ~KVBlockStorage() = default;
  virtual size_t block_bytes() const = 0;
  virtual void read_block(int32_t block, std::byte* dst) const = 0;
  virtual void write_block(int32_t block, const std::byte* src) = 0;
};

// A block of the pool that holds (save) or is to hold (load) the prefix block `key`.
struct BlockTransfer {
  BlockHash key = 0;
  int32_t block = 0;
};

// A load that did not finish when it was started (KVConnector::start_load),
// reported once, whether it filled every block.
struct FinishedLoad {
  std::string request_id;
  bool ok = false;
};

class KVConnector {
 public:
  virtual ~KVConnector() = default;

  // Whether the connector can supply this block (a lookup; changes nothing).
  virtual bool contains(BlockHash key) const = 0;

  // Fills pool blocks with the blocks the connector holds, before any forward
  // pass reads them. Called once per admitted request whose prefix lookup
  // went past the pool's own blocks: `loads` are the blocks it found here
  // (maybe none), and `stopped_at_miss` says the lookup then ended at a block
  // nobody held (not at the end of the prompt), for the connector's hit and
  // miss counts. Returns, per load, whether the block was filled; a block
  // that fails the connector's checks is dropped and counted there, never
  // used.
  virtual std::vector<bool> load(std::span<const BlockTransfer> loads, bool stopped_at_miss) = 0;

  // The scheduler's entry point for loads (vLLM's WAITING_FOR_REMOTE_KVS): a
  // connector whose loads finish at once (the tiers) returns load()'s answer;
  // one whose loads take time (a network transfer) may return nullopt when
  // `may_defer`: the loads are under way, the request waits holding its
  // blocks, and take_finished_loads reports them, all or nothing, once nothing
  // will write into those blocks any more (success, failure or timeout).
  virtual std::optional<std::vector<bool>> start_load(const std::string& /*request_id*/,
                                                      std::span<const BlockTransfer> loads, bool stopped_at_miss,
                                                      bool /*may_defer*/) {
    return load(loads, stopped_at_miss);
  }
  // Deferred loads finished since the last call (each reported exactly once).
  virtual std::vector<FinishedLoad> take_finished_loads() { return {}; }
  // Deferred loads still under way (the scheduler waits for them at shutdown).
  virtual bool has_unfinished_loads() const { return false; }

  // Blocks the pool is about to reuse for other tokens: each still holds the
  // (full, computed) prefix block `key` and keeps it until the forward pass
  // that follows, so the connector copies what it wants to keep now.
  virtual void save_evicted(std::span<const BlockTransfer> evicted) = 0;

  // Blocks that have just become full, computed and findable in the pool
  // (after the step that computed them): a durable tier may copy them now,
  // so that what the pool holds survives a restart.
  virtual void save_computed(std::span<const BlockTransfer> computed) = 0;
};

}  // namespace inferd::kv
