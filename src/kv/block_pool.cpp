#include "kv/block_pool.h"

#include <string>

#include "kv/check.h"

namespace inferd::kv {

BlockPool::BlockPool(int32_t n_blocks)
    : blocks_(n_blocks), prev_(n_blocks + 1), next_(n_blocks + 1) {
  INFERD_KV_CHECK(n_blocks >= 2, "a pool needs the null block and at least one usable block");
  prev_[sentinel()] = next_[sentinel()] = sentinel();
  for (int32_t b = 1; b < n_blocks; ++b) insert_before(b, sentinel());
}

double BlockPool::usage() const {
  return 1.0 - static_cast<double>(num_free_) / num_usable_blocks();
}

void BlockPool::unlink(int32_t b) {
  next_[prev_[b]] = next_[b];
  prev_[next_[b]] = prev_[b];
  blocks_[b].in_free_list = false;
  --num_free_;
}

void BlockPool::insert_before(int32_t b, int32_t pos) {
  prev_[b] = prev_[pos];
  next_[b] = pos;
  next_[prev_[pos]] = b;
  prev_[pos] = b;
  blocks_[b].in_free_list = true;
  ++num_free_;
}

std::vector<int32_t> BlockPool::allocate(int32_t n) {
  INFERD_KV_CHECK(n >= 0 && n <= num_free_, "allocating more blocks than are free");
  std::vector<int32_t> out;
  out.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = next_[sentinel()];
    unlink(b);
    Block& blk = blocks_[b];
    if (blk.cached) {  // evict: its prefix is no longer findable
      hash_to_block_.erase(blk.hash);
      blk.cached = false;
      ++num_evictions_;
      if (record_transitions_) evictions_.push_back({blk.hash, b});
    }
    blk.ref_count = 1;
    out.push_back(b);
  }
  return out;
}

std::optional<int32_t> BlockPool::lookup(BlockHash hash) const {
  auto it = hash_to_block_.find(hash);
  if (it == hash_to_block_.end()) return std::nullopt;
  return it->second;
}

void BlockPool::touch(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    INFERD_KV_CHECK(b > kNullBlock && b < num_blocks(), "touching an invalid block");
    if (blocks_[b].ref_count == 0) unlink(b);
    ++blocks_[b].ref_count;
  }
}

void BlockPool::free(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    INFERD_KV_CHECK(b > kNullBlock && b < num_blocks(), "freeing an invalid block");
    Block& blk = blocks_[b];
    INFERD_KV_CHECK(blk.ref_count > 0, "freeing a block that holds no reference");
    if (--blk.ref_count == 0) insert_before(b, blk.cached ? sentinel() : next_[sentinel()]);
  }
}

bool BlockPool::cache(int32_t block, BlockHash hash) {
  INFERD_KV_CHECK(block > kNullBlock && block < num_blocks(), "caching an invalid block");
  Block& blk = blocks_[block];
  INFERD_KV_CHECK(blk.ref_count > 0, "caching a block nobody holds");
  if (blk.cached) return blk.hash == hash;
  if (!hash_to_block_.emplace(hash, block).second) return false;
  blk.cached = true;
  blk.hash = hash;
  if (record_transitions_) newly_cached_.push_back({hash, block});
  return true;
}

std::optional<BlockHash> BlockPool::block_hash(int32_t block) const {
  if (!blocks_[block].cached) return std::nullopt;
  return blocks_[block].hash;
}

std::vector<int32_t> BlockPool::free_list() const {
  std::vector<int32_t> out;
  out.reserve(num_free_);
  for (int32_t b = next_[sentinel()]; b != sentinel(); b = next_[b]) out.push_back(b);
  return out;
}

Status BlockPool::check_invariants() const {
  auto fail = [](const std::string& what) { return Status(make_error("BlockPool: " + what)); };
  const Block& null = blocks_[kNullBlock];
  if (null.ref_count != 0 || null.in_free_list || null.cached)
    return fail("the null block was handed out, listed or cached");

  // Walk the list both ways, counting, so a broken link or a cycle shows.
  int32_t listed = 0;
  for (int32_t b = next_[sentinel()], prev = sentinel(); b != sentinel(); prev = b, b = next_[b]) {
    if (b <= kNullBlock || b >= num_blocks()) return fail("free list holds invalid block " + std::to_string(b));
    if (prev_[b] != prev) return fail("free list back link broken at block " + std::to_string(b));
    if (!blocks_[b].in_free_list) return fail("block " + std::to_string(b) + " is listed but not marked free");
    if (++listed > num_usable_blocks()) return fail("free list has a cycle");
  }
  if (listed != num_free_)
    return fail("free list has " + std::to_string(listed) + " blocks, counter says " + std::to_string(num_free_));

  int32_t n_cached = 0;
  for (int32_t b = 1; b < num_blocks(); ++b) {
    const Block& blk = blocks_[b];
    const std::string name = "block " + std::to_string(b);
    if (blk.ref_count < 0) return fail(name + " has a negative reference count");
    if (blk.in_free_list != (blk.ref_count == 0))
      return fail(name + (blk.in_free_list ? " is free but referenced" : " is unreferenced but not free"));
    if (blk.cached) {
      ++n_cached;
      auto it = hash_to_block_.find(blk.hash);
      if (it == hash_to_block_.end() || it->second != b) return fail(name + " is cached but not in the hash map");
    }
  }
  if (n_cached != num_cached_blocks())
    return fail("the hash map has " + std::to_string(num_cached_blocks()) + " entries for " +
                std::to_string(n_cached) + " cached blocks");
  return {};
}

}  // namespace inferd::kv
