#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <unordered_set>

#include "kv/check.h"

namespace inferd::kv {

namespace {

// The first block a token at `position` or later can still see in a group
// with this window (0: full attention, every block).
int64_t first_visible_block(int64_t window, int64_t position, int64_t block_size) {
  if (window <= 0) return 0;
  const int64_t first_seen = position + 1 - window;
  return first_seen <= 0 ? 0 : first_seen / block_size;
}

}  // namespace

int64_t max_blocks_held(const KVCacheConfig& config, int64_t n_tokens, int64_t max_step_tokens) {
  const int64_t bs = config.block_size;
  const int64_t all = (n_tokens + bs - 1) / bs;
  int64_t total = 0;
  for (int32_t g = 0; g < config.num_groups(); ++g) {
    const int64_t w = config.window(g);
    // A step computing positions [p, p + n) holds blocks (p + 1 - w) / bs to
    // (p + n - 1) / bs: at most (w + n - 2) / bs + 2 of them.
    total += w <= 0 ? all : std::min(all, (w + max_step_tokens - 2) / bs + 2);
  }
  return total;
}

namespace {

// Snapshots are kept only beside recurrent layers and prefix caching.
int32_t snapshot_slots(const KVCacheConfig& c) {
  return c.n_state_slots > 0 && c.enable_prefix_caching ? c.n_state_snapshots : 0;
}

// Checkpoints are kept only beside recurrent layers.
int32_t checkpoint_slots_per_slot(const KVCacheConfig& c) { return c.n_state_slots > 0 ? c.state_checkpoints : 0; }

}  // namespace

int32_t state_slots_in_cache(const KVCacheConfig& c) {
  return c.n_state_slots * (1 + checkpoint_slots_per_slot(c)) + snapshot_slots(c);
}

KVCacheManager::KVCacheManager(const KVCacheConfig& config)
    : config_(config),
      pool_(config.n_blocks),
      state_slots_(config.n_state_slots),
      snapshots_(config.n_state_slots * (1 + checkpoint_slots_per_slot(config)), snapshot_slots(config)) {
  INFERD_KV_CHECK(config.block_size >= 1, "block_size must be positive");
  INFERD_KV_CHECK(config.state_checkpoints >= 0, "state_checkpoints must be >= 0");
  INFERD_KV_CHECK(config.state_snapshot_interval >= 0 && config.state_snapshot_interval % config.block_size == 0,
                  "the state snapshot interval must be a multiple of the block size");
  // Blocks found by prefix would come without the recurrent state at their
  // end: only snapshots let them be used.
  if (config_.n_state_slots > 0 && snapshots_.num_slots() == 0) config_.enable_prefix_caching = false;
  for (int64_t w : config.group_windows) INFERD_KV_CHECK(w >= 0, "a group's window must be >= 0");
}

std::vector<int32_t> KVCacheManager::allocate_blocks(int32_t n) {
  std::vector<int32_t> blocks = pool_.allocate(n);
  snapshots_.drop_anchored(blocks);
  return blocks;
}

PrefixHit KVCacheManager::get_computed_blocks(std::span<const int32_t> tokens, uint64_t extra_key,
                                              const KVConnector* connector) const {
  const int32_t n_groups = num_groups();
  PrefixHit hit;
  hit.blocks.resize(n_groups);
  if (!config_.enable_prefix_caching || tokens.empty()) return hit;
  hit.num_queried_tokens = static_cast<int64_t>(tokens.size());
  const int64_t bs = config_.block_size;
  const int64_t max_blocks = (hit.num_queried_tokens - 1) / bs;

  // A block of the pool, else kExternalBlock when the connector holds it.
  auto find = [&](BlockHash key) -> std::optional<int32_t> {
    if (std::optional<int32_t> b = pool_.lookup(key)) return b;
    if (!connector) return std::nullopt;
    hit.consulted_connector = true;
    if (connector->contains(key)) return kExternalBlock;
    return std::nullopt;
  };

  // The run every full-attention group holds from the start.
  std::vector<std::vector<int32_t>> found(n_groups);
  std::vector<BlockHash> chain;
  BlockHash parent = kRootBlockHash;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const BlockHash h = hash_block(parent, tokens.subspan(i * bs, bs), extra_key);
    bool all = true;
    for (int32_t g = 0; g < n_groups && all; ++g) {
      if (config_.window(g) > 0) continue;
      const std::optional<int32_t> b = find(group_block_hash(h, g));
      if (b) found[g].push_back(*b);
      all = b.has_value();
    }
    if (!all) {
      hit.stopped_at_miss = hit.consulted_connector;
      break;
    }
    chain.push_back(h);
    parent = h;
  }

