// The KV cache dtype as people ask for it (--kv-cache-dtype, llama.cpp's
// --cache-type-k/-v, the Python kv_cache_dtype=): names, aliases and the
// errors for what cannot be had; the tokens a byte budget buys in each dtype;
// an engine refusing a dtype its executor cannot read, naming those it can;
// and an engine on q8_0 holding about 1.9 times f16's tokens in the same
// memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "engine/engine.h"
#include "engine/engine_args.h"
#include "engine/kv_capacity.h"
#include "engine/stats_json.h"
#include "kv/kv_cache_dtype.h"
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

std::string error_of(const EngineArgs& a, EngineArgs::Naming naming = EngineArgs::Naming::kFlag) {
  auto c = a.config(naming);
  return c.ok() ? std::string("(accepted)") : c.error().message;
}

TEST(KVCacheDTypeNames, VllmAndLlamaCppNamesMapToTheirTypes) {
  EXPECT_EQ(*kv::parse_kv_cache_dtype("auto"), DType::F16);
  EXPECT_EQ(*kv::parse_kv_cache_dtype("f16"), DType::F16);
  EXPECT_EQ(*kv::parse_kv_cache_dtype("float16"), DType::F16);
  EXPECT_EQ(*kv::parse_kv_cache_dtype("bf16"), DType::BF16);
  EXPECT_EQ(*kv::parse_kv_cache_dtype("bfloat16"), DType::BF16);
  EXPECT_EQ(*kv::parse_kv_cache_dtype("q8_0"), DType::Q8_0);
  EXPECT_EQ(*kv::parse_kv_cache_dtype("Q4_0"), DType::Q4_0);
  EXPECT_EQ(*kv::parse_kv_cache_dtype("q5_1"), DType::Q5_1);
  EXPECT_EQ(*kv::parse_kv_cache_dtype("iq4_nl"), DType::IQ4_NL);
  for (DType t : kv::kv_cache_dtype_choices())
    EXPECT_EQ(*kv::parse_kv_cache_dtype(kv::kv_cache_dtype_name(t)), t) << kv::kv_cache_dtype_name(t);
  EXPECT_EQ(kv::kv_cache_dtype_names(), "auto, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, f32, fp8_e4m3");
}

TEST(KVCacheDTypeNames, Fp8IsE4m3AndE5m2AndUnknownNamesAreRefused) {
  EXPECT_EQ(*kv::parse_kv_cache_dtype("fp8"), DType::F8_E4M3);  // vLLM's "fp8" is e4m3
  EXPECT_EQ(*kv::parse_kv_cache_dtype("FP8_E4M3"), DType::F8_E4M3);
  auto e5m2 = kv::parse_kv_cache_dtype("fp8_e5m2");
  ASSERT_FALSE(e5m2.ok());
  EXPECT_EQ(e5m2.error().message,
            "KV cache dtype 'fp8_e5m2' is not supported (fp8_e4m3 and q8_0 keep 8 bits a value)");
  for (const char* bad : {"int8", "q8", "", "f16 "}) {
    auto r = kv::parse_kv_cache_dtype(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().message, "unknown KV cache dtype '" + std::string(bad) + "' (expected one of " +
                                     kv::kv_cache_dtype_names() + ")");
  }
}

TEST(EngineArgsKVCacheDType, AutoIsF16AndTheLlamaCppAliasesAgree) {
  EngineArgs a;
  EXPECT_EQ(a.config()->kv_cache_dtype, DType::F16);  // auto
  a.kv_cache_dtype = "q8_0";
  EXPECT_EQ(a.config()->kv_cache_dtype, DType::Q8_0);
  a = EngineArgs{};
  a.cache_type_k = "q4_0";
  a.cache_type_v = "q4_0";
  EXPECT_EQ(a.config()->kv_cache_dtype, DType::Q4_0);
  a.kv_cache_dtype = "q4_0";  // all three naming one dtype
  EXPECT_EQ(a.config()->kv_cache_dtype, DType::Q4_0);
  a = EngineArgs{};
  a.cache_type_k = "q8_0";  // one side alone names the cache's
  EXPECT_EQ(a.config()->kv_cache_dtype, DType::Q8_0);
  a = EngineArgs{};
  a.kv_cache_dtype = "bfloat16";
  a.cache_type_v = "bf16";  // two spellings of one dtype
  EXPECT_EQ(a.config()->kv_cache_dtype, DType::BF16);
}

