#include "kvstore/host_tier.h"

#include <string>

namespace inferd::kvstore {

bool HostTier::touch(kv::BlockHash key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  lru_.splice(lru_.begin(), lru_, it->second);
  return true;
}

BlockBytes HostTier::get(kv::BlockHash key) {
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->bytes;
}

void HostTier::put(kv::BlockHash key, BlockBytes bytes) {
  if (auto it = index_.find(key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  const auto size = static_cast<int64_t>(bytes->size());
  if (size > stats_.capacity_bytes) return;
  lru_.push_front({key, std::move(bytes)});
  index_.emplace(key, lru_.begin());
  stats_.bytes += size;
  ++stats_.blocks;
  ++stats_.saves;
  while (stats_.bytes > stats_.capacity_bytes) {
    const Entry& victim = lru_.back();
    stats_.bytes -= static_cast<int64_t>(victim.bytes->size());
    --stats_.blocks;
    ++stats_.evictions;
    index_.erase(victim.key);
    lru_.pop_back();
  }
}

Status HostTier::check_invariants() const {
  int64_t bytes = 0;
  for (const Entry& e : lru_) {
    auto it = index_.find(e.key);
    if (it == index_.end() || &*it->second != &e) return make_error("host tier: a block is listed but not indexed");
    bytes += static_cast<int64_t>(e.bytes->size());
  }
  if (index_.size() != lru_.size()) return make_error("host tier: the index and the list differ");
  if (bytes != stats_.bytes || static_cast<int64_t>(lru_.size()) != stats_.blocks)
    return make_error("host tier: holds " + std::to_string(lru_.size()) + " blocks of " + std::to_string(bytes) +
                      " bytes, counts say " + std::to_string(stats_.blocks) + " and " + std::to_string(stats_.bytes));
  if (bytes > stats_.capacity_bytes) return make_error("host tier: over its capacity");
  return {};
}

std::vector<kv::BlockHash> HostTier::keys_by_recency() const {
  std::vector<kv::BlockHash> keys;
  keys.reserve(lru_.size());
  for (const Entry& e : lru_) keys.push_back(e.key);
  return keys;
}

}  // namespace inferd::kvstore