  // Sliding-window groups: the longest run, no longer than that, whose last
  // blocks (those the next token's window reaches) every such group holds.
  int64_t n_hit = static_cast<int64_t>(chain.size());
  std::vector<std::vector<int64_t>> run(n_groups);  // run[g][i]: held blocks ending at i
  for (int32_t g = 0; g < n_groups; ++g) {
    if (config_.window(g) <= 0) continue;
    found[g].assign(n_hit, BlockPool::kNullBlock);
    run[g].assign(n_hit, 0);
    for (int64_t i = 0; i < n_hit; ++i) {
      const std::optional<int32_t> b = find(group_block_hash(chain[i], g));
      if (b) found[g][i] = *b;
      run[g][i] = b ? (i > 0 ? run[g][i - 1] : 0) + 1 : 0;
    }
  }
  auto window_held = [&](int64_t k) {
    for (int32_t g = 0; g < n_groups; ++g) {
      const int64_t w = config_.window(g);
      if (w <= 0 || k == 0) continue;
      if (run[g][k - 1] < k - first_visible_block(w, k * bs, bs)) return false;
    }
    return true;
  };
  // Beside recurrent layers the prefix must end where a snapshot of the state was kept.
  auto snapshot_at = [&](int64_t k) -> std::optional<int32_t> {
    if (!has_state_slots()) return -1;
    return snapshots_.lookup(chain[k - 1]);
  };
  while (n_hit > 0 && (!window_held(n_hit) || !snapshot_at(n_hit))) --n_hit;
  if (n_hit > 0 && has_state_slots()) hit.state_snapshot = *snapshot_at(n_hit);

  hit.hashes.assign(chain.begin(), chain.begin() + n_hit);
  for (int32_t g = 0; g < n_groups; ++g) {
    hit.blocks[g].assign(found[g].begin(), found[g].begin() + n_hit);
    const int64_t lo = first_visible_block(config_.window(g), n_hit * bs, bs);
    std::fill(hit.blocks[g].begin(), hit.blocks[g].begin() + lo, BlockPool::kNullBlock);
  }
  hit.num_tokens = n_hit * bs;
  int64_t first_external = n_hit;
  for (int32_t g = 0; g < n_groups; ++g)
    for (int64_t i = 0; i < n_hit; ++i)
      if (hit.blocks[g][i] == kExternalBlock) {
        hit.external.push_back({g, i, group_block_hash(chain[i], g)});
        first_external = std::min(first_external, i);
      }
  hit.num_external_tokens = (n_hit - first_external) * bs;
  return hit;
}

void KVCacheManager::free_out_of_window_blocks(RequestBlocks& rb, int64_t first_position) {
  std::vector<int32_t> freed;
  for (int32_t g = 0; g < num_groups(); ++g) {
    const int64_t w = config_.window(g);
    if (w <= 0) continue;
    std::vector<int32_t>& table = rb.tables[g];
    const int64_t lo = std::min<int64_t>(first_visible_block(w, first_position, config_.block_size),
                                         static_cast<int64_t>(table.size()));
    // Entries below a null one are null already: walk back from lo.
    for (int64_t i = lo - 1; i >= 0 && table[i] != BlockPool::kNullBlock; --i) {
      freed.push_back(table[i]);
      table[i] = BlockPool::kNullBlock;
    }
  }
  pool_.free(freed);
}