TEST(EngineArgsKVCacheDType, DifferentKeysAndValuesAreRefusedByName) {
  EngineArgs a;
  a.cache_type_k = "q8_0";
  a.cache_type_v = "f16";
  EXPECT_EQ(error_of(a), "--cache-type-k q8_0 and --cache-type-v f16 differ: keys and values are kept in one dtype");
  a = EngineArgs{};
  a.kv_cache_dtype = "q4_0";
  a.cache_type_k = "q8_0";
  EXPECT_EQ(error_of(a), "--kv-cache-dtype q4_0 and --cache-type-k q8_0 differ: keys and values are kept in one dtype");
  EXPECT_EQ(resolve_kv_cache_dtype("auto", "f16", "q4_0").error().message,
            "--cache-type-k f16 and --cache-type-v q4_0 differ: keys and values are kept in one dtype");
}

TEST(EngineArgsKVCacheDType, UnknownAndFp8NamesNameTheArgumentAsTheFrontEndSpellsIt) {
  EngineArgs a;
  a.kv_cache_dtype = "int4";
  EXPECT_EQ(error_of(a), "--kv-cache-dtype: unknown KV cache dtype 'int4' (expected one of " +
                             kv::kv_cache_dtype_names() + ")");
  EXPECT_EQ(error_of(a, EngineArgs::Naming::kKeyword).rfind("kv_cache_dtype: unknown KV cache dtype 'int4'", 0), 0u);
  a.kv_cache_dtype = "fp8_e5m2";
  EXPECT_EQ(error_of(a).rfind("--kv-cache-dtype: KV cache dtype 'fp8_e5m2' is not supported", 0), 0u)
      << error_of(a);
  a.kv_cache_dtype = "fp8";
  EXPECT_EQ(a.config()->kv_cache_dtype, DType::F8_E4M3);
  a = EngineArgs{};
  a.cache_type_v = "q3_k";
  EXPECT_EQ(error_of(a).rfind("--cache-type-v: unknown KV cache dtype 'q3_k'", 0), 0u) << error_of(a);
}

// The same byte budget in each dtype: q8_0 keeps 34 bytes per 32 values and
// q4_0 18 where f16 keeps 64, so the tokens go up by 64/34 and 64/18, less
// what whole blocks round off.
TEST(KVCapacity, TokensForTheSameBudgetFollowTheDType) {
  auto model = load("tiny-llama3.gguf");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  const int64_t budget = int64_t{64} << 20;
  const KVCapacity f16 = kv_capacity_for_bytes(c, 16, DType::F16, budget);
  const KVCapacity q8 = kv_capacity_for_bytes(c, 16, DType::Q8_0, budget);
  const KVCapacity q4 = kv_capacity_for_bytes(c, 16, DType::Q4_0, budget);
  const size_t f16_token = static_cast<size_t>(c.n_layer * 2 * c.n_head_kv * c.head_dim * 2);
  EXPECT_EQ(f16.bytes_per_token, f16_token);
  EXPECT_EQ(q8.bytes_per_token, f16_token / 64 * 34);
  EXPECT_EQ(q4.bytes_per_token, f16_token / 64 * 18);
  // Whole blocks of 16 tokens, less the reserved null block.
  EXPECT_EQ(f16.blocks, budget / static_cast<int64_t>(16 * f16.bytes_per_token) - 1);
  EXPECT_EQ(f16.tokens, f16.blocks * 16);
  EXPECT_EQ(q8.tokens, (budget / static_cast<int64_t>(16 * q8.bytes_per_token) - 1) * 16);
  const double q8_ratio = static_cast<double>(q8.tokens) / f16.tokens;
  const double q4_ratio = static_cast<double>(q4.tokens) / f16.tokens;
  EXPECT_NEAR(q8_ratio, 64.0 / 34, 0.01);
  EXPECT_NEAR(q4_ratio, 64.0 / 18, 0.02);
  // The bytes the CLI and bench print agree with the spec's.
  EXPECT_EQ(q8.bytes_per_token, KVCache::bytes_per_token(c, DType::Q8_0));
  // bf16 takes f16's two bytes a value, fp8_e4m3 one: the same tokens, and twice.
  const KVCapacity bf16 = kv_capacity_for_bytes(c, 16, DType::BF16, budget);
  const KVCapacity fp8 = kv_capacity_for_bytes(c, 16, DType::F8_E4M3, budget);
  EXPECT_EQ(bf16.bytes_per_token, f16_token);
  EXPECT_EQ(bf16.tokens, f16.tokens);
  EXPECT_EQ(fp8.bytes_per_token, f16_token / 2);
  EXPECT_EQ(fp8.tokens, (budget / static_cast<int64_t>(16 * f16_token / 2) - 1) * 16);
}

