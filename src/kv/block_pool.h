// The bottom layer of the paged KV cache: a fixed set of blocks with reference
// counts, a free list kept in eviction order, and the hash -> block map of
// prefix caching. It knows nothing about requests.
//
// A block whose reference count drops to zero joins the free list but keeps
// its hash, so a later request with the same prefix can take it back (`touch`)
// until `allocate` reuses it; only then is the hash dropped. Allocation takes
// from the head of the free list, so the least recently freed cached block is
// evicted first.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/result.h"
#include "kv/block_hash.h"
#include "kv/kv_connector.h"

namespace inferd::kv {

class BlockPool {
 public:
  // Block 0 is never handed out: a runner can point padding slots at it.
  static constexpr int32_t kNullBlock = 0;

  explicit BlockPool(int32_t n_blocks);  // n_blocks >= 2 (the null block and one usable)

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t num_usable_blocks() const { return num_blocks() - 1; }
  // Blocks with no reference: empty ones and cached ones that may be evicted.
  int32_t num_free_blocks() const { return num_free_; }
  // Blocks that hold a cached prefix, in use or free.
  int32_t num_cached_blocks() const { return static_cast<int32_t>(hash_to_block_.size()); }
  // Fraction of the usable blocks that are referenced.
  double usage() const;
  // Cached blocks whose hash was dropped because allocate() reused them.
  int64_t num_evictions() const { return num_evictions_; }

  // Takes n blocks from the head of the free list (requires n <= num_free_blocks()),
  // dropping the hash of any cached block among them; each gets reference count 1.
  std::vector<int32_t> allocate(int32_t n);
  // The block holding the prefix with this hash, in use or free.
  std::optional<int32_t> lookup(BlockHash hash) const;
  // Takes a reference on each block; a free (cached) one leaves the free list.
  void touch(std::span<const int32_t> blocks);
  // Drops a reference on each block, in the order given. A block that reaches
  // zero joins the free list: at the tail if it is cached (evicted last, in
  // the order freed), at the head if not (it holds nothing worth keeping).
  void free(std::span<const int32_t> blocks);
  // Records that `block` (referenced, full, computed) holds the prefix with
  // this hash. Returns false and changes nothing when another block already
  // holds that prefix (two requests computed it at the same time): the first
  // stays the cached copy.
  bool cache(int32_t block, BlockHash hash);

  int32_t ref_count(int32_t block) const { return blocks_[block].ref_count; }
  std::optional<BlockHash> block_hash(int32_t block) const;
  // The free list, head (next to be allocated) first.
  std::vector<int32_t> free_list() const;

  // While on, allocate() notes each cached block it evicts (its hash and id),
  // for an offload tier to copy before the block is written again, and
  // cache() each block it makes findable.
  void record_transitions(bool on) { record_transitions_ = on; }
  // The evictions noted since the last call.
  std::vector<BlockTransfer> take_evictions() { return std::exchange(evictions_, {}); }
  // The blocks made findable since the last call.
  std::vector<BlockTransfer> take_newly_cached() { return std::exchange(newly_cached_, {}); }

  // Reference counts are non-negative; a usable block is on the free list
  // exactly when its count is zero; the list is well linked and its length is
  // num_free_blocks(); the hash map and the blocks' hashes agree both ways.
  Status check_invariants() const;

 private:
  struct Block {
    int32_t ref_count = 0;
    bool cached = false;  // `hash` is valid and hash_to_block_[hash] == this block
    bool in_free_list = false;
    BlockHash hash = 0;
  };

  void unlink(int32_t b);
  void insert_before(int32_t b, int32_t pos);  // pos: a listed block or the sentinel
  int32_t sentinel() const { return num_blocks(); }

  std::vector<Block> blocks_;
  // The free list is circular and doubly linked through a sentinel at index
  // num_blocks(): next_[sentinel] is the head, prev_[sentinel] the tail.
  std::vector<int32_t> prev_, next_;
  int32_t num_free_ = 0;
  int64_t num_evictions_ = 0;
  std::unordered_map<BlockHash, int32_t> hash_to_block_;
  bool record_transitions_ = false;
  std::vector<BlockTransfer> evictions_, newly_cached_;
};

}  // namespace inferd::kv
