// Shared pieces of the engine tests that run the default model: loading it
// once per test program, random prompts, the run-alone reference, and
// driving an engine synchronously until it is idle.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/sequence_generator.h"
#include "structured/grammar.h"
#include "test_data.h"

namespace inferd::test {

inline std::string model_path() {
  const char* d = std::getenv("INFERD_MODEL_DIR");
  const char* home = std::getenv("HOME");
  const std::string dir =
      d && *d ? d : std::string(home ? home : ".") + "/.cache/inferd/models";
  return dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

// The directory of the downloaded models: INFERD_MODEL_DIR, default ~/.cache/inferd/models.
inline std::string model_dir() {
  const char* d = std::getenv("INFERD_MODEL_DIR");
  const char* home = std::getenv("HOME");
  return d && *d ? d : std::string(home ? home : ".") + "/.cache/inferd/models";
}

// A model file by name: in model_dir(), else among the small models committed
// under tests/data/models/ (tools/reference/make_tiny_models.py); "" if neither has it.
inline std::string find_model_file(const std::string& file) {
  for (const std::string& dir : {model_dir(), inferd::test::test_data_root() + "/models"}) {
    const std::string path = dir + "/" + file;
    if (std::ifstream(path).good()) return path;
  }
  return "";
}

// The full-size models beside the default one (Gemma 3 270M, Qwen2.5-Coder-0.5B
// and -1.5B: files over 200 MiB) take minutes a test on a 2-core machine, so
// CI (scripts/test.sh, which sets INFERD_TEST_LARGE_MODELS=0 unless given
// --large-models) leaves their forward passes out; run directly, a test binary
// runs them. Returns why a test of the model at `path` skips, or "".
inline std::string large_model_skip(const std::string& path) {
  constexpr std::uintmax_t kLargeModelBytes = 200ull << 20;
  const char* run = std::getenv("INFERD_TEST_LARGE_MODELS");
  if (!run || std::string(run) != "0") return "";
  std::error_code ec;
  const std::uintmax_t bytes = std::filesystem::file_size(path, ec);
  if (ec || bytes <= kLargeModelBytes) return "";
  return path + " is a large model: INFERD_TEST_LARGE_MODELS=0 leaves it out (scripts/test.sh --large-models runs it)";
}

// tests/data/logits/: one directory of llama.cpp reference data per model
// (tools/reference/logits_reference.py).
inline std::string logits_root() { return inferd::test::test_data_root() + "/logits"; }

// The directories of logits_root() that hold `file`, sorted.
inline std::vector<std::string> logits_dirs_with(const std::string& file) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const std::filesystem::directory_entry& e : std::filesystem::directory_iterator(logits_root(), ec))
    if (e.is_directory() && std::filesystem::exists(e.path() / file)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A JSON file, or null (and a test failure naming it) when it is missing.
inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "missing " << path;
    return nlohmann::json();
  }
  return nlohmann::json::parse(in);
}

// Greedy decoding of n_tokens after one fresh prefill of the whole prompt, as
// llama.cpp's reference runs computed them (so the first token comes from the
// prefill's logits, left in `prompt_logits`); the end of generation does not stop it.
inline Result<std::vector<int32_t>> fresh_greedy(Model& model, int64_t max_context, const std::vector<int32_t>& ids,
                                                 int64_t n_tokens, std::vector<float>& prompt_logits) {
  GenerationOptions o;
  o.max_tokens = n_tokens;
  o.sampling.temperature = 0.0f;
  o.stop_at_end_of_generation = false;
  o.prompt_logits = &prompt_logits;
  SequenceGenerator fresh(model, max_context);
  return fresh.generate(ids, o, [](int32_t) { return true; });
}

class ModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (model_ || !std::ifstream(model_path())) return;
    auto m = Model::load(model_path(), load_options());
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = std::move(*m).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    model_file_.clear();
    kv_dtype_ = kv::kDefaultKVCacheDType;
    skip_sliding_window_ = false;
  }
  // Makes `file` (looked up by find_model_file) the model the helpers below
  // use, loading it unless it already is; a parametrized suite calls it from
  // SetUp. Fails the test when the file is missing.
  // numerics: the kernels' tier the model is loaded with (kernels/cpu/numerics.h).
  // flavour: whose GGML build's rounding it reproduces, for data made by one
  // llama.cpp build (by default this CPU's, kernels::native_ggml_flavour()).
  static void use_model(const std::string& file, kernels::Numerics numerics = kernels::Numerics::kExact,
                        kernels::GgmlFlavour flavour = kernels::native_ggml_flavour()) {
    if (model_ && model_file_ == file && model_numerics_ == numerics && model_flavour_ == flavour) return;
    model_numerics_ = numerics;
    model_flavour_ = flavour;
    const std::string path = find_model_file(file);
    ASSERT_FALSE(path.empty()) << file << " not found in " << model_dir() << " nor in " << inferd::test::test_data_root()
                               << "/models: run scripts/fetch_models.sh --all";
    // From SetUp, the skip keeps the body from running; a body that calls
    // use_model itself checks IsSkipped().
    if (const std::string why = large_model_skip(path); !why.empty()) GTEST_SKIP() << why;
    auto m = Model::load(path, load_options());
    ASSERT_TRUE(m.ok()) << m.error().message;
    delete model_;
    model_ = std::move(*m).release();
    model_file_ = file;
  }
  // Every model a suite loads runs on 2 threads, whatever the machine has.
  static LoadOptions load_options() {
    LoadOptions o;
    o.prefault = false;
    o.n_threads = 2;
    o.numerics = model_numerics_;
    o.ggml_flavour = model_flavour_;
    return o;
  }
  // The KV cache dtype of the engines and the run-alone reference below (a
  // parametrized suite sets it from SetUp; F16 unless set).
  // skip_sliding_window: those layers' in f16 (--kv-cache-dtype-skip-layers).
  static void use_kv_dtype(DType dtype, bool skip_sliding_window = false) {
    kv_dtype_ = dtype;
    skip_sliding_window_ = skip_sliding_window;
  }
  void SetUp() override {
    if (!model_)
      GTEST_SKIP() << "default model not found at " << model_path()
                   << " (set INFERD_MODEL_DIR or run scripts/fetch_models.sh)";
  }

  // Random ordinary (non-control) token ids, like a benchmark's random prompts.
  static std::vector<int32_t> random_prompt(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    const Tokenizer& tok = model_->tokenizer();
    std::uniform_int_distribution<int32_t> dist(0, tok.n_vocab() - 1);
    std::vector<int32_t> p;
    while (static_cast<int64_t>(p.size()) < n) {
      const int32_t t = dist(rng);
      if (!tok.is_control(t) && !tok.is_eog(t)) p.push_back(t);
    }
    return p;
  }

  // The request run alone by the single-sequence generator, never stopping early.
  static std::vector<int32_t> run_alone(const std::vector<int32_t>& prompt, int64_t max_tokens,
                                        const SamplingParams& sampling = greedy()) {
    SequenceGenerator gen(*model_, static_cast<int64_t>(prompt.size()) + max_tokens, kv_dtype_, skip_sliding_window_);
    GenerationOptions o;
    o.max_tokens = max_tokens;
    o.sampling = sampling;
    o.stop_at_end_of_generation = false;
    auto out = gen.generate(prompt, o, [](int32_t) { return true; });
    EXPECT_TRUE(out.ok()) << out.error().message;
    return out.ok() ? *out : std::vector<int32_t>{};
  }

  static SamplingParams greedy() {
    SamplingParams p;
    p.temperature = 0.0f;
    return p;
  }

  // The KV layout of the engines above (their dtype and skipped layers).
  static KVLayout kv_layout(int32_t block_size = 16) {
    return KVLayout::plan(model_->config(), block_size, kv_dtype_, skip_sliding_window_);
  }

  // The KV blocks one request of n_tokens holds at most on this model (every
  // KV group counted), in steps of at most max_step_tokens.
  static int64_t blocks_held_alone(int64_t n_tokens, int64_t max_step_tokens, int32_t block_size = 16) {
    const KVLayout layout = kv_layout(block_size);
    kv::KVCacheConfig c{.n_blocks = 2, .block_size = block_size, .group_windows = layout.group_windows};
    return kv::max_blocks_held(c, n_tokens, max_step_tokens);
  }

  // A KV budget of exactly n_blocks blocks (the reserved one included).
  static int64_t kv_bytes_for_blocks(int64_t n_blocks, int64_t block_size = 16) {
    return n_blocks * static_cast<int64_t>(KVCache::block_bytes(model_->config(), block_size, kv_dtype_, skip_sliding_window_));
  }

  // A model with recurrent layers: the bytes of the state slots an engine of
  // this config takes from its KV budget before its blocks (running
  // requests', speculation's checkpoints, the prefix cache's snapshots and the
  // cache's spare one); 0 for other models.
  static int64_t state_slots_bytes(const EngineConfig& c) {
    const KVLayout layout = kv_layout();
    if (layout.n_state_layers == 0) return 0;
    const kv::KVCacheConfig k{.enable_prefix_caching = c.enable_prefix_caching,
                              .n_state_slots = c.max_num_seqs,
                              .n_state_snapshots = c.state_snapshots,
                              .state_checkpoints = c.speculative.state_checkpoints()};
    return int64_t{kv::state_slots_in_cache(k) + 1} * static_cast<int64_t>(layout.state_slot_bytes());
  }

  // n_blocks of KV blocks (the reserved one included) beside the state slots.
  static EngineConfig engine_config(int64_t budget, int32_t max_seqs, int64_t n_blocks,
                                    bool prefix_caching = true) {
    EngineConfig c;
    c.max_num_batched_tokens = budget;
    c.max_num_seqs = max_seqs;
    c.kv_cache_dtype = kv_dtype_;
    c.kv_cache_skip_sliding_window = skip_sliding_window_;
    c.enable_prefix_caching = prefix_caching;
    c.kv_cache_bytes = kv_bytes_for_blocks(n_blocks) + state_slots_bytes(c);
    return c;
  }

  static std::unique_ptr<Engine> make_engine(const EngineConfig& c) {
    auto e = Engine::create(*model_, c);
    EXPECT_TRUE(e.ok()) << e.error().message;
    return e.ok() ? std::move(*e) : nullptr;
  }

  static GenerationParams request(std::vector<int32_t> prompt, int64_t max_tokens,
                                  const SamplingParams& sampling = greedy()) {
    GenerationParams p;
    p.prompt_token_ids = std::move(prompt);
    p.max_tokens = max_tokens;
    p.sampling = sampling;
    p.ignore_eos = true;
    return p;
  }

  static std::string add(Engine& e, GenerationParams p) {
    auto h = e.add_request(std::move(p));
    EXPECT_TRUE(h.ok()) << h.error().message;
    return h.ok() ? h->request_id : std::string();
  }

  inline static Model* model_ = nullptr;
  inline static std::string model_file_;  // set by use_model
  inline static kernels::Numerics model_numerics_ = kernels::Numerics::kExact;  // set by use_model
  inline static kernels::GgmlFlavour model_flavour_ = kernels::native_ggml_flavour();  // set by use_model
  inline static DType kv_dtype_ = kv::kDefaultKVCacheDType;  // set by use_kv_dtype
  inline static bool skip_sliding_window_ = false;           // set by use_kv_dtype
};

