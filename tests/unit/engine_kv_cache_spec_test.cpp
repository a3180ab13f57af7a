// The KV cache's spec where blocks leave the pool: the offload tiers'
// fingerprint and the KV transfer's descriptor differ when the spec does (so
// a store or a peer of another format is never read: a disk store written by
// an f16 cache gives a q8_0 cache nothing), an f16 cache's differs from the
// one it had before specs (a block was laid out slot by slot then, not head
// by head), and a runner asked for a KV dtype the executor does not read is
// refused by name.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/kv_offload.h"
#include "engine/model_runner.h"
#include "kvstore/tiered_connector.h"
#include "kvtransfer/descriptor.h"
#include "test_data.h"

namespace inferd {
namespace {

std::unique_ptr<Model> load(const std::string& name) {
  const std::string path = inferd::test::test_data_root() + "/models/" + name;
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

// The fingerprint as it was computed before the KV cache had specs (f16 only).
uint64_t pre_spec_fingerprint(const Model& model, const KVCache& cache) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  const gguf::File& file = model.file();
  XXH3_64bits_update(st, file.image(), file.file_size());
  const KVLayout& layout = cache.layout();
  const int64_t fields[] = {1,
                            static_cast<int64_t>(model.ggml_flavour()),
                            cache.block_size(),
                            layout.layers_per_block,
                            model.config().kv_dim(),
                            static_cast<int64_t>(layout.layer_group.size())};
  XXH3_64bits_update(st, fields, sizeof fields);
  XXH3_64bits_update(st, layout.group_windows.data(), layout.group_windows.size() * sizeof(int64_t));
  XXH3_64bits_update(st, layout.layer_group.data(), layout.layer_group.size() * sizeof(int32_t));
  XXH3_64bits_update(st, layout.layer_slab.data(), layout.layer_slab.size() * sizeof(int32_t));
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

TEST(EngineKVCacheSpec, TheFingerprintDiffersWhenTheSpecDiffers) {
  auto model = load("tiny-gemma3.gguf");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  const KVCache f16(KVLayout::plan(c, 16), 4);
  const KVCache f16_again(KVLayout::plan(c, 16), 8);  // the pool's size is no part of it
  const KVCache bigger_blocks(KVLayout::plan(c, 32), 4);
  const KVCache q8(KVLayout::plan(c, 16, DType::Q8_0), 4);
  const KVCache q4(KVLayout::plan(c, 16, DType::Q4_0), 4);
  const KVCache bf16(KVLayout::plan(c, 16, DType::BF16), 4);
  const uint64_t fp = kv_fingerprint(*model, f16);
  EXPECT_EQ(fp, kv_fingerprint(*model, f16_again));
  EXPECT_NE(fp, pre_spec_fingerprint(*model, f16));  // stores of the slot-by-slot layout are refused
  EXPECT_NE(fp, kv_fingerprint(*model, bigger_blocks));
  EXPECT_NE(fp, kv_fingerprint(*model, q8));
  EXPECT_NE(fp, kv_fingerprint(*model, bf16));
  EXPECT_NE(kv_fingerprint(*model, q8), kv_fingerprint(*model, bf16));
  EXPECT_NE(fp, kv_fingerprint(*model, q4));
  EXPECT_NE(kv_fingerprint(*model, q8), kv_fingerprint(*model, q4));
  // Another model (its file and its layout) too.
  auto llama = load("tiny-llama3.gguf");
  ASSERT_TRUE(llama);
  const KVCache other(KVLayout::plan(llama->config(), 16), 4);
  EXPECT_NE(kv_fingerprint(*llama, other), pre_spec_fingerprint(*llama, other));
  EXPECT_NE(fp, kv_fingerprint(*llama, other));
}

// Two caches of one model in different dtypes on one disk store: the second
// never sees the first's blocks (same prefix key, other bytes), while a
// cache of the first's dtype does.
TEST(EngineKVCacheSpec, AnOffloadTierNeverLoadsBlocksWrittenUnderAnotherDType) {
  auto model = load("tiny-llama3.gguf");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("inferd_kv_dtype_store_" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  kvstore::OffloadConfig oc;
  oc.disk_path = dir;
  oc.disk_bytes = int64_t{16} << 20;
  const kv::BlockHash key = 0x5eed;
  KVCache f16(KVLayout::plan(c, 16), 4);
  std::vector<std::byte> written(f16.block_bytes());
  for (size_t i = 0; i < written.size(); ++i) written[i] = static_cast<std::byte>(i * 7 + 1);
  f16.write_block(1, written.data());
  {
    KVCacheBlocks blocks(f16);
    auto tiers = kvstore::TieredConnector::create(oc, blocks, kv_fingerprint(*model, f16));
    ASSERT_TRUE(tiers.ok()) << tiers.error().message;
    const kv::BlockTransfer save{key, 1};
    (*tiers)->save_computed({&save, 1});
    (*tiers)->flush();
    EXPECT_EQ((*tiers)->stats().disk.blocks, 1);
  }
  {  // The same dtype again finds it, byte for byte.
    KVCache again(KVLayout::plan(c, 16), 4);
    KVCacheBlocks blocks(again);
    auto tiers = kvstore::TieredConnector::create(oc, blocks, kv_fingerprint(*model, again));
    ASSERT_TRUE(tiers.ok()) << tiers.error().message;
    EXPECT_TRUE((*tiers)->contains(key));
    const kv::BlockTransfer load{key, 2};
    EXPECT_EQ((*tiers)->load({&load, 1}, false), std::vector<bool>{true});
    std::vector<std::byte> read(again.block_bytes());
    again.read_block(2, read.data());
    EXPECT_EQ(read, written);
  }
  for (DType other : {DType::Q8_0, DType::Q4_0, DType::BF16}) {
    KVCache cache(KVLayout::plan(c, 16, other), 4);
    KVCacheBlocks blocks(cache);
    auto tiers = kvstore::TieredConnector::create(oc, blocks, kv_fingerprint(*model, cache));
    ASSERT_TRUE(tiers.ok()) << tiers.error().message;
    EXPECT_FALSE((*tiers)->contains(key)) << dtype_name(other);
    const kv::BlockTransfer load{key, 2};
    EXPECT_EQ((*tiers)->load({&load, 1}, true), std::vector<bool>{false}) << dtype_name(other);
    EXPECT_EQ((*tiers)->stats().disk.blocks, 0) << dtype_name(other);
    EXPECT_EQ((*tiers)->stats().disk.hits, 0) << dtype_name(other);
  }
  std::filesystem::remove_all(dir);
}

TEST(EngineKVCacheSpec, TheTransferDescriptorCarriesEveryGroupsSpec) {
  auto model = load("tiny-gemma3.gguf");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  const KVCache mine(KVLayout::plan(c, 16), 4);
  const kvtransfer::KVDescriptor a = kv_descriptor(c, mine, 0);
  ASSERT_EQ(a.group_specs.size(), static_cast<size_t>(mine.layout().num_groups()));
  // On the wire and back, specs included.
  kvtransfer::Writer w;
  write(w, a);
  kvtransfer::KVDescriptor b;
  kvtransfer::Reader r(w.bytes());
  ASSERT_TRUE(read(r, b));
  EXPECT_EQ(b.group_specs, a.group_specs);
  EXPECT_EQ(a.mismatch(b), std::nullopt);
  for (size_t n = 0; n < w.bytes().size(); ++n) {
    kvtransfer::Reader cut(std::span<const std::byte>(w.bytes().data(), n));
    kvtransfer::KVDescriptor t;
    EXPECT_FALSE(read(cut, t)) << n;
  }
  // A peer whose cache is another dtype is refused, by its dtype first.
  const KVCache q8(KVLayout::plan(c, 16, DType::Q8_0), 4);
  EXPECT_EQ(a.mismatch(kv_descriptor(c, q8, 0)).value_or(""), "KV dtype differs (here 1, peer 8)");
  // A group whose spec alone differs (a kind the common fields do not show).
  kvtransfer::KVDescriptor d = a;
  d.group_specs.back().kind = kv::KVCacheKind::kFullAttention;
  d.group_specs.back().sliding_window = 0;
  const std::string why = a.mismatch(d).value_or("");
  EXPECT_EQ(why.rfind("KV group " + std::to_string(a.group_specs.size() - 1) + " differs (here sliding window", 0), 0u)
      << why;
}

TEST(EngineKVCacheSpec, ARunnerForAKVDTypeTheExecutorDoesNotReadIsRefused) {
  auto model = load("tiny-llama3.gguf");
  ASSERT_TRUE(model);
  ModelRunnerConfig rc;
  rc.kv_cache_bytes = int64_t{1} << 20;
  rc.warm_up = false;
  rc.kv_cache_dtype = DType::Q4_1;
  auto refused = ModelRunner::create(*model, rc);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message,
            "a KV cache of q4_1 is not supported: the CPU attention kernels read f16, bf16, fp8_e4m3, q8_0 and q4_0 "
            "keys and values");
  for (DType t : {DType::F16, DType::Q8_0, DType::Q4_0, DType::BF16, DType::F8_E4M3}) {
    rc.kv_cache_dtype = t;
    auto runner = ModelRunner::create(*model, rc);
    ASSERT_TRUE(runner.ok()) << runner.error().message;
    EXPECT_EQ((*runner)->kv_cache().storage_spec().dtype, t);
    EXPECT_EQ(static_cast<int64_t>((*runner)->kv_cache_bytes()),
              (*runner)->n_blocks() * static_cast<int64_t>(KVCache::block_bytes(model->config(), rc.block_size, t)));
  }
}

}  // namespace
}  // namespace inferd
