// The disk tier of the KV offload store: one file per KV block under
// <path>/<fingerprint>/, bounded in bytes, least recently used deleted first.
// It survives a restart: open() finds the files a previous run left (oldest
// modification first in the eviction order), so a server started again on the
// same path finds its old prefixes.
//
// A block is only ever used if its file is exactly what this model and KV
// layout wrote: the directory is named by the fingerprint (model file and KV
// layout, see kv_fingerprint), and each file's header repeats the fingerprint
// and the block's key, and carries an XXH3 checksum of the bytes. A file that
// fails any check is deleted and counted as dropped. Files are written to a
// temporary name and renamed, so a crash leaves no half-written block.
//
// Writes go to a background thread (the engine loop only queues them); reads
// happen on the caller's thread. Thread-safe.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "kv/block_hash.h"
#include "kvstore/host_tier.h"

namespace inferd::kvstore {

struct DiskTierConfig {
  std::string path;            // the store's root directory (created if missing)
  int64_t capacity_bytes = 0;  // files of this fingerprint, headers included
  uint64_t fingerprint = 0;    // of the model and KV layout
  size_t block_bytes = 0;      // every block's size
  // Blocks waiting for the writer at most; a save beyond it is skipped (the
  // engine never waits for the disk).
  int64_t max_pending_bytes = int64_t{256} << 20;
};

class DiskTier {
 public:
  static constexpr size_t kHeaderBytes = 64;

  // Creates the directory if needed and indexes the files found there; files
  // of the wrong size and leftovers of an interrupted write are deleted (and
  // counted as dropped).
  static Result<std::unique_ptr<DiskTier>> open(const DiskTierConfig& config);
  ~DiskTier();  // writes what is queued, then stops the writer
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // A block whose file is written, or queued to be (then read from memory).
  bool contains(kv::BlockHash key) const;
  // Reads the block into dst (block_bytes), making it the most recently used;
  // a queued block is copied from its queued bytes. False if it is absent or
  // its file fails a check (then the file is deleted and counted as dropped;
  // dst may have been written).
  bool read(kv::BlockHash key, std::byte* dst);
  // Queues the block for the writer; nothing if it is on disk or queued
  // already, or the queue is full.
  void write(kv::BlockHash key, BlockBytes bytes);
  // Waits until every queued block is written.
  void flush();

  TierStats stats() const;
  // The counts agree with the files indexed, which fit the capacity, and
  // the queue with its bytes.
  Status check_invariants() const;
  const std::string& directory() const { return dir_; }
  size_t file_bytes() const { return kHeaderBytes + config_.block_bytes; }
  // The file that holds (or would hold) a block.
  std::string file_path(kv::BlockHash key) const;

 private:
  explicit DiskTier(const DiskTierConfig& config, std::string dir);
  void writer_loop();
  // Writes one block's file; false (nothing left behind) on an I/O error.
  bool write_file(kv::BlockHash key, const std::vector<std::byte>& bytes) const;
  // With mu_ held: indexes a written file as the most recently used, then
  // deletes least recently used files until the tier fits.
  void add_locked(kv::BlockHash key);
  // With mu_ held: forgets and deletes a block's file.
  void remove_locked(kv::BlockHash key);

  DiskTierConfig config_;
  std::string dir_;

  mutable std::mutex mu_;
  std::list<kv::BlockHash> lru_;  // front: most recently used
  std::unordered_map<kv::BlockHash, std::list<kv::BlockHash>::iterator> index_;
  TierStats stats_;
  std::deque<std::pair<kv::BlockHash, BlockBytes>> queue_;
  std::unordered_map<kv::BlockHash, BlockBytes> queued_;  // queue_'s blocks, by key
  int64_t pending_bytes_ = 0;
  bool writing_ = false;  // the writer holds a block taken off the queue
  bool stop_ = false;
  std::condition_variable work_cv_, idle_cv_;
  std::thread writer_;
};

}  // namespace inferd::kvstore