// A ModelTest with one grammar compiler for the suite's model (structured
// output and reasoning tests).
class GrammarModelTest : public ModelTest {
 protected:
  void SetUp() override {
    ModelTest::SetUp();
    if (IsSkipped()) return;
    if (!compiler_) {
      auto gt = GrammarTokenizer::create(model_->tokenizer());
      ASSERT_TRUE(gt.ok()) << gt.error().message;
      compiler_ = new GrammarCompiler(*gt);
    }
  }
  static void TearDownTestSuite() {
    delete compiler_;
    compiler_ = nullptr;
    ModelTest::TearDownTestSuite();
  }

  static std::shared_ptr<const CompiledGrammar> compile(GrammarKind kind, const std::string& text) {
    auto g = compiler_->compile(kind, text);
    EXPECT_TRUE(g.ok()) << g.error().message;
    return g.ok() ? *g : nullptr;
  }

  inline static GrammarCompiler* compiler_ = nullptr;
};

// Everything a request emitted, joined.
struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<RequestOutput> deltas;
  bool finished = false;
  RequestOutput final_output;  // valid when finished
};

struct Outputs {
  std::map<std::string, Collected> requests;
  int64_t steps = 0;

  void record(const std::vector<RequestOutput>& outputs) {
    for (const RequestOutput& o : outputs) {
      Collected& c = requests[o.request_id];
      EXPECT_FALSE(c.finished) << "request " << o.request_id << " emitted after finishing";
      c.tokens.insert(c.tokens.end(), o.token_ids.begin(), o.token_ids.end());
      c.text += o.text;
      c.deltas.push_back(o);
      if (o.finished) {
        c.finished = true;
        c.final_output = o;
      }
    }
  }
};

// One synchronous step, checking the scheduler's and KV cache's invariants.
inline void step(Engine& e, Outputs& run) {
  run.record(e.step());
  ++run.steps;
  Status st = e.check_invariants();
  EXPECT_TRUE(st.ok()) << st.error().message;
}

inline void run_until_idle(Engine& e, Outputs& run, int64_t max_steps = 100000) {
  for (int64_t i = 0; i < max_steps && e.has_pending_work(); ++i) {
    step(e, run);
    if (testing::Test::HasFailure()) return;
  }
  EXPECT_FALSE(e.has_pending_work()) << "requests did not finish in " << max_steps << " steps";
}

// Idle engine: no request holds a block.
inline void expect_idle_and_clean(const Engine& e) {
  const EngineStats s = e.stats();
  EXPECT_EQ(s.scheduler.num_running, 0);
  EXPECT_EQ(s.scheduler.num_waiting, 0);
  EXPECT_EQ(s.scheduler.kv_used_blocks, 0);
  EXPECT_EQ(s.scheduler.kv_free_blocks, s.kv_total_blocks);
  Status st = e.check_invariants();
  EXPECT_TRUE(st.ok()) << st.error().message;
}

// A parametrized suite's test name for a model file: "gemma-3.gguf" -> "gemma_3".
inline std::string model_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param.substr(0, info.param.find(".gguf"));
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
}

}  // namespace inferd::test
