// The middle layer of the paged KV cache: which blocks each request holds,
// prefix lookup, and allocation that either succeeds whole or changes nothing.
// Policy (who runs, who is preempted) is the scheduler's; this class never
// chooses between requests.
//
// A model's layers fall into KV groups (vLLM v1's KV cache groups): every
// group's block holds the same number of layers, so all groups draw on one
// pool, and each request holds one block table per group. Block i of a table
// holds the request's tokens [i * block_size, (i + 1) * block_size) for that
// group's layers. A full-attention group keeps every block; a sliding-window
// group gives back the blocks that fall wholly out of its window and puts the
// reserved null block in their place, so a long request holds a window's worth
// of blocks there. Tables only grow at the end; entries only turn null, or
// (copy on write, below) are replaced by a private copy of a shared block.
//
// Beam search forks a request: the child references the parent's blocks
// (reference counts), so beams share their common prefix. A block that a
// request is about to write while another request also holds it (the last,
// partial block of a fork) is copied first: allocate_slots gives the writer a
// fresh block and returns the (source, destination) pair for the runner to
// copy before the step's forward pass. Full blocks are never written again,
// so only that partial block is ever copied.
// Requests are named by id; the token ids are passed in where a call needs
// them, so this module does not depend on the engine's Request type.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "kv/block_hash.h"
#include "kv/block_pool.h"
#include "kv/kv_connector.h"
#include "kv/state_slot_pool.h"
#include "kv/state_snapshot_cache.h"

namespace inferd::kv {

struct KVCacheConfig {
  int32_t n_blocks = 0;     // including the reserved null block
  int32_t block_size = 16;  // tokens per block
  bool enable_prefix_caching = true;
  // One entry per KV group: 0 for full attention, W > 0 for layers whose
  // token at position p attends to positions (p - W, p]. Empty: one
  // full-attention group.
  std::vector<int64_t> group_windows;
  // A model with recurrent layers (KVCacheKind::kRecurrentState): how many
  // sequences' states the executor keeps, which bounds the requests that hold
  // blocks at once. 0: no recurrent layers, no slots.
  int32_t n_state_slots = 0;
  // Prefix caching beside recurrent layers: a hybrid model's attention blocks
  // are useless without the state at their end, so a prefix is found only up
  // to a block boundary where a snapshot of the state was kept
  // (StateSnapshotCache): this many snapshot slots (0: no prefix caching for
  // such a model; the constructor turns it off), taken at every multiple of
  // state_snapshot_interval tokens of a prompt (a multiple of block_size; 0:
  // none) and at its last full block.
  int32_t n_state_snapshots = 0;
  int64_t state_snapshot_interval = 0;
  // Speculative decoding beside recurrent layers: this many more slots per
  // running slot, where a verifying step keeps the state before its drafts
  // and after each of the first state_checkpoints - 1 of them, so that a
  // verification that rejects drafts goes back to the state after the last
  // accepted one (state_checkpoint_slot). 1: the state before the drafts only
  // (the accepted drafts are computed again); k: every state an acceptance
  // can stop at (SpeculativeConfig::StateRollback). 0: none.
  int32_t state_checkpoints = 0;

  int32_t num_groups() const { return group_windows.empty() ? 1 : static_cast<int32_t>(group_windows.size()); }
  int64_t window(int32_t group) const { return group_windows.empty() ? 0 : group_windows[group]; }
};

// Every state slot a cache of this config keeps (KVCacheManager::num_state_slots_in_cache).
int32_t state_slots_in_cache(const KVCacheConfig& config);

// The most blocks a request of `n_tokens` tokens holds at once (all groups),
// when no step feeds it more than `max_step_tokens` tokens: with that many
// free it can always run alone.
int64_t max_blocks_held(const KVCacheConfig& config, int64_t n_tokens, int64_t max_step_tokens);

// A block of a prefix hit that the pool lacks but a connector holds: its
// table entry is kExternalBlock until allocate_slots gives it a fresh block,
// which the connector then fills (KVConnector::load).
struct ExternalBlock {
  int32_t group = 0;
  int64_t index = 0;  // in the group's table
  BlockHash key = 0;  // the key the pool caches it under
};
inline constexpr int32_t kExternalBlock = -1;

// Cached blocks holding a prefix of a request's tokens, found by lookup.
struct PrefixHit {
  // Per group, the blocks for the prefix's hashes.size() blocks of tokens; a
  // sliding-window group has the null block where its window no longer reaches.
  std::vector<std::vector<int32_t>> blocks;
  std::vector<BlockHash> hashes;   // hashes[i]: the chained hash of the prefix's block i
  int64_t num_tokens = 0;          // tokens they hold: hashes.size() * block_size
  int64_t num_queried_tokens = 0;  // tokens that were looked up (0: caching off)
  // With a connector: the blocks it supplies, the tokens from the first of
  // them on (those the pool alone would have computed again), whether it was
  // asked at all (the pool's own run ended before the prompt's last full
  // block), and whether the lookup then ended at a block nobody held.
  std::vector<ExternalBlock> external;
  int64_t num_external_tokens = 0;
  bool consulted_connector = false;
  bool stopped_at_miss = false;
  // Recurrent layers: the snapshot slot holding the state after the prefix
  // (the request starts from a copy of it), or -1 for no hit.
  int32_t state_snapshot = -1;
};

// Recurrent layers: after the sequence's token at `position` - 1 is computed,
// the executor copies the sequence's state into `slot`.
struct StateSave {
  int64_t position = 0;
  int32_t slot = 0;
  bool operator==(const StateSave&) const = default;
};

// Copy on write: the runner copies every layer's keys and values of block
// `src` into block `dst` before the forward pass of the step that needs it.
struct BlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
  bool operator==(const BlockCopy&) const = default;
};