std::optional<std::vector<int32_t>> KVCacheManager::allocate_slots(const std::string& request_id,
                                                                   int64_t num_computed_tokens,
                                                                   int64_t num_new_tokens,
                                                                   const PrefixHit& hit,
                                                                   std::vector<BlockCopy>* copies,
                                                                   std::vector<BlockTransfer>* loads) {
  INFERD_KV_CHECK(num_computed_tokens >= 0 && num_new_tokens >= 0, "negative token count");
  const int32_t n_groups = num_groups();
  auto it = requests_.find(request_id);
  const bool holds = it != requests_.end();
  const int64_t hit_len = static_cast<int64_t>(hit.hashes.size());
  INFERD_KV_CHECK(hit_len == 0 || !holds,
                  "a cached prefix can only be taken by a request that holds no blocks");
  INFERD_KV_CHECK(hit_len == 0 || static_cast<int32_t>(hit.blocks.size()) == n_groups,
                  "a prefix hit from a cache with another number of groups");
  INFERD_KV_CHECK(hit.external.empty() || loads, "a hit has external blocks but the caller takes no loads");
  if (holds) free_out_of_window_blocks(it->second, num_computed_tokens);
  const int64_t held = holds ? static_cast<int64_t>(it->second.tables[0].size()) : 0;
  const int64_t total_tokens = num_computed_tokens + hit.num_tokens + num_new_tokens;
  const int64_t n_fresh = std::max<int64_t>(0, blocks_for_tokens(total_tokens) - held - hit_len);

  // Copy on write: held blocks the new tokens go into that another request
  // also holds (after a fork, the partial block they share).
  std::vector<std::pair<int32_t, int64_t>> to_copy;  // (group, table index)
  if (holds && num_new_tokens > 0) {
    const int64_t first = num_computed_tokens / config_.block_size;
    const int64_t end = std::min(held, blocks_for_tokens(num_computed_tokens + num_new_tokens));
    for (int32_t g = 0; g < n_groups; ++g)
      for (int64_t i = first; i < end; ++i) {
        const int32_t b = it->second.tables[g][i];
        if (b != BlockPool::kNullBlock && pool_.ref_count(b) > 1) to_copy.emplace_back(g, i);
      }
    INFERD_KV_CHECK(to_copy.empty() || copies, "a shared block is written but the caller takes no copies");
  }

  // Hit blocks nobody references are on the free list: taking them uses free
  // blocks just as fresh ones do; so does each external block.
  const int64_t n_external = static_cast<int64_t>(hit.external.size());
  int64_t n_from_free = n_fresh * n_groups + static_cast<int64_t>(to_copy.size()) + n_external;
  std::vector<int32_t> hit_blocks;
  for (int32_t g = 0; g < n_groups && hit_len > 0; ++g)
    for (int32_t b : hit.blocks[g])
      if (b != BlockPool::kNullBlock && b != kExternalBlock) {
        hit_blocks.push_back(b);
        n_from_free += pool_.ref_count(b) == 0;
      }
  if (n_from_free > pool_.num_free_blocks()) return std::nullopt;
  // A request's first blocks come with its state slot; without one it waits.
  const bool takes_state_slot = has_state_slots() && !holds && (hit_len > 0 || n_fresh > 0);
  if (takes_state_slot && state_slots_.num_free() == 0) return std::nullopt;

  // Touch the hit first so that allocate() cannot evict it.
  pool_.touch(hit_blocks);
  std::vector<int32_t> fresh = allocate_blocks(static_cast<int32_t>(n_fresh * n_groups));
  const std::vector<int32_t> for_external = allocate_blocks(static_cast<int32_t>(n_external));
  if (!to_copy.empty()) {
    const std::vector<int32_t> dst = allocate_blocks(static_cast<int32_t>(to_copy.size()));
    std::vector<int32_t> released;
    for (size_t k = 0; k < to_copy.size(); ++k) {
      int32_t& entry = it->second.tables[to_copy[k].first][to_copy[k].second];
      copies->push_back({entry, dst[k]});
      released.push_back(entry);  // still held by the other request(s)
      entry = dst[k];
    }
    pool_.free(released);
  }

  if (!holds && hit_len == 0 && fresh.empty()) return std::vector<int32_t>{};
  RequestBlocks& rb = requests_[request_id];
  if (!holds) {
    rb.tables.resize(n_groups);
    if (takes_state_slot) state_slots_.allocate(request_id);
    if (hit_len > 0 && hit.state_snapshot >= 0) {
      snapshots_.pin(hit.state_snapshot);
      rb.reads_snapshot = hit.state_snapshot;
    }
    if (hit.num_queried_tokens > 0) {
      ++stats_.requests;
      stats_.queried_tokens += hit.num_queried_tokens;
      stats_.hit_tokens += hit.num_tokens - hit.num_external_tokens;
      stats_.external_hit_tokens += hit.num_external_tokens;
    }
  }
  rb.hashes.insert(rb.hashes.end(), hit.hashes.begin(), hit.hashes.end());
  std::vector<int32_t> appended;
  for (int32_t g = 0; g < n_groups; ++g) {
    std::vector<int32_t>& table = rb.tables[g];
    if (hit_len > 0) table.insert(table.end(), hit.blocks[g].begin(), hit.blocks[g].end());
    for (int64_t k = 0; k < n_external; ++k)
      if (hit.external[k].group == g) {
        int32_t& entry = table[held + hit.external[k].index];
        INFERD_KV_CHECK(entry == kExternalBlock, "an external block where the hit has none");
        entry = for_external[k];
        loads->push_back({hit.external[k].key, entry});
      }
    const auto group_fresh = fresh.begin() + g * n_fresh;
    table.insert(table.end(), group_fresh, group_fresh + n_fresh);
    for (int64_t i = held; i < static_cast<int64_t>(table.size()); ++i)
      if (table[i] != BlockPool::kNullBlock) appended.push_back(table[i]);
  }
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
  INFERD_KV_CHECK(n_full <= static_cast<int64_t>(rb.tables[0].size()),
                  "more tokens computed than the request has slots for");
  for (int64_t i = static_cast<int64_t>(rb.hashes.size()); i < n_full; ++i) {
    const BlockHash parent = i == 0 ? kRootBlockHash : rb.hashes[i - 1];
    const BlockHash h = hash_block(parent, tokens.subspan(i * bs, bs), extra_key);
    rb.hashes.push_back(h);
    for (int32_t g = 0; g < num_groups(); ++g) {
      const int32_t b = rb.tables[g][i];
      // false: another block already holds this prefix
      if (b != BlockPool::kNullBlock) pool_.cache(b, group_block_hash(h, g));
    }
  }
  if (rb.reads_snapshot >= 0) {  // its step has copied it
    snapshots_.unpin(rb.reads_snapshot);
    rb.reads_snapshot = -1;
  }
  // Snapshots the step saved: findable beside the block that ends their prefix
  // (the cached one: another block may hold that prefix already).
  std::erase_if(rb.snapshots_to_save, [&](const StateSave& save) {
    const int64_t k = save.position / bs;
    if (k > static_cast<int64_t>(rb.hashes.size())) return false;
    const std::optional<int32_t> anchor = pool_.lookup(group_block_hash(rb.hashes[k - 1], 0));
    if (anchor)
      snapshots_.commit(save.slot, rb.hashes[k - 1], *anchor);
    else
      snapshots_.release(save.slot);
    return true;
  });
}

