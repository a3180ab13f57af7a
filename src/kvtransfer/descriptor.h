// What two instances must agree on before one reads the other's KV blocks
// (the handshake's descriptor), and how a pool's memory is laid out for a
// one-sided read.
//
// The producer's pool and the consumer's pool are the same shape (checked
// here), so block b of either is the same set of segments: for each region
// (keys, values) and each of its slabs (a layer's [block][slot] array), the
// bytes at (slab * n_blocks + b) * segment_bytes. Only n_blocks may differ.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "kv/kv_cache_spec.h"

namespace inferd::kvtransfer {

struct KVDescriptor {
  uint64_t fingerprint = 0;      // model file, numerics flavour, KV layout (engine/kv_offload.h)
  int32_t dtype = 0;             // of keys and values (core/dtype.h numbering)
  int32_t block_size = 0;        // tokens per block
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t layers_per_block = 0;  // slabs per region
  uint64_t block_bytes = 0;
  std::vector<int64_t> group_windows;  // the KV groups (0: full attention)
  std::vector<int32_t> layer_group;    // per layer: its group
  // Per group, its spec (kind, window, dtype, heads, head size, block size):
  // the fields above are the common part, these say each group's whole.
  std::vector<kv::KVCacheSpec> group_specs;

  // The first field that differs, named, with both values; nullopt when the
  // peers' blocks are interchangeable.
  std::optional<std::string> mismatch(const KVDescriptor& peer) const;
};

// A pool's memory: `regions` base addresses of equal layout (keys, values),
// each `slabs` arrays of n_blocks blocks of segment_bytes.
struct PoolMemory {
  std::vector<std::byte*> regions;
  int32_t slabs = 0;
  int64_t n_blocks = 0;
  uint64_t segment_bytes = 0;
  // Where the regions are on shared memory (a producer's, core/shared_bytes.h):
  // each region's memfd and the name a consumer on this host checks before it
  // maps them. Empty: this process's own memory.
  std::vector<int> region_fds;
  std::string shared_name;

  uint64_t region_bytes() const { return static_cast<uint64_t>(slabs) * n_blocks * segment_bytes; }
  // Offset of block b's segment in slab s of any region.
  uint64_t offset(int32_t slab, int64_t block) const {
    return (static_cast<uint64_t>(slab) * n_blocks + block) * segment_bytes;
  }
  uint64_t block_bytes() const { return regions.size() * slabs * segment_bytes; }
};

// A run of `count` consecutive blocks from `remote` on to `local` on: one read
// per segment moves the whole run.
struct BlockRun {
  int64_t remote = 0, local = 0, count = 0;
};
// (remote, local) pairs grouped into runs where both sides are consecutive, in
// the order given.
std::vector<BlockRun> block_runs(std::span<const std::pair<int32_t, int32_t>> blocks);

// Little-endian byte strings for the wire. Reader fails (returns false) on
// truncation instead of reading past the end: a peer's bytes are untrusted.
class Writer {
 public:
  void u8(uint8_t v) { bytes_.push_back(static_cast<std::byte>(v)); }
  void u32(uint32_t v) { raw(&v, sizeof v); }
  void u64(uint64_t v) { raw(&v, sizeof v); }
  void i64(int64_t v) { raw(&v, sizeof v); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  bool u8(uint8_t& v) { return raw(&v, sizeof v); }
  bool u32(uint32_t& v) { return raw(&v, sizeof v); }
  bool u64(uint64_t& v) { return raw(&v, sizeof v); }
  bool i64(int64_t& v) { return raw(&v, sizeof v); }
  bool str(std::string& s, size_t max = 1 << 16);
  bool raw(void* p, size_t n);
  size_t left() const { return bytes_.size() - at_; }

 private:
  std::span<const std::byte> bytes_;
  size_t at_ = 0;
};

void write(Writer& w, const KVDescriptor& d);
bool read(Reader& r, KVDescriptor& d);

}  // namespace inferd::kvtransfer
