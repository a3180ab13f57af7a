// KV offload tiers on the default model: a multi-turn chat workload whose
// working set is several times the KV pool gets its earlier turns back from
// the host and disk tiers (their stats show it) with the same greedy tokens
// as without tiers; an engine started again on the same disk path finds the
// old prefixes; another KV layout never sees them; a latent cache's blocks
// come back too.
#include <unistd.h>

#include <filesystem>

#include "engine_test_util.h"

namespace inferd {
namespace {

namespace fs = std::filesystem;

class EngineKVOffload : public test::ModelTest {
 protected:
  void SetUp() override {
    test::ModelTest::SetUp();
    dir_ = (fs::temp_directory_path() / ("inferd_engine_kv_offload_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static constexpr int kConversations = 8;
  static constexpr int kTurns = 3;
  static constexpr int64_t kPoolBlocks = 40;  // 624 tokens; the conversations reach ~8 x 330

  struct Run {
    std::vector<std::vector<int32_t>> outputs;  // per turn, per conversation
    EngineStats stats;
  };

  // Each turn of each conversation is its previous prompt, its answer and a
  // new user message; the turns go round the conversations, so by the time a
  // conversation comes back its blocks have left the pool.
  Run chat(EngineConfig config) {
    auto engine = make_engine(config);
    Run run;
    if (!engine) return run;
    std::vector<std::vector<int32_t>> history(kConversations);
    for (int turn = 0; turn < kTurns; ++turn) {
      for (int c = 0; c < kConversations; ++c) {
        const std::vector<int32_t> user = random_prompt(turn == 0 ? 60 : 40, 1000 * turn + c);
        history[c].insert(history[c].end(), user.begin(), user.end());
        test::Outputs out;
        const std::string id = add(*engine, request(history[c], 16));
        test::run_until_idle(*engine, out);
        const std::vector<int32_t>& answer = out.requests[id].tokens;
        run.outputs.push_back(answer);
        history[c].insert(history[c].end(), answer.begin(), answer.end());
      }
    }
    test::expect_idle_and_clean(*engine);
    run.stats = engine->stats();
    return run;
  }

  EngineConfig config() const { return engine_config(512, 4, kPoolBlocks); }

  std::string dir_;
};

// The reference is the same workload on a pool large enough to keep every
// block: tiers must give back exactly what that pool would still hold. (A
// small pool without tiers computes the earlier answers' tokens again as
// prompt, in prefill-shaped passes, while a kept block holds them as the
// decode steps computed them; the two may differ in the last bits.)
TEST_F(EngineKVOffload, TiersGiveBackEvictedTurnsWithTheSameTokens) {
  const Run reference = chat(engine_config(512, 4, 400));
  ASSERT_EQ(reference.outputs.size(), static_cast<size_t>(kConversations * kTurns));
  EXPECT_EQ(reference.stats.scheduler.prefix_cache.external_hit_tokens, 0);

  EngineConfig host = config();
  host.offload.host_bytes = kv_bytes_for_blocks(400);
  const Run with_host = chat(host);
  EXPECT_EQ(with_host.outputs, reference.outputs);
  EXPECT_EQ(with_host.stats.computed_prompt_tokens, reference.stats.computed_prompt_tokens);
  EXPECT_TRUE(with_host.stats.offload.host_enabled);
  EXPECT_GT(with_host.stats.offload.host.hits, 0);
  EXPECT_GT(with_host.stats.offload.host.saves, 0);
  EXPECT_GT(with_host.stats.scheduler.prefix_cache.external_hit_tokens, 0);

  // Both tiers, the host one smaller than the working set: loads from each.
  EngineConfig both = config();
  both.offload.disk_path = dir_;
  both.offload.disk_bytes = kv_bytes_for_blocks(400) * 2;
  both.offload.host_bytes = kv_bytes_for_blocks(30);
  const Run with_both = chat(both);
  EXPECT_EQ(with_both.outputs, reference.outputs);
  EXPECT_EQ(with_both.stats.computed_prompt_tokens, reference.stats.computed_prompt_tokens);
  EXPECT_GT(with_both.stats.offload.host.hits, 0);
  EXPECT_GT(with_both.stats.offload.disk.hits, 0);
  EXPECT_GT(with_both.stats.offload.disk.saves, 0);
  EXPECT_EQ(with_both.stats.offload.disk.dropped, 0);
  EXPECT_GT(with_both.stats.offload.host.evictions, 0);
  EXPECT_LE(with_both.stats.offload.host.bytes, both.offload.host_bytes);
}

TEST_F(EngineKVOffload, ARestartedEngineFindsItsPrefixesOnDisk) {
  EngineConfig disk = config();
  disk.offload.disk_path = dir_;
  disk.offload.disk_bytes = kv_bytes_for_blocks(400) * 2;
  std::vector<int32_t> prompt = random_prompt(200, 77);
  std::vector<int32_t> first;
  {
    auto engine = make_engine(disk);
    ASSERT_TRUE(engine);
    test::Outputs out;
    const std::string id = add(*engine, request(prompt, 16));
    test::run_until_idle(*engine, out);
    first = out.requests[id].tokens;
    // Other prompts push its blocks out of the pool (and to disk).
    for (int k = 0; k < 6; ++k) add(*engine, request(random_prompt(150, 300 + k), 4));
    test::run_until_idle(*engine, out);
  }  // the engine's end writes what is queued
  auto engine = make_engine(disk);
  ASSERT_TRUE(engine);
  EXPECT_GT(engine->stats().offload.disk.blocks, 0);
  test::Outputs out;
  const std::string id = add(*engine, request(prompt, 16));
  test::run_until_idle(*engine, out);
  EXPECT_EQ(out.requests[id].tokens, first);
  const EngineStats s = engine->stats();
  EXPECT_EQ(s.scheduler.prefix_cache.external_hit_tokens, 192);  // 12 full blocks of the 200 tokens
  EXPECT_EQ(s.offload.disk.hits, 12);
  EXPECT_EQ(s.computed_prompt_tokens, 8);

  // Another KV layout (block size) has another fingerprint: nothing is found.
  EngineConfig other = disk;
  other.block_size = 32;
  other.kv_cache_bytes = kv_bytes_for_blocks(kPoolBlocks, 32);
  auto engine32 = make_engine(other);
  ASSERT_TRUE(engine32);
  EXPECT_EQ(engine32->stats().offload.disk.blocks, 0);
}

TEST_F(EngineKVOffload, RefusesTiersWithoutPrefixCaching) {
  EngineConfig c = config();
  c.enable_prefix_caching = false;
  c.offload.host_bytes = 1 << 20;
  auto e = Engine::create(*model_, c);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("prefix caching"), std::string::npos);
}

// A latent cache (tiny-deepseek2: one latent + RoPE key a token and layer,
// no values) goes out to the host tier and back as its blocks' bytes. Last in
// the suite: it leaves that model loaded.
TEST_F(EngineKVOffload, LatentCacheBlocksComeBackFromTheHostTier) {
  use_model("tiny-deepseek2.gguf");
  EXPECT_EQ(KVLayout::plan(model_->config(), 16).storage_spec().kind, kv::KVCacheKind::kLatent);
  const Run reference = chat(engine_config(512, 4, 400));
  EngineConfig host = config();
  host.offload.host_bytes = kv_bytes_for_blocks(400);
  const Run with_host = chat(host);
  EXPECT_EQ(with_host.outputs, reference.outputs);
  EXPECT_EQ(with_host.stats.computed_prompt_tokens, reference.stats.computed_prompt_tokens);
  EXPECT_GT(with_host.stats.offload.host.hits, 0);
  EXPECT_GT(with_host.stats.scheduler.prefix_cache.external_hit_tokens, 0);
}

}  // namespace
}  // namespace inferd
