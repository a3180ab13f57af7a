// Structured outputs in the engine, on the default model (SmolLM2-135M, a
// 49152-token vocabulary): constrained generation whose output parses and
// validates, greedy and sampled; every token allowed by the grammar where it
// was sampled; constrained and unconstrained requests in the same steps;
// max_tokens ("length"), stop strings, logprobs of the constrained
// distribution; preemption and recompute; and the mask's cost per step.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "engine_test_util.h"
#include "structured/grammar.h"

namespace inferd {
namespace {

using test::Collected;
using test::Outputs;
using json = nlohmann::json;

// A person: nested object, bounded integer, enum, array with min/max items,
// an optional field that may be null, a string pattern.
const char* kPersonSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user", "guest"]},
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "minItems": 1, "maxItems": 3},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"],
                "additionalProperties": false},
    "email": {"anyOf": [{"type": "string", "maxLength": 30}, {"type": "null"}]}
  },
  "required": ["name", "age", "role", "tags", "address"],
  "additionalProperties": false
})";

// The schema above, checked by hand (no JSON-schema validator in C++ here).
void expect_valid_person(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    FAIL() << "not JSON: " << e.what() << "\n" << text;
  }
  ASSERT_TRUE(j.is_object()) << text;
  for (const char* key : {"name", "age", "role", "tags", "address"}) ASSERT_TRUE(j.contains(key)) << key << " in " << text;
  for (const auto& [key, v] : j.items())
    EXPECT_TRUE(key == "name" || key == "age" || key == "role" || key == "tags" || key == "address" || key == "email")
        << key;
  ASSERT_TRUE(j["name"].is_string());
  EXPECT_LE(j["name"].get<std::string>().size(), 24u * 4);  // maxLength counts characters
  ASSERT_TRUE(j["age"].is_number_integer()) << text;
  EXPECT_GE(j["age"].get<int64_t>(), 0);
  EXPECT_LE(j["age"].get<int64_t>(), 120);
  const std::string role = j["role"].get<std::string>();
  EXPECT_TRUE(role == "admin" || role == "user" || role == "guest") << role;
  ASSERT_TRUE(j["tags"].is_array());
  EXPECT_GE(j["tags"].size(), 1u);
  EXPECT_LE(j["tags"].size(), 3u);
  for (const json& t : j["tags"]) {
    ASSERT_TRUE(t.is_string());
    const std::string s = t.get<std::string>();
    EXPECT_TRUE(!s.empty() && s.size() <= 8 && s.find_first_not_of("abcdefghijklmnopqrstuvwxyz") == std::string::npos) << s;
  }
  const json& a = j["address"];
  ASSERT_TRUE(a.is_object() && a.size() == 2 && a.contains("city") && a.contains("zip")) << a.dump();
  const std::string zip = a["zip"].get<std::string>();
  EXPECT_TRUE(zip.size() == 5 && zip.find_first_not_of("0123456789") == std::string::npos) << zip;
  if (j.contains("email")) EXPECT_TRUE(j["email"].is_null() || j["email"].is_string());
}

class EngineStructured : public test::GrammarModelTest {
 protected:
  static std::vector<int32_t> prompt(const std::string& text) {
    return model_->tokenizer().encode(text, /*add_special=*/true, /*parse_special=*/true);
  }

  static GenerationParams constrained(const std::vector<int32_t>& p, std::shared_ptr<const CompiledGrammar> g,
                                      int64_t max_tokens, const SamplingParams& s = greedy()) {
    GenerationParams gp = request(p, max_tokens, s);
    gp.ignore_eos = false;
    gp.grammar = std::move(g);
    return gp;
  }