std::vector<StateSave> KVCacheManager::reserve_state_snapshots(const std::string& request_id, int64_t begin,
                                                               int64_t end, int64_t prompt_tokens) {
  std::vector<StateSave> saves;
  auto it = requests_.find(request_id);
  if (snapshots_.num_slots() == 0 || it == requests_.end()) return saves;
  const int64_t bs = config_.block_size, interval = config_.state_snapshot_interval;
  const int64_t last = std::min(end, prompt_tokens);
  std::vector<int64_t> points;
  if (interval > 0)
    for (int64_t p = (begin / interval + 1) * interval; p <= last; p += interval) points.push_back(p);
  const int64_t last_block = prompt_tokens / bs * bs;
  if (last_block > begin && last_block <= end && (points.empty() || points.back() != last_block))
    points.push_back(last_block);
  for (int64_t p : points) {
    if (p <= 0) continue;
    const std::optional<int32_t> slot = snapshots_.reserve();
    if (!slot) break;
    saves.push_back({p, *slot});
    it->second.snapshots_to_save.push_back(saves.back());
  }
  return saves;
}

void KVCacheManager::release_snapshots(RequestBlocks& rb) {
  for (const StateSave& save : rb.snapshots_to_save) snapshots_.release(save.slot);
  rb.snapshots_to_save.clear();
  if (rb.reads_snapshot >= 0) snapshots_.unpin(rb.reads_snapshot);
  rb.reads_snapshot = -1;
}