// Counted in tokens, once per admission (a lookup that is not followed by a
// successful allocation is not counted).
struct PrefixCacheStats {
  int64_t requests = 0;        // admissions that looked up the cache
  int64_t queried_tokens = 0;  // tokens of those requests
  int64_t hit_tokens = 0;      // tokens served from the pool's own blocks
  int64_t external_hit_tokens = 0;  // tokens served through a connector (PrefixHit::num_external_tokens)
};

class KVCacheManager {
 public:
  explicit KVCacheManager(const KVCacheConfig& config);

  // The longest run of cached full blocks at the start of `tokens` (prompt, or
  // prompt and output for a request resumed after preemption), capped at
  // tokens.size() - 1 tokens so the last token is always computed and yields
  // logits. Every full-attention group must hold the whole run; a
  // sliding-window group only the blocks the next token's window reaches.
  // Pure lookup: nothing changes until allocate_slots takes the hit. With a
  // connector, a block the pool lacks counts as held when the connector has
  // it (PrefixHit::external).
  PrefixHit get_computed_blocks(std::span<const int32_t> tokens, uint64_t extra_key,
                                const KVConnector* connector = nullptr) const;

  // Gives the request slots for `num_new_tokens` more tokens after the
  // `num_computed_tokens` it already has slots for (plus, for a request that
  // holds no blocks yet, the cached prefix `hit`, whose blocks it then
  // references). First, sliding-window groups give back the blocks no token
  // from position num_computed_tokens on can see (that happens even when the
  // allocation then fails: nothing will read them again). A block the new
  // tokens are written into that another request also holds (a fork's shared
  // partial block) is replaced by a fresh one, and the pair is appended to
  // `copies`, which must then be given (a contract check stops a caller that
  // forks but ignores copies). Returns the non-null block ids appended to its
  // tables (group by group, hit blocks first), or nullopt, changing nothing
  // more, if there are not enough free or evictable blocks for the new blocks
  // and the copies together, or (recurrent layers) no free state slot for a
  // request that holds nothing yet: its first allocation takes one. The hit's external blocks get fresh blocks too,
  // listed in `loads` (which must then be given) for the caller to fill and
  // then pass to cache_loaded, or to free the request if it cannot.
  std::optional<std::vector<int32_t>> allocate_slots(const std::string& request_id,
                                                     int64_t num_computed_tokens,
                                                     int64_t num_new_tokens,
                                                     const PrefixHit& hit = {},
                                                     std::vector<BlockCopy>* copies = nullptr,
                                                     std::vector<BlockTransfer>* loads = nullptr);

  // Blocks filled by a connector (allocate_slots' `loads`) become findable
  // under their keys, as computed ones do.
  void cache_loaded(std::span<const BlockTransfer> loads);

  // Evictions of cached blocks, and blocks made findable, since the last
  // call, noted only when record_transitions is on (an offload tier saves
  // them; BlockPool).
  void record_transitions(bool on) { pool_.record_transitions(on); }
  std::vector<BlockTransfer> take_evictions() { return pool_.take_evictions(); }
  std::vector<BlockTransfer> take_newly_cached() { return pool_.take_newly_cached(); }

  // Beam search: `child_id`, which holds nothing, gets the parent's blocks
  // that hold its first `num_tokens` tokens, by reference (each block's count
  // goes up by one; a sliding-window group's null entries stay null), and the
  // prefix hashes of the full ones. Nothing is copied and nothing can fail:
  // the shared partial block is copied when one of them first writes it
  // (allocate_slots). num_tokens must be covered by the parent's tables.
  void fork(const std::string& parent_id, const std::string& child_id, int64_t num_tokens);

  // After the first `num_computed_tokens` of `tokens` are in the cache: hashes
  // the request's blocks that became full and makes them findable, with the
  // state snapshots its step saved at their boundaries; the snapshot it
  // started from (a prefix hit's) has been read and may be evicted again.
  void cache_full_blocks(const std::string& request_id, std::span<const int32_t> tokens,
                         int64_t num_computed_tokens, uint64_t extra_key);

