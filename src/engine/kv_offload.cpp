#include "engine/kv_offload.h"

#include <xxhash.h>

#include <algorithm>
#include <vector>

namespace inferd {

uint64_t kv_fingerprint(const Model& model, const KVCache& cache) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  const gguf::File& file = model.file();
  constexpr uint64_t kChunk = uint64_t{64} << 20;
  for (uint64_t off = 0; off < file.file_size(); off += kChunk) {
    const uint64_t n = std::min(kChunk, file.file_size() - off);
    XXH3_64bits_update(st, file.image() + off, n);
    file.release_pages(file.image() + off, n);
  }
  // The layout from the cache's specs, with the format of a block's bytes
  // (kv::KVCacheSpec::storage_format): stores of another layout are refused.
  const KVLayout& layout = cache.layout();
  const kv::KVCacheSpec& spec = cache.storage_spec();
  const int64_t fields[] = {spec.storage_format(),
                            static_cast<int64_t>(model.ggml_flavour()),
                            spec.block_size,
                            layout.layers_per_block,
                            spec.slot_elements(),
                            static_cast<int64_t>(layout.layer_group.size())};
  XXH3_64bits_update(st, fields, sizeof fields);
  // Per group, its window (kind: a window > 0 is a sliding window) and, for a
  // group whose format differs from the storage's, that format too.
  std::vector<int64_t> windows;
  for (const kv::KVCacheSpec& g : layout.group_specs) {
    windows.push_back(g.sliding_window);
    if (g.storage_format() != spec.storage_format()) windows.push_back(g.storage_format());
  }
  XXH3_64bits_update(st, windows.data(), windows.size() * sizeof(int64_t));
  XXH3_64bits_update(st, layout.layer_group.data(), layout.layer_group.size() * sizeof(int32_t));
  XXH3_64bits_update(st, layout.layer_slab.data(), layout.layer_slab.size() * sizeof(int32_t));
  // Keys and values computed by the fast kernels differ from exact's: never
  // mixed. Exact adds nothing, so the stores written before tiers stay valid.
  if (model.numerics() != kernels::Numerics::kExact) {
    const int64_t tier = static_cast<int64_t>(model.numerics());
    XXH3_64bits_update(st, &tier, sizeof tier);
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

kvtransfer::KVDescriptor kv_descriptor(const ModelConfig& config, const KVCache& cache, uint64_t fingerprint) {
  kvtransfer::KVDescriptor d;
  const kv::KVCacheSpec& spec = cache.storage_spec();
  d.fingerprint = fingerprint;
  d.dtype = static_cast<int32_t>(spec.dtype);
  d.block_size = spec.block_size;
  d.n_layers = static_cast<int32_t>(config.n_layer);
  d.n_kv_heads = spec.num_kv_heads;
  d.head_dim = spec.head_size;
  d.layers_per_block = cache.layout().layers_per_block;
  d.block_bytes = cache.block_bytes();
  d.group_windows = cache.layout().group_windows;
  d.layer_group = cache.layout().layer_group;
  d.group_specs = cache.layout().group_specs;
  return d;
}

}  // namespace inferd