  // Replays `tokens` through a fresh matcher: each must be allowed by the mask
  // of its step. Returns the matcher at the end.
  static std::unique_ptr<GrammarMatcher> replay(const std::shared_ptr<const CompiledGrammar>& g,
                                                const std::vector<int32_t>& tokens) {
    auto m = g->new_matcher();
    EXPECT_TRUE(m.ok());
    if (!m.ok()) return nullptr;
    for (size_t i = 0; i < tokens.size(); ++i) {
      auto mask = (*m)->compute_mask();
      EXPECT_TRUE(mask.ok()) << mask.error().message;
      if (!mask.ok()) return nullptr;
      EXPECT_TRUE(token_allowed(*mask, tokens[i])) << "token " << i << " (id " << tokens[i] << ") is not allowed";
      EXPECT_TRUE((*m)->commit(tokens[i]).ok());
    }
    return std::move(*m);
  }

};

const char* kPersonPrompt =
    "<|im_start|>user\nDescribe a person as a JSON object.<|im_end|>\n<|im_start|>assistant\n";

TEST_F(EngineStructured, JsonSchemaOutputParsesAndValidatesGreedyAndSampled) {
  auto g = compile(GrammarKind::kJsonSchema, kPersonSchema);
  ASSERT_TRUE(g);
  auto engine = make_engine(engine_config(256, 8, 256));
  ASSERT_TRUE(engine);
  const std::vector<int32_t> p = prompt(kPersonPrompt);
  std::vector<std::string> ids;
  ids.push_back(add(*engine, constrained(p, g, 250)));
  for (uint64_t seed : {1, 2, 3}) {
    SamplingParams s;
    s.temperature = 1.0f;
    s.top_p = 0.95f;
    s.top_k = 50;
    s.min_p = 0.01f;
    s.repetition_penalty = 1.1f;
    s.presence_penalty = 0.5f;
    s.seed = seed;
    ids.push_back(add(*engine, constrained(p, g, 250, s)));
  }
  Outputs run;
  test::run_until_idle(*engine, run);
  test::expect_idle_and_clean(*engine);
  for (const std::string& id : ids) {
    const Collected& c = run.requests[id];
    ASSERT_TRUE(c.finished);
    EXPECT_EQ(c.final_output.status, RequestStatus::kFinishedStopped) << c.text;
    expect_valid_person(c.text);
    auto m = replay(g, c.tokens);
    ASSERT_TRUE(m);
    EXPECT_TRUE(m->is_stopped());
  }
  std::printf("greedy: %s\n", run.requests[ids[0]].text.c_str());
}

TEST_F(EngineStructured, ConstrainedAndUnconstrainedRequestsShareStepsWithoutInterfering) {
  auto g = compile(GrammarKind::kJsonSchema, kPersonSchema);
  auto engine = make_engine(engine_config(128, 8, 256));
  const std::vector<int32_t> p = prompt(kPersonPrompt);
  const std::vector<int32_t> plain = random_prompt(40, 5);
  // n = 3 choices of one request: one compiled grammar, a matcher each.
  std::vector<std::string> choices;
  for (uint64_t k = 0; k < 3; ++k) {
    SamplingParams s;
    s.temperature = 0.8f;
    s.seed = 100 + k;
    choices.push_back(add(*engine, constrained(p, g, 250, s)));
  }
  const std::string unconstrained = add(*engine, request(plain, 20));
  Outputs run;
  test::run_until_idle(*engine, run);
  for (const std::string& id : choices) {
    EXPECT_EQ(run.requests[id].final_output.status, RequestStatus::kFinishedStopped);
    expect_valid_person(run.requests[id].text);
  }
  EXPECT_EQ(run.requests[unconstrained].tokens, run_alone(plain, 20));
  // A constrained greedy request gives the same tokens alone and in a batch.
  auto alone = make_engine(engine_config(128, 8, 256));
  const std::string a = add(*alone, constrained(p, g, 250));
  Outputs alone_run;
  test::run_until_idle(*alone, alone_run);
  auto batched = make_engine(engine_config(128, 8, 256));
  const std::string b = add(*batched, constrained(p, g, 250));
  add(*batched, request(plain, 30));
  add(*batched, constrained(random_prompt(70, 9), g, 40));
  Outputs batched_run;
  test::run_until_idle(*batched, batched_run);
  EXPECT_EQ(alone_run.requests[a].tokens, batched_run.requests[b].tokens);
}