// A model with windowed layers has several KV groups: a token takes a slot
// in each group's block, so a block holds fewer tokens than its size says.
TEST(KVCapacity, WindowedModelsCountTokensAcrossTheirGroups) {
  auto model = load("tiny-gemma3.gguf");
  ASSERT_TRUE(model);
  const KVLayout layout = KVLayout::plan(model->config(), 16, DType::Q8_0);
  ASSERT_GT(layout.num_groups(), 1);
  EXPECT_EQ(kv_tokens_for_blocks(layout, 10 * layout.num_groups() + 1), 160);
  EXPECT_EQ(kv_tokens_for_blocks(layout, 0), 0);
  const int64_t budget = int64_t{1} << 20;
  const KVCapacity cap = kv_capacity_for_bytes(model->config(), 16, DType::Q8_0, budget);
  EXPECT_EQ(cap.blocks, budget / static_cast<int64_t>(layout.block_bytes()) - 1);
  EXPECT_EQ(cap.tokens, cap.blocks / layout.num_groups() * 16);
}

EngineConfig small_engine(DType dtype, int64_t bytes) {
  EngineConfig ec;
  ec.kv_cache_dtype = dtype;
  ec.kv_cache_bytes = bytes;
  ec.max_num_seqs = 2;
  ec.max_model_len = 256;
  ec.warm_up = false;
  return ec;
}

TEST(EngineKVCacheDType, AnEngineOfADTypeTheExecutorCannotReadIsRefusedWithTheSupportedOnes) {
  auto model = load("tiny-llama3.gguf");
  ASSERT_TRUE(model);
  const std::vector<DType> supported = supported_kv_cache_dtypes(*model, 16);
  ASSERT_FALSE(supported.empty());
  EXPECT_EQ(supported.front(), DType::F16);
  std::string names;
  for (DType t : supported) names += (names.empty() ? "" : ", ") + kv::kv_cache_dtype_name(t);
  // q5_1 has no attention kernel (nor is one planned with the q8_0/q4_0 ones).
  ASSERT_TRUE(std::find(supported.begin(), supported.end(), DType::Q5_1) == supported.end());
  auto refused = Engine::create(*model, small_engine(DType::Q5_1, int64_t{4} << 20));
  ASSERT_FALSE(refused.ok());
  const std::string& why = refused.error().message;
  EXPECT_EQ(why.rfind("KV cache dtype q5_1 is not supported for this model (", 0), 0u) << why;
  EXPECT_NE(why.find("); supported: " + names), std::string::npos) << why;
  EXPECT_TRUE(check_kv_cache_dtype(*model, DType::F16, 16).ok());
}

TEST(EngineKVCacheDType, TheStatsSayTheDTypeAndTheTokensTheCacheHolds) {
  auto model = load("tiny-llama3.gguf");
  ASSERT_TRUE(model);
  const int64_t budget = int64_t{4} << 20;
  auto engine = Engine::create(*model, small_engine(DType::F16, budget));
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  const EngineStats s = (*engine)->stats();
  const KVCapacity expected = kv_capacity_for_bytes(model->config(), 16, DType::F16, budget);
  EXPECT_EQ(s.kv_cache_dtype, DType::F16);
  EXPECT_EQ(s.kv_total_blocks, expected.blocks);
  EXPECT_EQ(s.kv_capacity_tokens, expected.tokens);
  EXPECT_EQ(s.kv_bytes_per_token, expected.bytes_per_token);
  const nlohmann::json j = engine_stats_json(s);
  EXPECT_EQ(j["kv_cache_dtype"], "f16");
  EXPECT_EQ(j["kv_capacity_tokens"], expected.tokens);
}