  // Recurrent layers with prefix caching: snapshot slots for the request's
  // state at the snapshot points in (begin, end] (every multiple of
  // state_snapshot_interval, and the last full block of its first
  // `prompt_tokens` tokens; none past them), as far as slots can be reserved.
  // The request computes positions [begin, end) in its coming step and the
  // executor saves its state at each point; cache_full_blocks then makes
  // each findable under its prefix. Empty without snapshots.
  std::vector<StateSave> reserve_state_snapshots(const std::string& request_id, int64_t begin, int64_t end,
                                                 int64_t prompt_tokens);

  // Drops the request's references, last block first, so that of its cached
  // blocks the tail of the sequence is evicted before the head, and returns
  // its state slot (preemption by recompute too: the state is rebuilt) and
  // any snapshot slots it reserved or was to read. No-op for an id that
  // holds nothing.
  void free(const std::string& request_id);

  // The request's blocks in order for one group (empty if it holds none).
  std::span<const int32_t> block_table(const std::string& request_id, int32_t group = 0) const;
  int32_t num_groups() const { return config_.num_groups(); }
  // Blocks the request holds now, over all groups (null entries not counted).
  int64_t num_blocks_held(const std::string& request_id) const;
  bool holds_blocks(const std::string& request_id) const { return requests_.count(request_id) > 0; }
  // Recurrent layers: the request's state slot (held exactly while it holds
  // blocks), or nullopt.
  std::optional<int32_t> state_slot(const std::string& request_id) const { return state_slots_.slot_of(request_id); }
  bool has_state_slots() const { return config_.n_state_slots > 0; }
  int32_t num_state_slots() const { return state_slots_.num_slots(); }
  int32_t num_free_state_slots() const { return state_slots_.num_free(); }
  // Speculative decoding: the slot that keeps the request's state before its
  // draft `index` (its checkpoint `index`, 0 <= index < num_state_checkpoints()),
  // or nullopt without checkpoints.
  std::optional<int32_t> state_checkpoint_slot(const std::string& request_id, int32_t index = 0) const;
  bool has_state_checkpoints() const { return num_state_checkpoints() > 0; }
  int32_t num_state_checkpoints() const { return has_state_slots() ? config_.state_checkpoints : 0; }
  const StateSnapshotCache& state_snapshots() const { return snapshots_; }
  // Every slot the executor keeps, numbered: the running requests' state
  // slots, then their checkpoints, then the snapshots.
  int32_t num_state_slots_in_cache() const { return state_slots_in_cache(config_); }
  int64_t num_requests() const { return static_cast<int64_t>(requests_.size()); }

  int32_t block_size() const { return config_.block_size; }
  bool prefix_caching_enabled() const { return config_.enable_prefix_caching; }
  int64_t blocks_for_tokens(int64_t n_tokens) const {
    return (n_tokens + config_.block_size - 1) / config_.block_size;
  }
  int32_t num_usable_blocks() const { return pool_.num_usable_blocks(); }
  int32_t num_free_blocks() const { return pool_.num_free_blocks(); }  // empty + evictable
  int32_t num_used_blocks() const { return num_usable_blocks() - num_free_blocks(); }
  double usage() const { return pool_.usage(); }
  const PrefixCacheStats& prefix_cache_stats() const { return stats_; }
  // Puts the admission counts back (a beam group is admitted whole or not at
  // all: the beams that did fit give their blocks back, and their counts).
  void restore_prefix_cache_stats(const PrefixCacheStats& stats) { stats_ = stats; }
  const BlockPool& pool() const { return pool_; }

  // The pool's invariants, plus: every block's reference count equals the
  // number of request tables that hold it; free + used == usable; no table
  // holds a block twice, and only sliding-window tables hold the null block;
  // a request's tables are equally long; of each table, exactly the blocks the
  // request has hashed may be findable, and under the request's hash; with
  // recurrent layers, exactly the requests that hold blocks hold a state slot;
  // every reserved snapshot slot is one request's, every pin a reader's, and
  // every cached snapshot's anchor block is cached under its prefix.
  Status check_invariants() const;

 private:
  struct RequestBlocks {
    std::vector<std::vector<int32_t>> tables;  // per group
    std::vector<BlockHash> hashes;  // prefix hashes of blocks [0, hashes.size()): full and computed
    std::vector<StateSave> snapshots_to_save;  // reserved, written by the coming step
    int32_t reads_snapshot = -1;               // the pinned snapshot its first step starts from
  };

  // pool_.allocate, dropping the snapshots anchored to the blocks it reuses.
  std::vector<int32_t> allocate_blocks(int32_t n);
  // Gives back the request's reserved snapshot slots and its pin.
  void release_snapshots(RequestBlocks& rb);

  // Frees a sliding-window group's blocks that no position >= first_position sees.
  void free_out_of_window_blocks(RequestBlocks& rb, int64_t first_position);

  KVCacheConfig config_;
  BlockPool pool_;
  StateSlotPool state_slots_;
  StateSnapshotCache snapshots_;
  std::unordered_map<std::string, RequestBlocks> requests_;
  PrefixCacheStats stats_;
};

}  // namespace inferd::kv