TEST_F(EngineStructured, MaxTokensCutsAGrammarWithLengthAndStopStringsStillApply) {
  auto g = compile(GrammarKind::kJsonSchema, kPersonSchema);
  auto engine = make_engine(engine_config(256, 8, 256));
  const std::vector<int32_t> p = prompt(kPersonPrompt);
  const std::string cut = add(*engine, constrained(p, g, 6));
  GenerationParams with_stop = constrained(p, g, 250);
  with_stop.stop = {"\"age\""};
  const std::string stopped = add(*engine, with_stop);
  Outputs run;
  test::run_until_idle(*engine, run);
  const Collected& c = run.requests[cut];
  EXPECT_EQ(c.final_output.status, RequestStatus::kFinishedLength);
  EXPECT_EQ(c.tokens.size(), 6u);
  auto m = replay(g, c.tokens);
  ASSERT_TRUE(m);
  EXPECT_FALSE(m->is_stopped());
  const Collected& s = run.requests[stopped];
  EXPECT_EQ(s.final_output.status, RequestStatus::kFinishedStopped);
  EXPECT_EQ(s.final_output.stop_string, "\"age\"");
  EXPECT_EQ(s.text.find("\"age\""), std::string::npos);
  EXPECT_NE(s.text.find("\"name\""), std::string::npos) << s.text;
}

TEST_F(EngineStructured, LogprobsDescribeTheConstrainedDistribution) {
  // A choice: after its first tokens only one continuation is possible, and
  // a token that is the only one allowed has probability 1.
  auto g = compile(GrammarKind::kRegex, "(The answer is (yes|no)\\.|Certainly not, said the cat\\.)");
  auto engine = make_engine(engine_config(128, 8, 128));
  GenerationParams gp = constrained(prompt("Question: is the sky green? "), g, 30);
  gp.logprobs = 5;
  const std::string id = add(*engine, gp);
  Outputs run;
  test::run_until_idle(*engine, run);
  const Collected& c = run.requests[id];
  EXPECT_EQ(c.final_output.status, RequestStatus::kFinishedStopped);
  std::vector<SampledLogprobs> lps;
  for (const RequestOutput& o : c.deltas) lps.insert(lps.end(), o.logprobs.begin(), o.logprobs.end());
  ASSERT_EQ(lps.size(), c.tokens.size());
  auto m = g->new_matcher();
  ASSERT_TRUE(m.ok());
  int forced = 0;
  for (size_t i = 0; i < lps.size(); ++i) {
    auto mask = (*m)->compute_mask();
    ASSERT_TRUE(mask.ok());
    int64_t n_allowed = 0;
    for (int32_t t = 0; t < (*m)->n_vocab(); ++t) n_allowed += token_allowed(*mask, t);
    EXPECT_TRUE(std::isfinite(lps[i].logprob));
    EXPECT_EQ(lps[i].top.size(), static_cast<size_t>(std::min<int64_t>(5, n_allowed)));
    double mass = 0;
    for (const TokenLogprob& t : lps[i].top) {
      EXPECT_TRUE(token_allowed(*mask, t.token)) << "step " << i << ": disallowed alternative " << t.token;
      mass += std::exp(t.logprob);
    }
    EXPECT_LE(mass, 1.0 + 1e-5);
    if (n_allowed == 1) {
      ++forced;
      EXPECT_NEAR(lps[i].logprob, 0.0f, 1e-6) << "step " << i;
    }
    ASSERT_TRUE((*m)->commit(c.tokens[i]).ok());
  }
  EXPECT_GT(forced, 0) << c.text;
}

