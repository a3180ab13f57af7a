#include "kvstore/tiered_connector.h"

#include <cstring>

namespace inferd::kvstore {

Result<std::unique_ptr<TieredConnector>> TieredConnector::create(const OffloadConfig& config,
                                                                 kv::KVBlockStorage& storage,
                                                                 uint64_t fingerprint) {
  if (!config.enabled()) return make_error("no KV offload tier is configured");
  if (config.host_bytes < 0) return make_error("--kv-offload-size must not be negative");
  std::unique_ptr<TieredConnector> c(new TieredConnector(storage));
  if (config.host_bytes > 0) c->host_ = std::make_unique<HostTier>(config.host_bytes);
  if (!config.disk_path.empty()) {
    DiskTierConfig disk;
    disk.path = config.disk_path;
    disk.capacity_bytes = config.disk_bytes;
    disk.fingerprint = fingerprint;
    disk.block_bytes = storage.block_bytes();
    Result<std::unique_ptr<DiskTier>> tier = DiskTier::open(disk);
    if (!tier) return tier.error();
    c->disk_ = std::move(*tier);
  }
  c->scratch_.resize(storage.block_bytes());
  c->publish_host_stats();
  return c;
}

bool TieredConnector::contains(kv::BlockHash key) const {
  return (host_ && host_->contains(key)) || (disk_ && disk_->contains(key));
}

std::vector<bool> TieredConnector::load(std::span<const kv::BlockTransfer> loads, bool stopped_at_miss) {
  std::vector<bool> ok(loads.size(), false);
  int64_t disk_hits = 0, disk_misses = 0;
  for (size_t i = 0; i < loads.size(); ++i) {
    const kv::BlockTransfer& l = loads[i];
    if (host_) {
      if (BlockBytes b = host_->get(l.key)) {
        storage_.write_block(l.block, b->data());
        ++host_->stats().hits;
        ++host_->stats().loads;
        ok[i] = true;
        continue;
      }
      ++host_->stats().misses;
    }
    if (!disk_) continue;
    if (host_) {
      // Read into a buffer the host tier then keeps: the next hit is in memory.
      auto bytes = std::make_shared<std::vector<std::byte>>(scratch_.size());
      ok[i] = disk_->read(l.key, bytes->data());
      if (ok[i]) {
        storage_.write_block(l.block, bytes->data());
        host_->put(l.key, std::move(bytes));
      }
    } else {
      ok[i] = disk_->read(l.key, scratch_.data());
      if (ok[i]) storage_.write_block(l.block, scratch_.data());
    }
    ++(ok[i] ? disk_hits : disk_misses);  // a bad file is a miss (and dropped)
  }
  // The block the lookup stopped at was asked of every tier.
  if (stopped_at_miss) {
    if (host_) ++host_->stats().misses;
    if (disk_) ++disk_misses;
  }
  {
    std::lock_guard lock(stats_mu_);
    disk_hits_ += disk_hits;
    disk_misses_ += disk_misses;
  }
  publish_host_stats();
  return ok;
}

BlockBytes TieredConnector::copy_of(int32_t block) const {
  auto bytes = std::make_shared<std::vector<std::byte>>(storage_.block_bytes());
  storage_.read_block(block, bytes->data());
  return bytes;
}

void TieredConnector::save_computed(std::span<const kv::BlockTransfer> computed) {
  if (!disk_) return;
  for (const kv::BlockTransfer& c : computed) {
    if (!disk_->contains(c.key)) disk_->write(c.key, copy_of(c.block));
  }
}

void TieredConnector::save_evicted(std::span<const kv::BlockTransfer> evicted) {
  for (const kv::BlockTransfer& e : evicted) {
    const bool to_host = host_ && !host_->touch(e.key);
    const bool to_disk = disk_ && !disk_->contains(e.key);
    if (!to_host && !to_disk) continue;
    BlockBytes shared = copy_of(e.block);
    if (to_disk) disk_->write(e.key, shared);
    if (to_host) host_->put(e.key, std::move(shared));
  }
  publish_host_stats();
}

OffloadStats TieredConnector::stats() const {
  OffloadStats s;
  s.host_enabled = host_ != nullptr;
  s.disk_enabled = disk_ != nullptr;
  std::lock_guard lock(stats_mu_);
  s.host = host_stats_;
  if (disk_) {
    s.disk = disk_->stats();
    s.disk.hits = disk_hits_;
    s.disk.misses = disk_misses_;
  }
  return s;
}

Status TieredConnector::check_invariants() const {
  if (host_)
    if (Status s = host_->check_invariants(); !s) return s;
  if (disk_) return disk_->check_invariants();
  return {};
}

void TieredConnector::flush() {
  if (disk_) disk_->flush();
}

void TieredConnector::publish_host_stats() {
  if (!host_) return;
  std::lock_guard lock(stats_mu_);
  host_stats_ = host_->stats();
}

}  // namespace inferd::kvstore
