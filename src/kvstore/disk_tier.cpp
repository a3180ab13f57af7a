#include "kvstore/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>

namespace inferd::kvstore {

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'I', 'N', 'F', 'D', 'K', 'V', 'B', '1'};
constexpr char kSuffix[] = ".kvb";
constexpr char kTempSuffix[] = ".tmp";

// The header, little-endian as the machine writes it (x86-64 and arm64 are).
struct Header {
  char magic[8];
  uint64_t fingerprint;
  uint64_t key;
  uint64_t payload_bytes;
  uint64_t checksum;  // XXH3-64 of the payload
  uint8_t reserved[24];
};
static_assert(sizeof(Header) == DiskTier::kHeaderBytes);

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

// A block file's key from its name ("<16 hex digits>.kvb"), if it is one.
std::optional<kv::BlockHash> key_of(const std::string& name) {
  if (name.size() != 16 + sizeof(kSuffix) - 1 || name.substr(16) != kSuffix) return std::nullopt;
  kv::BlockHash key = 0;
  for (int i = 0; i < 16; ++i) {
    const char c = name[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    key = key << 4 | static_cast<uint64_t>(d);
  }
  return key;
}

// Moves all n bytes with read or write, through short transfers and EINTR.
template <class Byte, class Io>
bool transfer_all(int fd, Byte* p, size_t n, Io io) {
  while (n > 0) {
    const ssize_t done = io(fd, p, n);
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) return false;
    p += done;
    n -= static_cast<size_t>(done);
  }
  return true;
}

bool write_all(int fd, const void* p, size_t n) {
  return transfer_all(fd, static_cast<const char*>(p), n, ::write);
}

bool read_all(int fd, void* p, size_t n) { return transfer_all(fd, static_cast<char*>(p), n, ::read); }

}  // namespace

DiskTier::DiskTier(const DiskTierConfig& config, std::string dir) : config_(config), dir_(std::move(dir)) {
  stats_.capacity_bytes = config.capacity_bytes;
}

Result<std::unique_ptr<DiskTier>> DiskTier::open(const DiskTierConfig& config) {
  if (config.path.empty()) return make_error("the KV store needs a directory");
  if (config.block_bytes == 0) return make_error("the KV store needs the block size");
  if (config.capacity_bytes <= 0) return make_error("the KV store's size must be positive");
  const std::string dir = (fs::path(config.path) / hex16(config.fingerprint)).string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error("cannot create the KV store directory " + dir + ": " + ec.message());
  std::unique_ptr<DiskTier> tier(new DiskTier(config, dir));

  // What a previous run left: blocks in the order they were last used.
  struct Found {
    kv::BlockHash key;
    fs::file_time_type time;
  };
  std::vector<Found> found;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::optional<kv::BlockHash> key = key_of(name);
    std::error_code size_ec;
    const bool right_size = key && e.file_size(size_ec) == tier->file_bytes() && !size_ec;
    if (!right_size) {
      // An interrupted write, a truncated or foreign file: never a block.
      if (name.ends_with(kTempSuffix) || key) {
        fs::remove(e.path(), size_ec);
        ++tier->stats_.dropped;
      }
      continue;
    }
    found.push_back({*key, e.last_write_time(size_ec)});
  }
  if (ec) return make_error("cannot list the KV store directory " + dir + ": " + ec.message());
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.time < b.time; });
  for (const Found& f : found) tier->add_locked(f.key);  // no writer yet: nothing to lock against
  tier->writer_ = std::thread([t = tier.get()] { t->writer_loop(); });
  return tier;
}

DiskTier::~DiskTier() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::string DiskTier::file_path(kv::BlockHash key) const { return dir_ + "/" + hex16(key) + kSuffix; }

bool DiskTier::contains(kv::BlockHash key) const {
  std::lock_guard lock(mu_);
  return index_.count(key) > 0 || queued_.count(key) > 0;
}

