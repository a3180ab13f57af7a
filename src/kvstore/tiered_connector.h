// The prefix cache's offload tiers behind the KV connector seam: blocks the
// pool evicts (still hashed) are kept in host memory and on disk, and found
// again by their key when a later prompt starts with the same prefix.
//
// The disk tier is written through: each block the pool computes and caches
// is copied once and queued for the disk tier's writer thread, so the disk
// holds what the pool holds too, and a restart (even after a crash) finds
// every prefix, its hot first blocks included. The host tier takes the blocks
// the pool evicts (a copy shared with the disk's queue when both want it). A
// load takes the host copy, else reads the file (checked) and keeps it in the
// host tier too. Runs on the engine loop's thread; stats() may be
// read from any thread.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "core/result.h"
#include "kv/kv_connector.h"
#include "kvstore/disk_tier.h"
#include "kvstore/host_tier.h"

namespace inferd::kvstore {

struct OffloadConfig {
  int64_t host_bytes = 0;  // host-memory tier (0: none)
  std::string disk_path;   // disk tier's directory (empty: none)
  int64_t disk_bytes = 0;  // disk tier's bound
  bool enabled() const { return host_bytes > 0 || !disk_path.empty(); }
};

struct OffloadStats {
  bool host_enabled = false, disk_enabled = false;
  TierStats host, disk;
};

class TieredConnector : public kv::KVConnector {
 public:
  // `storage` is the pool's memory and must outlive the connector;
  // `fingerprint` names the model and KV layout (kv_fingerprint).
  static Result<std::unique_ptr<TieredConnector>> create(const OffloadConfig& config,
                                                          kv::KVBlockStorage& storage, uint64_t fingerprint);

  bool contains(kv::BlockHash key) const override;
  std::vector<bool> load(std::span<const kv::BlockTransfer> loads, bool stopped_at_miss) override;
  void save_evicted(std::span<const kv::BlockTransfer> evicted) override;
  void save_computed(std::span<const kv::BlockTransfer> computed) override;

  OffloadStats stats() const;
  Status check_invariants() const;  // each tier's (loop thread)
  // Waits until the disk tier has written every saved block (tests, shutdown).
  void flush();
  const HostTier* host() const { return host_.get(); }
  DiskTier* disk() { return disk_.get(); }

 private:
  TieredConnector(kv::KVBlockStorage& storage) : storage_(storage) {}
  void publish_host_stats();
  BlockBytes copy_of(int32_t block) const;  // a pool block's bytes, in a buffer the tiers share

  kv::KVBlockStorage& storage_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<DiskTier> disk_;
  std::vector<std::byte> scratch_;  // a block read from disk with no host tier to keep it

  mutable std::mutex stats_mu_;
  TierStats host_stats_;  // a copy of host_->stats() for other threads
  // Disk lookups are counted here (the tier itself counts what it stores).
  int64_t disk_hits_ = 0, disk_misses_ = 0;
};

}  // namespace inferd::kvstore
