// Prefix caching for models with recurrent layers: copies of a sequence's
// whole state slot taken at block boundaries of its prompt, each findable
// under the chained hash of the prefix it ends (the key the prefix's last
// block is cached under) and tied to that block, its anchor: when the block
// pool reuses the anchor, the snapshot goes with it. A later request whose
// prompt starts with that prefix copies the snapshot into its own slot and
// computes only the rest (KVCacheManager::get_computed_blocks).
//
// A snapshot slot is free, reserved (a request writes it during its coming
// step; not findable yet), or cached. A reservation takes a free slot, else
// evicts the least recently used cached snapshot that no request is about to
// read (pinned). The cache only counts and names slots; the executor owns the
// bytes (model/kv_cache.h). Slot numbers are the cache's own, from first_slot
// on: the running requests' slots come before them.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "kv/block_hash.h"

namespace inferd::kv {

class StateSnapshotCache {
 public:
  StateSnapshotCache(int32_t first_slot, int32_t n_slots);

  int32_t num_slots() const { return static_cast<int32_t>(slots_.size()); }
  int32_t num_cached() const { return static_cast<int32_t>(by_key_.size()); }
  int32_t num_reserved() const { return num_reserved_; }
  int32_t num_free() const { return num_slots() - num_cached() - num_reserved(); }

  // A slot for a snapshot that will be written in the coming step, or nullopt
  // when every slot is reserved or pinned.
  std::optional<int32_t> reserve();
  // The reserved slot now holds the state at the end of the prefix `key`,
  // whose last block (of the first KV group) is `anchor`: it becomes
  // findable. When another slot holds that prefix already (two requests
  // computed it at once), this one is freed instead.
  void commit(int32_t slot, BlockHash key, int32_t anchor);
  // A reservation that was not written (its request was preempted or ended).
  void release(int32_t slot);

  // The cached snapshot of the prefix `key`, if any.
  std::optional<int32_t> lookup(BlockHash key) const;
  // A request reads the snapshot in its coming step: it is not evicted until
  // unpinned, and counts as the most recently used.
  void pin(int32_t slot);
  void unpin(int32_t slot);
  int32_t pins(int32_t slot) const { return at(slot).pins; }
  bool is_reserved(int32_t slot) const { return at(slot).state == State::kReserved; }

  // The pool reuses these blocks: the snapshots anchored to them are dropped.
  void drop_anchored(std::span<const int32_t> blocks);
  // Cached snapshots as (key, anchor), for the manager's invariants.
  std::vector<std::pair<BlockHash, int32_t>> cached() const;

  // Each cached slot is listed once under its key and its anchor, and no
  // other is; only cached slots are pinned.
  Status check_invariants() const;

 private:
  enum class State : uint8_t { kFree, kReserved, kCached };
  struct Slot {
    State state = State::kFree;
    BlockHash key = 0;
    int32_t anchor = 0;
    int32_t pins = 0;
    uint64_t last_use = 0;  // a tick of use_clock_: the smallest is evicted first
  };
  Slot& at(int32_t slot);
  const Slot& at(int32_t slot) const;
  void drop(int32_t slot);  // a cached one becomes free

  int32_t first_slot_;
  std::vector<Slot> slots_;
  std::unordered_map<BlockHash, int32_t> by_key_;
  std::unordered_map<int32_t, int32_t> by_anchor_;
  int32_t num_reserved_ = 0;
  uint64_t use_clock_ = 0;
};

}  // namespace inferd::kv
