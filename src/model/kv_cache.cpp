#include "model/kv_cache.h"

namespace inferd {

KVCache::KVCache(const ModelConfig& c, int64_t n_blocks, int64_t block_size)
    : n_blocks_(n_blocks),
      block_size_(block_size),
      kv_dim_(c.kv_dim()),
      n_elements_(static_cast<size_t>(c.n_layer * n_blocks * block_size * kv_dim_)),
      k_(n_elements_ * sizeof(uint16_t), /*huge_pages=*/true, /*zeroed=*/false),
      v_(n_elements_ * sizeof(uint16_t), /*huge_pages=*/true, /*zeroed=*/false) {}

}  // namespace inferd