// A hybrid model's recurrent states take one f32 slot per running request
// (and the cache's spare one) from the budget before its blocks; the stats,
// their JSON and kv_capacity_for_bytes say so.
TEST(EngineKVCacheDType, AHybridModelsStatsCountItsStateSlotsOutOfTheBudget) {
  auto model = load("tiny-qwen35.gguf");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  ASSERT_TRUE(c.has_recurrent_layers());
  // The sizes from the file's ssm hyper-parameters: per recurrent layer, the
  // convolution's last kernel - 1 inputs and a head_size^2 matrix per value head.
  const DeltaNetConfig& d = c.delta_net;
  const int64_t per_layer = (d.conv_kernel - 1) * (2 * d.n_k_heads + d.n_v_heads) * d.head_size +
                            d.n_v_heads * d.head_size * d.head_size;
  const size_t per_sequence = static_cast<size_t>(c.n_recurrent_layers() * per_layer * 4);
  const int64_t budget = int64_t{4} << 20;
  EngineConfig ec = small_engine(DType::F16, budget);
  ec.max_num_seqs = 5;
  ec.state_snapshots = 7;
  auto engine = Engine::create(*model, ec);
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  const EngineStats s = (*engine)->stats();
  EXPECT_EQ(s.kv_state_slots, 5);
  EXPECT_EQ(s.kv_state_snapshots, 7);
  EXPECT_EQ(s.kv_state_snapshots_cached, 0);
  EXPECT_EQ(s.kv_state_checkpoints, 0);
  EXPECT_EQ(s.kv_state_bytes_per_sequence, per_sequence);
  // 5 running, 7 snapshots and the spare slot.
  EXPECT_EQ(s.kv_state_bytes, static_cast<int64_t>(13 * per_sequence));
  const int64_t block_bytes = static_cast<int64_t>(KVCache::block_bytes(c, 16, DType::F16));
  EXPECT_EQ(s.kv_total_blocks, (budget - s.kv_state_bytes) / block_bytes - 1);
  const KVCapacity cap = kv_capacity_for_bytes(c, 16, DType::F16, budget, 5 + 7);
  EXPECT_EQ(cap.blocks, s.kv_total_blocks);
  EXPECT_EQ(cap.tokens, s.kv_capacity_tokens);
  EXPECT_EQ(cap.state_bytes, s.kv_state_bytes);
  EXPECT_EQ(cap.state_bytes_per_sequence, per_sequence);
  const nlohmann::json j = engine_stats_json(s);
  EXPECT_EQ(j["kv_state_slots"], 5);
  EXPECT_EQ(j["kv_state_snapshots"], 7);
  EXPECT_EQ(j["kv_state_bytes"], s.kv_state_bytes);
  // Prefix caching stays on beside recurrent layers (through the snapshots)...
  EXPECT_TRUE((*engine)->config().enable_prefix_caching);
  // ...unless there are none; n-gram speculation adds a checkpoint per
  // running slot, or k of them with per-position states.
  ec.state_snapshots = 0;
  ec.speculative.method = SpeculativeConfig::Method::kNgram;
  ec.speculative.num_speculative_tokens = 3;
  auto spec = Engine::create(*model, ec);
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_FALSE((*spec)->config().enable_prefix_caching);
  EXPECT_EQ((*spec)->stats().kv_state_checkpoints, 5);
  EXPECT_EQ((*spec)->stats().kv_state_bytes, static_cast<int64_t>(11 * per_sequence));
  ec.speculative.state_rollback = SpeculativeConfig::StateRollback::kPerPosition;
  auto per_position = Engine::create(*model, ec);
  ASSERT_TRUE(per_position.ok()) << per_position.error().message;
  EXPECT_EQ((*per_position)->stats().kv_state_checkpoints, 5 * 3);
  EXPECT_EQ((*per_position)->stats().kv_state_bytes, static_cast<int64_t>((5 + 15 + 1) * per_sequence));
  // Other models have no slots.
  auto llama = load("tiny-llama3.gguf");
  ASSERT_TRUE(llama);
  const KVCapacity none = kv_capacity_for_bytes(llama->config(), 16, DType::F16, budget, 5);
  EXPECT_EQ(none.state_slots, 0);
  EXPECT_EQ(none.state_bytes, 0);
}