std::optional<int32_t> KVCacheManager::state_checkpoint_slot(const std::string& request_id, int32_t index) const {
  if (!has_state_checkpoints()) return std::nullopt;
  INFERD_KV_CHECK(index >= 0 && index < num_state_checkpoints(), "no such state checkpoint");
  const std::optional<int32_t> slot = state_slots_.slot_of(request_id);
  if (!slot) return std::nullopt;
  // After the running slots: each slot's checkpoints together.
  return num_state_slots() + *slot * num_state_checkpoints() + index;
}

void KVCacheManager::cache_loaded(std::span<const BlockTransfer> loads) {
  // false: another block already holds this prefix (it was computed meanwhile)
  for (const BlockTransfer& l : loads) pool_.cache(l.block, l.key);
}

void KVCacheManager::fork(const std::string& parent_id, const std::string& child_id, int64_t num_tokens) {
  auto it = requests_.find(parent_id);
  INFERD_KV_CHECK(it != requests_.end(), "forking a request that holds no blocks");
  // The state cannot be shared by reference (the engine refuses beam search
  // on such models before it gets here).
  INFERD_KV_CHECK(!has_state_slots(), "forking a request of a model with recurrent state");
  INFERD_KV_CHECK(requests_.count(child_id) == 0, "forking into a request that already holds blocks");
  const int64_t n = blocks_for_tokens(num_tokens);
  INFERD_KV_CHECK(num_tokens >= 0 && n <= static_cast<int64_t>(it->second.tables[0].size()),
                  "forking more tokens than the parent has slots for");
  if (n == 0) return;
  RequestBlocks child;
  child.tables.resize(num_groups());
  std::vector<int32_t> shared;
  for (int32_t g = 0; g < num_groups(); ++g) {
    const std::vector<int32_t>& table = it->second.tables[g];
    child.tables[g].assign(table.begin(), table.begin() + n);
    for (int32_t b : child.tables[g])
      if (b != BlockPool::kNullBlock) shared.push_back(b);
  }
  // The full blocks' hashes come along: the child's later blocks chain on them.
  const auto n_hashed = std::min<size_t>(it->second.hashes.size(), static_cast<size_t>(num_tokens / config_.block_size));
  child.hashes.assign(it->second.hashes.begin(), it->second.hashes.begin() + static_cast<std::ptrdiff_t>(n_hashed));
  pool_.touch(shared);
  requests_.emplace(child_id, std::move(child));
}

void KVCacheManager::free(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  // Last position first, so that the tail of the sequence is evicted first.
  const RequestBlocks& rb = it->second;
  std::vector<int32_t> reversed;
  for (int64_t i = static_cast<int64_t>(rb.tables[0].size()) - 1; i >= 0; --i)
    for (const std::vector<int32_t>& table : rb.tables)
      if (table[i] != BlockPool::kNullBlock) reversed.push_back(table[i]);
  pool_.free(reversed);
  release_snapshots(it->second);
  requests_.erase(it);
  state_slots_.free(request_id);
}

