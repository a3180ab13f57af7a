#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

namespace inferd {

KVLayout KVLayout::plan(const ModelConfig& c, int32_t block_size, DType dtype) {
  // Layers by window, full attention (0) first.
  std::map<int64_t, std::vector<int32_t>> by_window;
  KVLayout layout;
  layout.layer_group.assign(c.n_layer, 0);
  layout.layer_slab.assign(c.n_layer, 0);
  layout.layer_state.assign(c.n_layer, -1);
  for (int32_t l = 0; l < c.n_layer; ++l) {
    if (l < static_cast<int32_t>(c.layers.size()) && !c.layers[l].keeps_kv()) {
      // A recurrent layer keeps a state in the slots; an FFN-only layer nothing.
      layout.layer_group[l] = -1;
      if (c.layers[l].recurrent) layout.layer_state[l] = layout.n_state_layers++;
      continue;
    }
    by_window[l < static_cast<int32_t>(c.layers.size()) ? c.layers[l].sliding_window : 0].push_back(l);
  }
  if (layout.n_state_layers > 0)
    layout.state_spec = kv::KVCacheSpec::recurrent_state(c.conv_state_elements(), c.recurrent_state_elements());
  const auto spec_for = [&](int64_t window) {
    if (c.mla) return kv::KVCacheSpec::latent(dtype, static_cast<int32_t>(c.mla.latent_width()), block_size);
    return kv::KVCacheSpec::for_window(dtype, static_cast<int32_t>(c.n_head_kv), static_cast<int32_t>(c.head_dim),
                                       block_size, window);
  };
  if (by_window.empty()) {  // no layers: one empty group keeps the shapes valid
    layout.group_windows = {0};
    layout.group_specs = {spec_for(0)};
    return layout;
  }
  layout.layers_per_block = static_cast<int32_t>(c.n_kv_layers());
  for (const auto& [window, layers] : by_window)
    layout.layers_per_block = std::min(layout.layers_per_block, static_cast<int32_t>(layers.size()));
  // A kind whose count is not a multiple leaves its last group's spare places
  // empty (Gemma 3 1B: 4 global, 22 windowed -> 6 windowed groups, 2 places unused).
  for (const auto& [window, layers] : by_window) {
    for (size_t i = 0; i < layers.size(); ++i) {
      if (i % layout.layers_per_block == 0) {
        layout.group_windows.push_back(window);
        layout.group_specs.push_back(spec_for(window));
      }
      layout.layer_group[layers[i]] = layout.num_groups() - 1;
      layout.layer_slab[layers[i]] = static_cast<int32_t>(i % layout.layers_per_block);
    }
  }
  return layout;
}

KVCache::KVCache(const ModelConfig& c, int64_t n_blocks, int64_t block_size, bool shareable)
    : KVCache(KVLayout::plan(c, static_cast<int32_t>(block_size)), n_blocks, shareable) {}

KVCache::KVCache(KVLayout layout, int64_t n_blocks, bool shareable, int32_t n_state_slots)
    : layout_(std::move(layout)),
      n_blocks_(n_blocks),
      block_size_(layout_.storage_spec().block_size),
      slot_bytes_(layout_.storage_spec().slot_bytes()),
      head_bytes_(layout_.storage_spec().head_bytes()),
      segment_bytes_(layout_.storage_spec().segment_bytes()),
      slab_bytes_(static_cast<size_t>(n_blocks) * segment_bytes_),
      n_state_slots_(n_state_slots) {
  if (layout_.n_state_layers > 0)
    states_ = AlignedBytes(static_cast<size_t>(n_state_slots + 1) * layout_.state_slot_bytes(), /*huge_pages=*/false,
                           /*zeroed=*/true);
  const size_t bytes = slab_bytes_ * static_cast<size_t>(layout_.layers_per_block);
  // A latent cache (kv::KVCacheSpec::has_values) has keys only.
  const size_t v_bytes = layout_.storage_spec().has_values() ? bytes : 0;
  if (shareable && bytes > 0) {
    auto k = SharedBytes::create(bytes, kSharedName);
    auto v = !k ? Result<SharedBytes>(k.error()) : v_bytes > 0 ? SharedBytes::create(v_bytes, kSharedName)
                                                               : Result<SharedBytes>(SharedBytes{});
    if (k && v) {
      k_shared_ = std::move(*k);
      v_shared_ = std::move(*v);
      k_ = k_shared_.data();
      v_ = v_bytes > 0 ? v_shared_.data() : nullptr;
      return;
    }
    shared_error_ = (k ? v : k).error().message;
  }
  k_local_ = AlignedBytes(bytes, /*huge_pages=*/true, /*zeroed=*/false);
  if (v_bytes > 0) v_local_ = AlignedBytes(v_bytes, /*huge_pages=*/true, /*zeroed=*/false);
  k_ = k_local_.data();
  v_ = v_bytes > 0 ? v_local_.data() : nullptr;
}

std::vector<uint8_t*> KVCache::stores() const {
  if (v_) return {k_, v_};
  return {k_};
}

void KVCache::copy_block(int64_t src, int64_t dst) {
  // A block holds the same slots of each of its layers_per_block slabs.
  const size_t bytes = segment_bytes_;
  for (uint8_t* store : stores()) {
    for (int32_t slab = 0; slab < layout_.layers_per_block; ++slab) {
      uint8_t* s = store + static_cast<size_t>(slab) * slab_bytes_;
      std::memcpy(s + dst * bytes, s + src * bytes, bytes);
    }
  }
}

void KVCache::read_block(int64_t block, std::byte* dst) const {
  const size_t bytes = segment_bytes_;
  for (const uint8_t* store : stores())
    for (int32_t slab = 0; slab < layout_.layers_per_block; ++slab, dst += bytes)
      std::memcpy(dst, store + (static_cast<size_t>(slab) * n_blocks_ + block) * bytes, bytes);
}

void KVCache::write_block(int64_t block, const std::byte* src) {
  const size_t bytes = segment_bytes_;
  for (uint8_t* store : stores())
    for (int32_t slab = 0; slab < layout_.layers_per_block; ++slab, src += bytes)
      std::memcpy(store + (static_cast<size_t>(slab) * n_blocks_ + block) * bytes, src, bytes);
}

}  // namespace inferd
