// --kv-cache-dtype-skip-layers sliding_window (vLLM's flag): the windowed
// layers keep f16 while the others use --kv-cache-dtype, two dtypes in one
// block pool. On tiny-gemma3 (layers 2 and 5 global, the others windowed): the plan's
// specs and block bytes, the capacity the engine reports, the bytes each
// layer's cache holds after a forward pass (f16 where skipped, q8_0 where
// not), logits that are neither all-f16's nor all-q8_0's, and the names the
// flag refuses. (Batching within the setting: engine_batching_test.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_args.h"
#include "engine/kv_capacity.h"
#include "engine/stats_json.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/quants_blocks.h"
#include "kv/kv_cache_dtype.h"
#include "test_data.h"

namespace inferd {
namespace {

std::unique_ptr<Model> load_gemma3() {
  const std::string path = inferd::test::test_data_root() + "/models/tiny-gemma3.gguf";
  if (!std::ifstream(path).good()) {
    ADD_FAILURE() << path << " not found";
    return nullptr;
  }
  LoadOptions options;
  options.n_threads = 1;
  options.prefault = false;
  auto m = Model::load(path, options);
  EXPECT_TRUE(m.ok()) << m.error().message;
  return m.ok() ? std::move(*m) : nullptr;
}

TEST(KVCacheDTypeSkipLayers, SlidingWindowIsTheOneKindAndOthersAreRefusedByName) {
  EXPECT_FALSE(*kv::parse_kv_cache_dtype_skip_layers(""));
  EXPECT_FALSE(*kv::parse_kv_cache_dtype_skip_layers("none"));
  EXPECT_TRUE(*kv::parse_kv_cache_dtype_skip_layers("sliding_window"));
  EXPECT_TRUE(*kv::parse_kv_cache_dtype_skip_layers(" Sliding_Window ,none"));
  EngineArgs a;
  a.kv_cache_dtype = "q8_0";
  a.kv_cache_dtype_skip_layers = "sliding_window";
  auto ok = a.config();
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_TRUE(ok->kv_cache_skip_sliding_window);
  EXPECT_EQ(ok->kv_cache_dtype, DType::Q8_0);
  for (const char* bad : {"3", "sliding_window,full_attention", "sliding"}) {
    a.kv_cache_dtype_skip_layers = bad;
    auto refused = a.config();
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.error().message.find("--kv-cache-dtype-skip-layers"), std::string::npos)
        << refused.error().message;
    EXPECT_NE(refused.error().message.find("expected sliding_window or none"), std::string::npos)
        << refused.error().message;
  }
  auto keyword = a.config(EngineArgs::Naming::kKeyword);
  ASSERT_FALSE(keyword.ok());
  EXPECT_EQ(keyword.error().message.rfind("kv_cache_dtype_skip_layers", 0), 0u) << keyword.error().message;
}

// The plan: windowed groups F16, the global group Q8_0; every block the same
// bytes, set by the two global layers' q8_0, in which one f16 windowed layer
// fits (all q8_0: two windowed layers a block).
TEST(KVCacheDTypeSkipLayers, WindowedGroupsAreF16AndTheGlobalGroupQ8_0InOnePool) {
  auto model = load_gemma3();
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  const KVLayout all_q8 = KVLayout::plan(c, 16, DType::Q8_0);
  const KVLayout skip = KVLayout::plan(c, 16, DType::Q8_0, /*skip_sliding_window=*/true);
  for (const kv::KVCacheSpec& s : all_q8.group_specs) EXPECT_EQ(s.dtype, DType::Q8_0);
  EXPECT_EQ(all_q8.num_groups(), 3);  // 2 layers a block: 1 global group, 2 windowed
  EXPECT_EQ(skip.num_groups(), 5);    // 1 global group of 2 layers, 4 windowed of 1
  int windowed = 0, global = 0;
  for (int32_t l = 0; l < c.n_layer; ++l) {
    const kv::KVCacheSpec& s = skip.group_specs[skip.layer_group[l]];
    if (c.layers[l].sliding_window > 0) {
      ++windowed;
      EXPECT_EQ(s.kind, kv::KVCacheKind::kSlidingWindow) << l;
      EXPECT_EQ(s.dtype, DType::F16) << l;
    } else {
      ++global;
      EXPECT_EQ(s.kind, kv::KVCacheKind::kFullAttention) << l;
      EXPECT_EQ(s.dtype, DType::Q8_0) << l;
    }
  }
  ASSERT_EQ(windowed, 4);
  ASSERT_EQ(global, 2);
  EXPECT_TRUE(skip.mixed_dtypes());
  EXPECT_FALSE(all_q8.mixed_dtypes());
  // One KV head of 32: an f16 slot is 64 bytes, a q8_0 slot 34; a block of
  // 16 tokens is 2 x 16 x 34 bytes a store either way.
  EXPECT_EQ(all_q8.block_store_bytes, 2u * 16 * 34);
  EXPECT_EQ(skip.block_store_bytes, 2u * 16 * 34);
  EXPECT_EQ(skip.block_bytes(), 2u * 2 * 16 * 34);
  // A token: 4 windowed layers' f16 keys and values, 2 global layers' q8_0.
  EXPECT_EQ(skip.bytes_per_token(), 4u * 2 * 64 + 2 * 2 * 34);
  EXPECT_EQ(KVLayout::plan(c, 16, DType::F16, true).bytes_per_token(), 6u * 2 * 64);
}

// With more global layers a block holds (Gemma 3 270M's shape: 3 global, 15
// windowed, head 256): 3 q8_0 layers set a block, and each windowed group
// puts as many f16 layers in it as fit (1), so the global layers' blocks,
// which hold the whole context, waste nothing.
TEST(KVCacheDTypeSkipLayers, WindowedGroupsTakeAsManyF16LayersAsTheGlobalGroupsBlockHolds) {
  ModelConfig c;
  c.n_layer = 18;
  c.n_head = 4;
  c.n_head_kv = 1;
  c.head_dim = 256;
  c.layers.resize(18);
  for (int32_t l = 0; l < 18; ++l) c.layers[l].sliding_window = l % 6 == 5 ? 0 : 512;
  const KVLayout f16 = KVLayout::plan(c, 16, DType::F16);
  EXPECT_EQ(f16.layers_per_block, 3);
  EXPECT_EQ(f16.num_groups(), 6);
  const KVLayout skip = KVLayout::plan(c, 16, DType::Q8_0, true);
  const size_t q8_segment = 16u * 272, f16_segment = 16u * 512;
  EXPECT_EQ(skip.block_store_bytes, 3 * q8_segment);
  EXPECT_EQ(skip.group_specs.front().dtype, DType::Q8_0);  // the full-attention group first
  EXPECT_EQ(skip.num_groups(), 1 + 15);                   // 1 global group of 3, 15 windowed of 1
  EXPECT_LE(f16_segment, skip.block_store_bytes);
  for (int32_t l = 0; l < 18; ++l)
    EXPECT_LT(static_cast<size_t>(skip.layer_slab[l] + 1) * skip.group_specs[skip.layer_group[l]].segment_bytes(),
              skip.block_store_bytes + 1);
}

// The engine's capacity is the plan's: blocks of the mixed block bytes,
// tokens across the groups, bytes a token of both dtypes; and the stats say so.
TEST(KVCacheDTypeSkipLayers, TheEngineReportsTheCapacityOfTheMixedPool) {
  auto model = load_gemma3();
  ASSERT_TRUE(model);
  const int64_t budget = int64_t{2} << 20;
  EngineConfig ec;
  ec.kv_cache_dtype = DType::Q8_0;
  ec.kv_cache_skip_sliding_window = true;
  ec.kv_cache_bytes = budget;
  ec.max_num_seqs = 2;
  ec.max_model_len = 256;
  ec.warm_up = false;
  auto engine = Engine::create(*model, ec);
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  const EngineStats s = (*engine)->stats();
  const KVCapacity cap = kv_capacity_for_bytes(model->config(), 16, DType::Q8_0, budget, 0, true);
  const KVLayout layout = KVLayout::plan(model->config(), 16, DType::Q8_0, true);
  EXPECT_EQ(cap.blocks, budget / static_cast<int64_t>(layout.block_bytes()) - 1);
  EXPECT_EQ(s.kv_total_blocks, cap.blocks);
  EXPECT_EQ(s.kv_capacity_tokens, cap.tokens);
  EXPECT_EQ(s.kv_bytes_per_token, layout.bytes_per_token());
  EXPECT_EQ(s.kv_cache_dtype, DType::Q8_0);
  EXPECT_TRUE(s.kv_cache_skip_sliding_window);
  const nlohmann::json j = engine_stats_json(s);
  EXPECT_EQ(j["kv_cache_dtype_skip_layers"], "sliding_window");
  EXPECT_EQ(j["kv_bytes_per_token"], layout.bytes_per_token());
}

// One prompt through three caches: all f16, all q8_0, q8_0 with the windowed
// layers skipped. Layers 0 and 1 come before the first global layer, so with
// the skip they compute exactly what the f16 run computes: their f16 keys and
// values are the f16 run's to the bit; layer 2's input is the f16 run's too,
// and its q8_0 blocks hold those keys to q8_0's rounding. The logits then
// differ from both other runs (only the global layers are quantized), and by
// less from f16's than all-q8_0's do.
TEST(KVCacheDTypeSkipLayers, SkippedLayersHoldTheF16RunsBitsAndTheGlobalLayerItsKeysInQ8_0) {
  auto model = load_gemma3();
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  constexpr int64_t kTokens = 40;  // within the window (64): every layer sees every position
  ForwardBatch batch;
  for (int64_t t = 0; t < kTokens; ++t) {
    batch.tokens.push_back(static_cast<int32_t>(2 + (t * 37) % 200));
    batch.positions.push_back(static_cast<int32_t>(t));
  }
  SequenceSlice slice;
  slice.n_tokens = static_cast<int32_t>(kTokens);
  batch.logit_rows = {static_cast<int32_t>(kTokens - 1)};
  struct Run {
    std::unique_ptr<KVCache> cache;
    std::vector<float> logits;
  };
  auto run = [&](DType dtype, bool skip) {
    KVLayout layout = KVLayout::plan(c, 16, dtype, skip);
    const int32_t n_groups = layout.num_groups();
    Run r;
    r.cache = std::make_unique<KVCache>(std::move(layout), 1 + 3 * n_groups);
    ForwardBatch b = batch;
    SequenceSlice sl = slice;
    b.slots.assign(n_groups, {});
    for (int32_t g = 0; g < n_groups; ++g) {
      sl.block_tables.push_back({1 + 3 * g, 2 + 3 * g, 3 + 3 * g});
      for (int64_t t = 0; t < kTokens; ++t) b.slots[g].push_back((1 + 3 * g + t / 16) * 16 + t % 16);
    }
    b.sequences = {sl};
    model->forward(b, *r.cache, r.logits);
    return r;
  };
  Run f16 = run(DType::F16, false), q8 = run(DType::Q8_0, false), skip = run(DType::Q8_0, true);
  for (int32_t l = 0; l < c.n_layer; ++l) {
    const kv::KVCacheSpec& spec = skip.cache->layer_spec(l);
    EXPECT_EQ(spec.dtype, c.layers[l].sliding_window > 0 ? DType::F16 : DType::Q8_0) << l;
    if (l > 2) break;  // later layers read a quantized layer's output
    for (int64_t t = 0; t < kTokens; ++t) {
      const int64_t slot_f16 = (1 + 3 * f16.cache->group(l) + t / 16) * 16 + t % 16;
      const int64_t slot_skip = (1 + 3 * skip.cache->group(l) + t / 16) * 16 + t % 16;
      if (spec.dtype == DType::F16) {
        for (int64_t h = 0; h < spec.num_kv_heads; ++h) {
          const std::byte* kf = f16.cache->k(l) + f16.cache->head_offset(l, slot_f16, h);
          const std::byte* ks = skip.cache->k(l) + skip.cache->head_offset(l, slot_skip, h);
          ASSERT_EQ(std::memcmp(kf, ks, spec.head_bytes()), 0) << "layer " << l << " position " << t;
          const std::byte* vf = f16.cache->v(l) + f16.cache->head_offset(l, slot_f16, h);
          const std::byte* vs = skip.cache->v(l) + skip.cache->head_offset(l, slot_skip, h);
          ASSERT_EQ(std::memcmp(vf, vs, spec.head_bytes()), 0) << "layer " << l << " position " << t;
        }
        continue;
      }
      ASSERT_EQ(spec.dtype, DType::Q8_0);
      ASSERT_EQ(spec.key_rotation(), 0);  // a head of 32 is stored unrotated
      // Each 32-element block: d * q within d / 2 of the f16 run's key.
      for (int64_t h = 0; h < spec.num_kv_heads; ++h) {
        const auto* blocks =
            reinterpret_cast<const kernels::BlockQ8_0*>(skip.cache->k(l) + skip.cache->head_offset(l, slot_skip, h));
        const auto* want = reinterpret_cast<const uint16_t*>(f16.cache->k(l) + f16.cache->head_offset(l, slot_f16, h));
        for (int64_t i = 0; i < spec.head_size; ++i) {
          const float d = kernels::f16_to_f32(blocks[i / 32].d);
          const float got = d * blocks[i / 32].qs[i % 32];
          EXPECT_LE(std::fabs(got - kernels::f16_to_f32(want[i])), d * 0.5f + 1e-3f)
              << "layer " << l << " head " << h << " element " << i;
        }
      }
    }
  }
  ASSERT_EQ(f16.logits.size(), skip.logits.size());
  double to_f16 = 0, q8_to_f16 = 0, to_q8 = 0;
  for (size_t i = 0; i < f16.logits.size(); ++i) {
    to_f16 = std::max<double>(to_f16, std::fabs(skip.logits[i] - f16.logits[i]));
    q8_to_f16 = std::max<double>(q8_to_f16, std::fabs(q8.logits[i] - f16.logits[i]));
    to_q8 = std::max<double>(to_q8, std::fabs(skip.logits[i] - q8.logits[i]));
  }
  EXPECT_GT(to_f16, 0.0);
  EXPECT_GT(to_q8, 0.0);
  EXPECT_LT(to_f16, q8_to_f16);
}

}  // namespace
}  // namespace inferd