// A Mamba-2 hybrid's recurrent states take the same state slots (no cache of
// their own), sized from its ssm hyper-parameters; its MLP-only layers keep
// neither keys nor state, so only its attention layers count per token.
TEST(EngineKVCacheDType, AMamba2HybridsStateSlotsAndKeysCountOnlyTheLayersThatKeepThem) {
  auto model = load("tiny-nemotron-h.gguf");
  ASSERT_TRUE(model);
  const ModelConfig& c = model->config();
  ASSERT_TRUE(c.has_recurrent_layers());
  int64_t n_attention = 0, n_mlp = 0;
  for (const LayerConfig& l : c.layers) n_attention += l.keeps_kv(), n_mlp += l.ffn_only;
  ASSERT_EQ(c.n_recurrent_layers(), 3);
  ASSERT_EQ(n_attention, 2);
  ASSERT_EQ(n_mlp, 3);
  // Per Mamba-2 layer: the convolution's last kernel - 1 inputs of x, B and C,
  // and d_state values per inner channel.
  const Mamba2Config& m = c.mamba2;
  const int64_t per_layer = (m.conv_kernel - 1) * (m.inner + 2 * m.n_groups * m.d_state) + m.inner * m.d_state;
  const size_t per_sequence = static_cast<size_t>(3 * per_layer * 4);
  const int64_t budget = int64_t{4} << 20;
  EngineConfig ec = small_engine(DType::F16, budget);
  ec.max_num_seqs = 3;
  ec.state_snapshots = 2;  // prefix caching's snapshots take slots of the same size
  auto engine = Engine::create(*model, ec);
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  const EngineStats s = (*engine)->stats();
  EXPECT_EQ(s.kv_state_slots, 3);
  EXPECT_EQ(s.kv_state_snapshots, 2);
  EXPECT_EQ(s.kv_state_bytes_per_sequence, per_sequence);
  // 3 running, 2 snapshots and the spare slot.
  EXPECT_EQ(s.kv_state_bytes, static_cast<int64_t>(6 * per_sequence));
  // f16 keys and values of the 2 attention layers' KV heads.
  EXPECT_EQ(s.kv_bytes_per_token, static_cast<size_t>(2 * 2 * c.n_head_kv * c.head_dim * 2));
  const KVCapacity cap = kv_capacity_for_bytes(c, 16, DType::F16, budget, 3 + 2);
  EXPECT_EQ(cap.blocks, s.kv_total_blocks);
  EXPECT_EQ(cap.state_bytes, s.kv_state_bytes);
}

// The CPU executor reads q8_0 keys and values (kernels/cpu/attention_quant.h).
TEST(EngineKVCacheDType, AQ8_0EngineRunsAndHoldsAbout1_9TimesTheTokensOfF16) {
  auto model = load("tiny-llama3.gguf");
  ASSERT_TRUE(model);
  const Status readable = check_kv_cache_dtype(*model, DType::Q8_0, 16);
  ASSERT_TRUE(readable.ok()) << readable.error().message;
  const int64_t budget = int64_t{4} << 20;
  auto f16 = Engine::create(*model, small_engine(DType::F16, budget));
  auto q8 = Engine::create(*model, small_engine(DType::Q8_0, budget));
  ASSERT_TRUE(f16.ok()) << f16.error().message;
  ASSERT_TRUE(q8.ok()) << q8.error().message;
  const EngineStats a = (*f16)->stats(), b = (*q8)->stats();
  EXPECT_EQ(b.kv_cache_dtype, DType::Q8_0);
  EXPECT_NEAR(static_cast<double>(b.kv_capacity_tokens) / a.kv_capacity_tokens, 64.0 / 34, 0.02);
  GenerationParams p;
  p.prompt_token_ids = {1, 20, 30, 40, 50, 60, 70, 80, 90, 100};
  p.max_tokens = 8;
  p.ignore_eos = true;
  p.sampling.temperature = 0.0f;
  auto h = (*q8)->add_request(p);
  ASSERT_TRUE(h.ok()) << h.error().message;
  RequestOutput all;
  while (!all.finished) {
    (*q8)->step();
    while (auto out = h->stream->try_next()) accumulate(all, std::move(*out));
  }
  EXPECT_TRUE(all.error.empty()) << all.error;
  EXPECT_EQ(all.token_ids.size(), 8u);
}

}  // namespace
}  // namespace inferd
