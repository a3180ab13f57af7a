// What the engine gives the KV offload tiers (kvstore/): the pool's memory as
// blocks, and a fingerprint that names the model and the KV layout, so blocks
// saved by another model, another quantization, another layout or another
// numerics tier (kernels/cpu/numerics.h) are never loaded.
#pragma once
#include <cstdint>

#include "kv/kv_connector.h"
#include "kvtransfer/descriptor.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace inferd {

class KVCacheBlocks : public kv::KVBlockStorage {
 public:
  explicit KVCacheBlocks(KVCache& cache) : cache_(cache) {}
  size_t block_bytes() const override { return cache_.block_bytes(); }
  void read_block(int32_t block, std::byte* dst) const override { cache_.read_block(block, dst); }
  void write_block(int32_t block, const std::byte* src) override { cache_.write_block(block, src); }

 private:
  KVCache& cache_;
};

// XXH3 of the model file's bytes (every byte: two fine-tunes of one shape
// differ only in their weights), the numerics flavour, and the KV layout as
// the cache's specs give it (storage format: dtype and kind; block size,
// layers per block, slot width, groups and windows).
// Reads the whole file once (the mapped pages are let go as it goes).
uint64_t kv_fingerprint(const Model& model, const KVCache& cache);

// The cache's blocks as a KV transfer describes them to its peer (sizes and
// layout from the cache's specs); the pool's memory regions are the caller's.
kvtransfer::KVDescriptor kv_descriptor(const ModelConfig& config, const KVCache& cache, uint64_t fingerprint);

}  // namespace inferd
