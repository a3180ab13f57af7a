#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

namespace inferd {

KVLayout KVLayout::plan(const ModelConfig& c, int32_t block_size, DType dtype, bool skip_sliding_window) {
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
    // --kv-cache-dtype-skip-layers sliding_window: windowed layers stay f16.
    const DType t = window > 0 && skip_sliding_window ? DType::F16 : dtype;
    return kv::KVCacheSpec::for_window(t, static_cast<int32_t>(c.n_head_kv), static_cast<int32_t>(c.head_dim),
                                       block_size, window);
  };
  if (by_window.empty()) {  // no layers: one empty group keeps the shapes valid
    layout.group_windows = {0};
    layout.group_specs = {spec_for(0)};
    return layout;
  }
  // Every block is the same number of bytes (one pool). The kind with the
  // fewest layers sets it (that many layers a block; the full-attention
  // layers where there are any, since their blocks hold the whole context and
  // must waste nothing); every other kind puts as many layers in a block as
  // fit. With one dtype that is the smallest count for every kind. A kind
  // whose count is not a multiple leaves its last group's spare places empty
  // (Gemma 3 1B: 4 global, 22 windowed -> 6 windowed groups, 2 places unused);
  // a windowed kind in f16 beside q8_0 full layers fills its blocks less
  // (Gemma 3 270M: 3 q8_0 global layers a block, 1 f16 windowed layer).
  int32_t fewest = static_cast<int32_t>(c.n_kv_layers());
  for (const auto& [window, layers] : by_window) fewest = std::min(fewest, static_cast<int32_t>(layers.size()));
  const int64_t sizing_window = by_window.contains(0) ? 0 : by_window.begin()->first;
  layout.block_store_bytes = static_cast<size_t>(fewest) * spec_for(sizing_window).segment_bytes();
  std::map<int64_t, int32_t> per_block;
  for (const auto& [window, layers] : by_window) {
    const size_t segment = spec_for(window).segment_bytes();
    const int32_t fit = segment > 0 ? static_cast<int32_t>(layout.block_store_bytes / segment) : fewest;
    per_block[window] = std::clamp(fit, 1, static_cast<int32_t>(layers.size()));
    layout.block_store_bytes = std::max(layout.block_store_bytes, per_block[window] * segment);
    layout.layers_per_block = std::max(layout.layers_per_block, per_block[window]);
  }
  for (const auto& [window, layers] : by_window) {
    for (size_t i = 0; i < layers.size(); ++i) {
      if (i % per_block[window] == 0) {
        layout.group_windows.push_back(window);
        layout.group_specs.push_back(spec_for(window));
      }
      layout.layer_group[layers[i]] = layout.num_groups() - 1;
      layout.layer_slab[layers[i]] = static_cast<int32_t>(i % per_block[window]);
    }
  }
  return layout;
}

KVLayout KVLayout::for_layers(int64_t begin, int64_t end) const {
  KVLayout stage = *this;
  // Each group keeps the places its layers of [begin, end) take in a block,
  // renumbered in order; a block is as many bytes as the fullest group needs.
  std::vector<std::vector<int32_t>> place(group_specs.size(), std::vector<int32_t>(layers_per_block, -1));
  for (int64_t l = begin; l < end; ++l)
    if (layer_group[l] >= 0) place[layer_group[l]][layer_slab[l]] = 0;
  stage.layers_per_block = 0;
  stage.block_store_bytes = 0;
  for (size_t g = 0; g < place.size(); ++g) {
    int32_t kept = 0;
    for (int32_t& p : place[g])
      if (p == 0) p = kept++;
    stage.layers_per_block = std::max(stage.layers_per_block, kept);
    stage.block_store_bytes = std::max(stage.block_store_bytes, kept * group_specs[g].segment_bytes());
  }
  for (size_t l = 0; l < layer_slab.size(); ++l) {
    const bool own = static_cast<int64_t>(l) >= begin && static_cast<int64_t>(l) < end && layer_group[l] >= 0;
    stage.layer_slab[l] = own ? place[layer_group[l]][layer_slab[l]] : -1;
  }
  return stage;
}

KVCache::KVCache(const ModelConfig& c, int64_t n_blocks, int64_t block_size, bool shareable)
    : KVCache(KVLayout::plan(c, static_cast<int32_t>(block_size)), n_blocks, shareable) {}

KVCache::KVCache(KVLayout layout, int64_t n_blocks, bool shareable, int32_t n_state_slots)
    : layout_(std::move(layout)),
      n_blocks_(n_blocks),
      block_size_(layout_.storage_spec().block_size),
      store_bytes_(static_cast<size_t>(n_blocks) * layout_.block_store_bytes),
      n_state_slots_(n_state_slots) {
  if (layout_.n_state_layers > 0)
    states_ = AlignedBytes(static_cast<size_t>(n_state_slots + 1) * layout_.state_slot_bytes(), /*huge_pages=*/false,
                           /*zeroed=*/true);
  const size_t bytes = store_bytes_;
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
  const size_t bytes = layout_.block_store_bytes;
  for (uint8_t* store : stores()) std::memcpy(store + dst * bytes, store + src * bytes, bytes);
}

void KVCache::read_block(int64_t block, std::byte* dst) const {
  const size_t bytes = layout_.block_store_bytes;
  for (const uint8_t* store : stores()) {
    std::memcpy(dst, store + block * bytes, bytes);
    dst += bytes;
  }
}

void KVCache::write_block(int64_t block, const std::byte* src) {
  const size_t bytes = layout_.block_store_bytes;
  for (uint8_t* store : stores()) {
    std::memcpy(store + block * bytes, src, bytes);
    src += bytes;
  }
}

size_t KVLayout::bytes_per_token() const {
  size_t bytes = 0;
  for (size_t l = 0; l < layer_group.size(); ++l)
    if (layer_group[l] >= 0) bytes += group_specs[layer_group[l]].bytes_per_token();
  return bytes;
}

}  // namespace inferd
