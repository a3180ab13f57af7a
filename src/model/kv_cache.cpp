#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <map>

namespace inferd {

KVLayout KVLayout::plan(const ModelConfig& c) {
  // Layers by window, full attention (0) first.
  std::map<int64_t, std::vector<int32_t>> by_window;
  for (int32_t l = 0; l < c.n_layer; ++l)
    by_window[l < static_cast<int32_t>(c.layers.size()) ? c.layers[l].sliding_window : 0].push_back(l);
  KVLayout layout;
  layout.layer_group.assign(c.n_layer, 0);
  layout.layer_slab.assign(c.n_layer, 0);
  if (by_window.empty()) {  // no layers: one empty group keeps the shapes valid
    layout.group_windows = {0};
    return layout;
  }
  layout.layers_per_block = static_cast<int32_t>(c.n_layer);
  for (const auto& [window, layers] : by_window)
    layout.layers_per_block = std::min(layout.layers_per_block, static_cast<int32_t>(layers.size()));
  // A kind whose count is not a multiple leaves its last group's spare places
  // empty (Gemma 3 1B: 4 global, 22 windowed -> 6 windowed groups, 2 places unused).
  for (const auto& [window, layers] : by_window) {
    for (size_t i = 0; i < layers.size(); ++i) {
      if (i % layout.layers_per_block == 0) layout.group_windows.push_back(window);
      layout.layer_group[layers[i]] = layout.num_groups() - 1;
      layout.layer_slab[layers[i]] = static_cast<int32_t>(i % layout.layers_per_block);
    }
  }
  return layout;
}

KVCache::KVCache(const ModelConfig& c, int64_t n_blocks, int64_t block_size, bool shareable)
    : layout_(KVLayout::plan(c)),
      n_blocks_(n_blocks),
      block_size_(block_size),
      kv_dim_(c.kv_dim()),
      n_elements_(static_cast<size_t>(layout_.layers_per_block * n_blocks * block_size * kv_dim_)) {
  const size_t bytes = n_elements_ * sizeof(uint16_t);
  if (shareable && bytes > 0) {
    auto k = SharedBytes::create(bytes, kSharedName);
    auto v = k ? SharedBytes::create(bytes, kSharedName) : Result<SharedBytes>(k.error());
    if (k && v) {
      k_shared_ = std::move(*k);
      v_shared_ = std::move(*v);
      k_ = k_shared_.data();
      v_ = v_shared_.data();
      return;
    }
    shared_error_ = (k ? v : k).error().message;
  }
  k_local_ = AlignedBytes(bytes, /*huge_pages=*/true, /*zeroed=*/false);
  v_local_ = AlignedBytes(bytes, /*huge_pages=*/true, /*zeroed=*/false);
  k_ = k_local_.data();
  v_ = v_local_.data();
}

void KVCache::copy_block(int64_t src, int64_t dst) {
  // A block holds the same slots of each of its layers_per_block slabs.
  const size_t block_elements = static_cast<size_t>(block_size_ * kv_dim_);
  for (uint8_t* store : {k_, v_}) {
    uint16_t* base = reinterpret_cast<uint16_t*>(store);
    for (int32_t slab = 0; slab < layout_.layers_per_block; ++slab) {
      uint16_t* s = base + static_cast<size_t>(slab) * n_slots() * kv_dim_;
      std::memcpy(s + dst * block_elements, s + src * block_elements, block_elements * sizeof(uint16_t));
    }
  }
}

void KVCache::read_block(int64_t block, std::byte* dst) const {
  const size_t bytes = static_cast<size_t>(block_size_ * kv_dim_) * sizeof(uint16_t);
  for (const uint8_t* store : {k_, v_})
    for (int32_t slab = 0; slab < layout_.layers_per_block; ++slab, dst += bytes)
      std::memcpy(dst, store + (static_cast<size_t>(slab) * n_blocks_ + block) * bytes, bytes);
}

void KVCache::write_block(int64_t block, const std::byte* src) {
  const size_t bytes = static_cast<size_t>(block_size_ * kv_dim_) * sizeof(uint16_t);
  for (uint8_t* store : {k_, v_})
    for (int32_t slab = 0; slab < layout_.layers_per_block; ++slab, src += bytes)
      std::memcpy(store + (static_cast<size_t>(slab) * n_blocks_ + block) * bytes, src, bytes);
}

}  // namespace inferd
