#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <unordered_set>

#include "kv/check.h"

namespace inferd::kv {

KVCacheManager::KVCacheManager(const KVCacheConfig& config)
    : config_(config), pool_(config.n_blocks) {
  INFERD_KV_CHECK(config.block_size >= 1, "block_size must be positive");
}

PrefixHit KVCacheManager::get_computed_blocks(std::span<const int32_t> tokens,
                                              uint64_t extra_key) const {
  PrefixHit hit;
  if (!config_.enable_prefix_caching || tokens.empty()) return hit;
  hit.num_queried_tokens = static_cast<int64_t>(tokens.size());
  const int64_t bs = config_.block_size;
  const int64_t max_blocks = (hit.num_queried_tokens - 1) / bs;
  BlockHash parent = kRootBlockHash;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const BlockHash h = hash_block(parent, tokens.subspan(i * bs, bs), extra_key);
    const std::optional<int32_t> b = pool_.lookup(h);
    if (!b) break;
    hit.blocks.push_back(*b);
    hit.hashes.push_back(h);
    parent = h;
  }
  hit.num_tokens = static_cast<int64_t>(hit.blocks.size()) * bs;
  return hit;
}

std::optional<std::vector<int32_t>> KVCacheManager::allocate_slots(const std::string& request_id,
                                                                   int64_t num_computed_tokens,
                                                                   int64_t num_new_tokens,
                                                                   const PrefixHit& hit) {
  INFERD_KV_CHECK(num_computed_tokens >= 0 && num_new_tokens >= 0, "negative token count");
  auto it = requests_.find(request_id);
  const int64_t held = it == requests_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size());
  INFERD_KV_CHECK(hit.blocks.empty() || held == 0,
                  "a cached prefix can only be taken by a request that holds no blocks");
  const int64_t hit_blocks = static_cast<int64_t>(hit.blocks.size());
  const int64_t total_tokens = num_computed_tokens + hit.num_tokens + num_new_tokens;
  const int64_t n_fresh = std::max<int64_t>(0, blocks_for_tokens(total_tokens) - held - hit_blocks);

  // Hit blocks nobody references are on the free list: taking them uses free
  // blocks just as fresh ones do.
  int64_t n_from_free = n_fresh;
  for (int32_t b : hit.blocks) n_from_free += pool_.ref_count(b) == 0;
  if (n_from_free > pool_.num_free_blocks()) return std::nullopt;

  // Touch the hit first so that allocate() cannot evict it.
  pool_.touch(hit.blocks);
  std::vector<int32_t> fresh = pool_.allocate(static_cast<int32_t>(n_fresh));

  if (held == 0 && hit.blocks.empty() && fresh.empty()) return std::vector<int32_t>{};
  RequestBlocks& rb = requests_[request_id];
  if (held == 0 && hit.num_queried_tokens > 0) {
    ++stats_.requests;
    stats_.queried_tokens += hit.num_queried_tokens;
    stats_.hit_tokens += hit.num_tokens;
  }
  rb.blocks.insert(rb.blocks.end(), hit.blocks.begin(), hit.blocks.end());
  rb.hashes.insert(rb.hashes.end(), hit.hashes.begin(), hit.hashes.end());
  rb.blocks.insert(rb.blocks.end(), fresh.begin(), fresh.end());

  std::vector<int32_t> appended = hit.blocks;
  appended.insert(appended.end(), fresh.begin(), fresh.end());
  return appended;
}

void KVCacheManager::cache_full_blocks(const std::string& request_id,
                                       std::span<const int32_t> tokens,
                                       int64_t num_computed_tokens, uint64_t extra_key) {
  if (!config_.enable_prefix_caching) return;
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  RequestBlocks& rb = it->second;
  const int64_t bs = config_.block_size;
  const int64_t n_full = std::min<int64_t>(num_computed_tokens, tokens.size()) / bs;
  INFERD_KV_CHECK(n_full <= static_cast<int64_t>(rb.blocks.size()),
                  "more tokens computed than the request has slots for");
  for (int64_t i = static_cast<int64_t>(rb.hashes.size()); i < n_full; ++i) {
    const BlockHash parent = i == 0 ? kRootBlockHash : rb.hashes[i - 1];
    const BlockHash h = hash_block(parent, tokens.subspan(i * bs, bs), extra_key);
    rb.hashes.push_back(h);
    pool_.cache(rb.blocks[i], h);  // false: another block already holds this prefix
  }
}

void KVCacheManager::free(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  std::vector<int32_t> reversed(it->second.blocks.rbegin(), it->second.blocks.rend());
  pool_.free(reversed);
  requests_.erase(it);
}

std::span<const int32_t> KVCacheManager::block_table(const std::string& request_id) const {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return {};
  return it->second.blocks;
}

Status KVCacheManager::check_invariants() const {
  if (Status s = pool_.check_invariants(); !s) return s;
  auto fail = [](const std::string& what) { return Status(make_error("KVCacheManager: " + what)); };

  std::vector<int32_t> refs(pool_.num_blocks(), 0);
  for (const auto& [id, rb] : requests_) {
    const std::string name = "request '" + id + "'";
    if (rb.hashes.size() > rb.blocks.size()) return fail(name + " has more hashes than blocks");
    std::unordered_set<int32_t> seen;
    for (size_t i = 0; i < rb.blocks.size(); ++i) {
      const int32_t b = rb.blocks[i];
      if (b <= BlockPool::kNullBlock || b >= pool_.num_blocks())
        return fail(name + " holds invalid block " + std::to_string(b));
      if (!seen.insert(b).second) return fail(name + " holds block " + std::to_string(b) + " twice");
      ++refs[b];
      const std::optional<BlockHash> h = pool_.block_hash(b);
      if (i < rb.hashes.size()) {
        if (h && *h != rb.hashes[i])
          return fail(name + "'s block " + std::to_string(b) + " is cached under another prefix");
      } else if (h) {
        return fail(name + "'s block " + std::to_string(b) + " is findable before it is full and computed");
      }
    }
  }
  int32_t used = 0;
  for (int32_t b = 1; b < pool_.num_blocks(); ++b) {
    if (pool_.ref_count(b) != refs[b])
      return fail("block " + std::to_string(b) + " has reference count " +
                  std::to_string(pool_.ref_count(b)) + " but " + std::to_string(refs[b]) +
                  " tables hold it");
    used += refs[b] > 0;
  }
  if (used + pool_.num_free_blocks() != pool_.num_usable_blocks())
    return fail("free + used != usable blocks");
  if (!config_.enable_prefix_caching && pool_.num_cached_blocks() != 0)
    return fail("blocks are cached with prefix caching disabled");
  return {};
}

}  // namespace inferd::kv
