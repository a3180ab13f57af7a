#include "engine/kv_offload.h"

#include <xxhash.h>

#include <algorithm>

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
  const KVLayout& layout = cache.layout();
  const int64_t fields[] = {1 /* format: f16 keys then values per slab */,
                            static_cast<int64_t>(model.ggml_flavour()),
                            cache.block_size(),
                            layout.layers_per_block,
                            cache.kv_dim(),
                            static_cast<int64_t>(layout.layer_group.size())};
  XXH3_64bits_update(st, fields, sizeof fields);
  XXH3_64bits_update(st, layout.group_windows.data(), layout.group_windows.size() * sizeof(int64_t));
  XXH3_64bits_update(st, layout.layer_group.data(), layout.layer_group.size() * sizeof(int32_t));
  XXH3_64bits_update(st, layout.layer_slab.data(), layout.layer_slab.size() * sizeof(int32_t));
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

}  // namespace inferd