int64_t KVCacheManager::num_blocks_held(const std::string& request_id) const {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return 0;
  int64_t n = 0;
  for (const std::vector<int32_t>& table : it->second.tables)
    n += std::count_if(table.begin(), table.end(), [](int32_t b) { return b != BlockPool::kNullBlock; });
  return n;
}

std::span<const int32_t> KVCacheManager::block_table(const std::string& request_id, int32_t group) const {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return {};
  return it->second.tables[group];
}

Status KVCacheManager::check_invariants() const {
  if (Status s = pool_.check_invariants(); !s) return s;
  auto fail = [](const std::string& what) { return Status(make_error("KVCacheManager: " + what)); };

  std::vector<int32_t> refs(pool_.num_blocks(), 0);
  for (const auto& [id, rb] : requests_) {
    const std::string name = "request '" + id + "'";
    if (static_cast<int32_t>(rb.tables.size()) != num_groups())
      return fail(name + " has " + std::to_string(rb.tables.size()) + " block tables");
    std::unordered_set<int32_t> seen;
    for (int32_t g = 0; g < num_groups(); ++g) {
      const std::vector<int32_t>& table = rb.tables[g];
      if (table.size() != rb.tables[0].size()) return fail(name + "'s block tables differ in length");
      if (rb.hashes.size() > table.size()) return fail(name + " has more hashes than blocks");
      for (size_t i = 0; i < table.size(); ++i) {
        const int32_t b = table[i];
        if (b == BlockPool::kNullBlock && config_.window(g) > 0) continue;
        if (b <= BlockPool::kNullBlock || b >= pool_.num_blocks())
          return fail(name + " holds invalid block " + std::to_string(b));
        if (!seen.insert(b).second) return fail(name + " holds block " + std::to_string(b) + " twice");
        ++refs[b];
        const std::optional<BlockHash> h = pool_.block_hash(b);
        if (i < rb.hashes.size()) {
          if (h && *h != group_block_hash(rb.hashes[i], g))
            return fail(name + "'s block " + std::to_string(b) + " is cached under another prefix");
        } else if (h) {
          return fail(name + "'s block " + std::to_string(b) + " is findable before it is full and computed");
        }
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
  if (Status s = state_slots_.check_invariants(); !s) return s;
  if (has_state_slots()) {
    for (const auto& [id, rb] : requests_)
      if (!state_slots_.slot_of(id)) return fail("request '" + id + "' holds blocks but no state slot");
    if (num_state_slots() - num_free_state_slots() != static_cast<int32_t>(requests_.size()))
      return fail("a state slot is held by a request that holds no blocks");
  }
  if (Status s = snapshots_.check_invariants(); !s) return s;
  int32_t reserved = 0;
  std::unordered_map<int32_t, int32_t> readers;
  for (const auto& [id, rb] : requests_) {
    for (const StateSave& save : rb.snapshots_to_save) {
      ++reserved;
      if (!snapshots_.is_reserved(save.slot))
        return fail("request '" + id + "' is to save a snapshot in slot " + std::to_string(save.slot) +
                    ", which it has not reserved");
    }
    if (rb.reads_snapshot >= 0) ++readers[rb.reads_snapshot];
  }
  if (reserved != snapshots_.num_reserved()) return fail("a snapshot slot is reserved by no request");
  for (const auto& [slot, n] : readers)
    if (snapshots_.pins(slot) != n) return fail("snapshot slot " + std::to_string(slot) + " has the wrong pins");
  int32_t pinned = 0;
  for (int32_t s = 0; s < snapshots_.num_slots(); ++s) pinned += snapshots_.pins(num_state_slots_in_cache() - snapshots_.num_slots() + s) > 0;
  if (pinned != static_cast<int32_t>(readers.size())) return fail("a snapshot is pinned by no request");
  for (const auto& [key, anchor] : snapshots_.cached())
    if (pool_.block_hash(anchor) != group_block_hash(key, 0))
      return fail("a snapshot's anchor block " + std::to_string(anchor) + " is not cached under its prefix");
  return {};
}

}  // namespace inferd::kv