TEST_F(EngineStructured, PreemptionAndRecomputeKeepTheMatcherInStep) {
  // Constrained requests under a KV pool too small for all of them: the newest
  // is preempted and recomputes its prompt and output; its matcher follows the
  // output tokens, which preemption keeps, so nothing is committed twice and
  // the tokens equal those of a run without preemption.
  auto g = compile(GrammarKind::kRegex, "[a-z]+( [a-z]+){2,40}");
  constexpr int64_t kMaxTokens = 24;
  std::vector<GenerationParams> reqs;
  for (int i = 0; i < 8; ++i) {
    GenerationParams gp = constrained(random_prompt(20 + 35 * i, 300 + i), g, kMaxTokens);
    gp.ignore_eos = true;
    reqs.push_back(gp);
  }
  auto run_all = [&](int64_t n_blocks, EngineStats* stats) {
    auto engine = make_engine(engine_config(128, 16, n_blocks));
    std::vector<std::string> ids;
    for (const GenerationParams& p : reqs) ids.push_back(add(*engine, p));
    Outputs run;
    test::run_until_idle(*engine, run);
    test::expect_idle_and_clean(*engine);
    *stats = engine->stats();
    std::vector<Collected> out;
    for (const std::string& id : ids) out.push_back(run.requests[id]);
    return out;
  };
  EngineStats small_stats, big_stats;
  const auto small = run_all(blocks_held_alone(20 + 35 * 7 + kMaxTokens, 128) + 5, &small_stats);
  const auto big = run_all(512, &big_stats);
  EXPECT_GT(small_stats.scheduler.preemptions, 0);
  EXPECT_EQ(big_stats.scheduler.preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(small[i].tokens, big[i].tokens) << "request " << i;
    ASSERT_TRUE(replay(g, small[i].tokens)) << "request " << i;
  }
}

TEST_F(EngineStructured, MaskCostPerStepOnTheDefaultVocabulary) {
  // Not a pass/fail figure: what one compute_mask costs for a JSON schema on
  // a 49152-token vocabulary, over a whole generated document.
  const auto t0 = std::chrono::steady_clock::now();
  GrammarCompiler fresh(compiler_->tokenizer());
  auto g = fresh.compile(GrammarKind::kJsonSchema, kPersonSchema);
  ASSERT_TRUE(g.ok());
  const double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  auto engine = make_engine(engine_config(256, 8, 256));
  const std::string id = add(*engine, constrained(prompt(kPersonPrompt), *g, 250));
  Outputs run;
  test::run_until_idle(*engine, run);
  const std::vector<int32_t>& tokens = run.requests[id].tokens;
  ASSERT_GT(tokens.size(), 10u);
  // Twice: the first pass warms the lexer's lazily built automaton (shared by
  // every matcher of the grammar), the second is what later requests pay.
  for (int pass = 0; pass < 2; ++pass) {
    auto m = (*g)->new_matcher();
    ASSERT_TRUE(m.ok());
    double total_us = 0, max_us = 0, apply_us = 0, commit_us = 0;
    std::vector<float> logits(model_->config().n_vocab, 0.5f);
    using clock = std::chrono::steady_clock;
    auto us_since = [](clock::time_point t) {
      return std::chrono::duration<double, std::micro>(clock::now() - t).count();
    };
    for (int32_t t : tokens) {
      auto s = clock::now();
      auto mask = (*m)->compute_mask();
      const double us = us_since(s);
      ASSERT_TRUE(mask.ok());
      total_us += us;
      max_us = std::max(max_us, us);
      s = clock::now();
      apply_token_mask(*mask, (*m)->n_vocab(), logits.data(), static_cast<int64_t>(logits.size()));
      apply_us += us_since(s);
      s = clock::now();
      ASSERT_TRUE((*m)->commit(t).ok());
      commit_us += us_since(s);
    }
    const double n = static_cast<double>(tokens.size());
    std::printf("schema compile %.1f ms; pass %d, %zu steps: compute_mask mean %.1f us (max %.1f), "
                "apply_token_mask %.1f us, commit %.1f us per step\n",
                compile_ms, pass + 1, tokens.size(), total_us / n, max_us, apply_us / n, commit_us / n);
  }
}

}  // namespace
}  // namespace inferd