bool DiskTier::read(kv::BlockHash key, std::byte* dst) {
  {
    std::lock_guard lock(mu_);
    if (auto q = queued_.find(key); q != queued_.end()) {
      std::memcpy(dst, q->second->data(), q->second->size());
      ++stats_.loads;
      return true;
    }
    if (!index_.count(key)) return false;
  }
  const std::string path = file_path(key);
  bool ok = false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    Header h;
    ok = read_all(fd, &h, sizeof h) && std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 &&
         h.fingerprint == config_.fingerprint && h.key == key && h.payload_bytes == config_.block_bytes &&
         read_all(fd, dst, config_.block_bytes) && XXH3_64bits(dst, config_.block_bytes) == h.checksum;
    if (ok) ::futimens(fd, nullptr);  // its place in the eviction order after a restart
    ::close(fd);
  }
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  if (!ok) {
    // A file the writer deleted meanwhile (evicted) is not a bad one.
    if (it != index_.end()) {
      remove_locked(key);
      ++stats_.dropped;
    }
    return false;
  }
  // Checked: the bytes are the block's even if the writer evicted it meanwhile.
  if (it != index_.end()) lru_.splice(lru_.begin(), lru_, it->second);
  ++stats_.loads;
  return true;
}

void DiskTier::write(kv::BlockHash key, BlockBytes bytes) {
  {
    std::lock_guard lock(mu_);
    if (index_.count(key) || queued_.count(key)) return;
    const auto size = static_cast<int64_t>(bytes->size());
    if (pending_bytes_ + size > config_.max_pending_bytes || size != static_cast<int64_t>(config_.block_bytes))
      return;
    pending_bytes_ += size;
    queued_.emplace(key, bytes);
    queue_.emplace_back(key, std::move(bytes));
  }
  work_cv_.notify_one();
}

void DiskTier::flush() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

TierStats DiskTier::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

Status DiskTier::check_invariants() const {
  std::lock_guard lock(mu_);
  if (index_.size() != lru_.size()) return make_error("disk tier: the index and the list differ");
  if (static_cast<int64_t>(lru_.size()) != stats_.blocks ||
      stats_.bytes != stats_.blocks * static_cast<int64_t>(file_bytes()))
    return make_error("disk tier: holds " + std::to_string(lru_.size()) + " files, counts say " +
                      std::to_string(stats_.blocks) + " blocks of " + std::to_string(stats_.bytes) + " bytes");
  if (stats_.bytes > stats_.capacity_bytes) return make_error("disk tier: over its capacity");
  int64_t queued = 0;
  for (const auto& [key, bytes] : queue_) queued += static_cast<int64_t>(bytes->size());
  // The writer's block has left queue_ but not yet pending_bytes_.
  if (queued > pending_bytes_ || queued_.size() < queue_.size())
    return make_error("disk tier: the write queue and its counts differ");
  return {};
}

bool DiskTier::write_file(kv::BlockHash key, const std::vector<std::byte>& bytes) const {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.fingerprint = config_.fingerprint;
  h.key = key;
  h.payload_bytes = bytes.size();
  h.checksum = XXH3_64bits(bytes.data(), bytes.size());
  const std::string final_path = file_path(key);
  const std::string temp_path = final_path + kTempSuffix;
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const bool written = write_all(fd, &h, sizeof h) && write_all(fd, bytes.data(), bytes.size());
  const bool closed = ::close(fd) == 0;
  if (written && closed && ::rename(temp_path.c_str(), final_path.c_str()) == 0) return true;
  ::unlink(temp_path.c_str());
  return false;
}

void DiskTier::writer_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping, and everything is written
    auto [key, bytes] = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    const bool ok = write_file(key, *bytes);
    lock.lock();
    writing_ = false;
    if (ok) add_locked(key);  // before it leaves queued_: never absent in between
    queued_.erase(key);
    pending_bytes_ -= static_cast<int64_t>(bytes->size());
    if (ok) ++stats_.saves;
    if (queue_.empty()) idle_cv_.notify_all();
  }
  idle_cv_.notify_all();
}

void DiskTier::add_locked(kv::BlockHash key) {
  const auto size = static_cast<int64_t>(file_bytes());
  if (index_.count(key)) return;
  lru_.push_front(key);
  index_.emplace(key, lru_.begin());
  stats_.bytes += size;
  ++stats_.blocks;
  while (stats_.bytes > stats_.capacity_bytes && !lru_.empty()) {
    remove_locked(lru_.back());
    ++stats_.evictions;
  }
}

void DiskTier::remove_locked(kv::BlockHash key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  lru_.erase(it->second);
  index_.erase(it);
  stats_.bytes -= static_cast<int64_t>(file_bytes());
  --stats_.blocks;
  ::unlink(file_path(key).c_str());
}

}  // namespace inferd::kvstore
