// The KV layout's specs and the cache laid out from them: gemma3's windowed
// and global groups, the cache's strides and blocks from the spec, and a KV
// dtype the CPU executor's attention kernels do not read refused before any
// cache is made.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "kv/kv_cache_dtype.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "test_data.h"

namespace inferd {
namespace {

// Gemma 3 270M's attention: 18 layers, every 6th global and the rest within
// 512 positions, 1 KV head of 256.
ModelConfig gemma3_270m_shape() {
  ModelConfig c;
  c.n_layer = 18;
  c.n_head = 4;
  c.n_head_kv = 1;
  c.head_dim = 256;
  c.layers.assign(18, LayerConfig{});
  for (int l = 0; l < 18; ++l) c.layers[l].sliding_window = (l + 1) % 6 == 0 ? 0 : 512;
  return c;
}

TEST(ModelKVCacheSpec, APipelineStageKeepsItsLayersSlabsOfTheSameGroups) {
  const KVLayout whole = KVLayout::plan(gemma3_270m_shape(), 16);
  ASSERT_EQ(whole.layers_per_block, 3);
  // Layers 0..8: windowed 0-4, 6-8 (places 0,1,2,0,1 and 2,0,1) and global 5 (place 0): every place.
  const KVLayout first = whole.for_layers(0, 9);
  EXPECT_EQ(first.group_windows, whole.group_windows);
  EXPECT_EQ(first.layers_per_block, 3);
  // Layers 0..1 only: places 0 and 1 of the first windowed group.
  const KVLayout two = whole.for_layers(0, 2);
  EXPECT_EQ(two.layers_per_block, 2);
  EXPECT_EQ(two.layer_slab[0], 0);
  EXPECT_EQ(two.layer_slab[1], 1);
  EXPECT_EQ(two.layer_slab[2], -1);
  EXPECT_EQ(two.block_bytes() * 3, whole.block_bytes() * 2);
  // Layers 2..3: place 2 of the first windowed group and place 0 of the
  // second; a block belongs to one group, so each keeps one place, renumbered 0.
  const KVLayout mid = whole.for_layers(2, 4);
  EXPECT_EQ(mid.layers_per_block, 1);
  EXPECT_EQ(mid.layer_slab[2], 0);
  EXPECT_EQ(mid.layer_slab[3], 0);
  EXPECT_EQ(mid.block_bytes() * 3, whole.block_bytes());
}

TEST(ModelKVCacheSpec, Gemma3GroupsGetAFullAndFiveSlidingWindowSpecs) {
  const ModelConfig c = gemma3_270m_shape();
  const KVLayout layout = KVLayout::plan(c, 16);
  ASSERT_EQ(layout.layers_per_block, 3);
  ASSERT_EQ(layout.num_groups(), 6);
  ASSERT_EQ(layout.group_specs.size(), 6u);
  EXPECT_EQ(layout.group_specs[0], kv::KVCacheSpec::full_attention(DType::F16, 1, 256, 16));
  for (int g = 1; g < 6; ++g) {
    EXPECT_EQ(layout.group_specs[g], kv::KVCacheSpec::sliding(DType::F16, 1, 256, 16, 512)) << g;
    EXPECT_EQ(layout.group_windows[g], layout.group_specs[g].sliding_window);
  }
  // The global layers 5, 11, 17 share group 0.
  for (int l : {5, 11, 17}) EXPECT_EQ(layout.layer_group[l], 0) << l;
  // A block: 3 layers x (keys + values) x 16 slots x 256 x 2 bytes, the same in every group.
  EXPECT_EQ(layout.block_bytes(), 3u * 2 * 16 * 256 * 2);
  EXPECT_EQ(KVCache::block_bytes(c, 16), layout.block_bytes());
  EXPECT_EQ(KVCache::bytes_per_token(c), 18u * 2 * 256 * 2);
  // Another dtype changes the bytes, not the grouping.
  const KVLayout q8 = KVLayout::plan(c, 16, DType::Q8_0);
  EXPECT_EQ(q8.layer_group, layout.layer_group);
  EXPECT_EQ(q8.block_bytes(), 3u * 2 * 16 * (256 / 32 * 34));
  EXPECT_EQ(KVCache::block_bytes(c, 16, DType::Q8_0), q8.block_bytes());
}

TEST(ModelKVCacheSpec, TheCacheIsLaidOutFromItsSpec) {
  ModelConfig c = gemma3_270m_shape();
  KVCache cache(c, /*n_blocks=*/4, /*block_size=*/8);
  const kv::KVCacheSpec& s = cache.storage_spec();
  EXPECT_EQ(s.block_size, 8);
  EXPECT_EQ(s.head_bytes(), 512u);
  const size_t segment = s.segment_bytes();
  EXPECT_EQ(segment, 8u * 512);
  EXPECT_EQ(cache.block_stride(), 3 * segment);
  EXPECT_EQ(cache.block_bytes(), 3 * s.page_bytes());
  EXPECT_EQ(cache.bytes(), 4 * cache.block_bytes());
  EXPECT_EQ(cache.layer_spec(5).kind, kv::KVCacheKind::kFullAttention);
  EXPECT_EQ(cache.layer_spec(0).kind, kv::KVCacheKind::kSlidingWindow);
  // Layers in the same place of their blocks share an offset; a block's
  // layers are one segment apart, and head h of slot s of block b is b
  // blocks, h runs of a block's slots of one head, and s heads on.
  EXPECT_EQ(cache.k(0), cache.k(3));
  EXPECT_EQ(cache.k(1) - cache.k(0), static_cast<std::ptrdiff_t>(segment));
  EXPECT_EQ(cache.head_offset(1, 2 * 8 + 5, 0), 2 * cache.block_stride() + 5 * s.head_bytes());
  ASSERT_EQ(s.num_kv_heads, 1);  // Gemma 3 270M: one key/value head
  const kv::KVCacheSpec two = kv::KVCacheSpec::full_attention(DType::F16, 2, 256, 8);
  EXPECT_EQ(two.head_offset_in_segment(1, 5), (8 + 5) * two.head_bytes());
  // A block's bytes whole, round trip: every layer's keys, then values.
  std::vector<std::byte> block(cache.block_bytes()), back(cache.block_bytes());
  for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<std::byte>(i * 7 + 3);
  cache.write_block(2, block.data());
  cache.copy_block(2, 1);
  cache.read_block(1, back.data());
  EXPECT_EQ(std::memcmp(block.data(), back.data(), block.size()), 0);
  EXPECT_EQ(std::memcmp(cache.v(0) + 2 * cache.block_stride(), block.data() + 3 * segment, segment), 0);
}

// DeepSeek-V2-Lite's attention: 27 layers of multi-head latent attention,
// 16 heads, a 512-wide latent and a 64-wide RoPE key per token.
ModelConfig deepseek_v2_lite_shape() {
  ModelConfig c;
  c.n_layer = 27;
  c.n_head = 16;
  c.n_head_kv = 1;
  c.head_dim = 576;
  c.rope_dim = 64;
  c.mla = MlaConfig{0, 512, 128, 64, 128};
  c.layers.assign(27, LayerConfig{});
  return c;
}

TEST(ModelKVCacheSpec, LatentAttentionKeepsOneLatentAToken) {
  const ModelConfig c = deepseek_v2_lite_shape();
  const KVLayout layout = KVLayout::plan(c, 16);
  ASSERT_EQ(layout.num_groups(), 1);
  EXPECT_EQ(layout.storage_spec(), kv::KVCacheSpec::latent(DType::F16, 576, 16));
  // 27 layers x 576 x 2 bytes: llama.cpp's 31,104 bytes a token for this model
  // (its "K (f16): ..., V (f16): 0.00 MiB"); full K and V for 16 heads of 192/128
  // would be 27 x 16 x (192 + 128) x 2 = 276,480.
  EXPECT_EQ(KVCache::bytes_per_token(c), 31104u);
  EXPECT_EQ(layout.block_bytes(), 27u * 16 * 1152);
  KVCache cache(c, /*n_blocks=*/3, /*block_size=*/16);
  EXPECT_EQ(cache.bytes(), 3 * cache.block_bytes());
  EXPECT_EQ(cache.v(0), nullptr);
  EXPECT_EQ(cache.values_base(), nullptr);
  // A block's bytes are its layers' latents: round trip through the offload tiers' copy.
  std::vector<std::byte> block(cache.block_bytes()), back(cache.block_bytes());
  for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<std::byte>(i * 5 + 1);
  cache.write_block(2, block.data());
  cache.copy_block(2, 0);
  cache.read_block(0, back.data());
  EXPECT_EQ(std::memcmp(block.data(), back.data(), block.size()), 0);
}

// A quantized latent cache: the slot is the latent and RoPE key padded to
// whole 32-element blocks (none for DeepSeek's 576), never rotated (the
// values are the keys' first kv_lora_rank elements, as in llama.cpp's K-only
// cache), and its bytes a token are what the dtype's rows take: llama.cpp's
// ggml_row_size of a 576-wide K row per layer (Q8_0: 612 bytes, Q4_0: 324).
TEST(ModelKVCacheSpec, TheLatentCacheTakesEachKVDType) {
  const ModelConfig v2_lite = deepseek_v2_lite_shape();
  const std::pair<DType, size_t> per_token[] = {
      {DType::F16, 27 * 1152}, {DType::BF16, 27 * 1152}, {DType::Q8_0, 27 * 612}, {DType::Q4_0, 27 * 324},
      {DType::F8_E4M3, 27 * 576}};
  for (const auto& [t, bytes] : per_token) {
    const kv::KVCacheSpec spec = KVLayout::plan(v2_lite, 16, t).storage_spec();
    EXPECT_EQ(spec, kv::KVCacheSpec::latent(t, 576, 16)) << dtype_name(t);
    EXPECT_EQ(spec.head_size, 576) << dtype_name(t);
    EXPECT_EQ(spec.key_rotation(), 0) << dtype_name(t);
    EXPECT_EQ(spec.value_rotation(), 0) << dtype_name(t);
    EXPECT_EQ(27 * spec.bytes_per_token(), bytes) << dtype_name(t);
  }

  LoadOptions options;
  options.n_threads = 1;
  options.prefault = false;
  const std::string path = inferd::test::test_data_root() + "/models/tiny-deepseek2.gguf";
  auto model = Model::load(path, options);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const ModelConfig& c = (*model)->config();
  // 4 layers of latent 96 + RoPE 16: f16 keeps 112 elements, the others 128.
  const std::pair<DType, size_t> tiny[] = {
      {DType::F16, 4 * 224}, {DType::BF16, 4 * 256}, {DType::Q8_0, 4 * 136}, {DType::Q4_0, 4 * 72},
      {DType::F8_E4M3, 4 * 128}};
  for (const auto& [t, bytes] : tiny) {
    const KVLayout layout = KVLayout::plan(c, 16, t);
    EXPECT_EQ(layout.storage_spec().head_size, t == DType::F16 ? 112 : 128) << dtype_name(t);
    EXPECT_EQ(4 * layout.storage_spec().bytes_per_token(), bytes) << dtype_name(t);
    const Status s = (*model)->check_kv_cache(layout);
    EXPECT_TRUE(s.ok()) << dtype_name(t) << ": " << s.error().message;
  }
}

std::string tiny_gemma3() {
  const std::string path = inferd::test::test_data_root() + "/models/tiny-gemma3.gguf";
  if (!std::ifstream(path).good()) ADD_FAILURE() << path << " not found";
  return path;
}

TEST(ModelKVCacheSpec, TheCpuExecutorRefusesAKVDTypeItsAttentionDoesNotRead) {
  LoadOptions options;
  options.n_threads = 1;
  options.prefault = false;
  auto model = Model::load(tiny_gemma3(), options);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const ModelConfig& c = (*model)->config();
  for (DType t : {DType::F16, DType::Q8_0, DType::Q4_0, DType::BF16, DType::F8_E4M3})
    EXPECT_TRUE((*model)->check_kv_cache(KVLayout::plan(c, 16, t)).ok()) << dtype_name(t);
  for (DType t : {DType::Q4_1, DType::F32}) {
    const Status s = (*model)->check_kv_cache(KVLayout::plan(c, 16, t));
    ASSERT_FALSE(s.ok()) << dtype_name(t);
    EXPECT_EQ(s.error().message, "a KV cache of " + kv::kv_cache_dtype_name(t) +
                                     " is not supported: the CPU attention kernels read f16, bf16, fp8_e4m3, q8_0 "
                                     "and q4_0 keys and values");
  }
  // A spec that cannot be laid out at all says so first.
  KVLayout bad = KVLayout::plan(c, 16);
  bad.group_specs[0].head_size = 17;
  bad.group_specs[0].dtype = DType::Q8_0;
  EXPECT_NE((*model)->check_kv_cache(bad).error().message.find("not whole blocks"), std::string::npos);
  // bf16 and fp8 elements are read 32 at a time: a head of 48 is refused by the executor.
  for (DType t : {DType::BF16, DType::F8_E4M3}) {
    KVLayout odd = KVLayout::plan(c, 16, t);
    odd.group_specs[0].head_size = 48;
    const Status s = (*model)->check_kv_cache(odd);
    ASSERT_FALSE(s.ok()) << dtype_name(t);
    EXPECT_EQ(s.error().message, "a KV cache of " + kv::kv_cache_dtype_name(t) +
                                     " needs heads of whole 32-element blocks (this model's head is 48); use f16");
  }
}

}  // namespace
}  // namespace inferd
