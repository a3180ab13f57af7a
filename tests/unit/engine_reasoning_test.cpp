// Reasoning before a structured answer, in the engine (ReasoningSpec), on the
// default model (SmolLM2-135M). Greedy, it answers "What is the capital of
// France?" with "The capital of France is Paris." (tokens "The", " capital",
// " of", " France", " is", " Paris", "."), so markers taken from that sentence
// stand in for <think> and </think>: ordinary words spanning several tokens,
// which is the hard case (a marker that is one special token is the easy one).
// Each test's grammar rules out the thinking's text, so a grammar applied from
// the first token (no gate) would change the output and fail the test.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "structured/grammar.h"

namespace inferd {
namespace {

using test::Collected;
using test::Outputs;

class EngineReasoning : public test::GrammarModelTest {
 protected:
  static std::shared_ptr<const CompiledGrammar> regex(const std::string& text) { return compile(GrammarKind::kRegex, text); }

  // The greedy request, constrained by `g` after the thinking `spec` describes.
  static Collected run(std::shared_ptr<const CompiledGrammar> g, const ReasoningSpec& spec, int64_t max_tokens = 24) {
    auto engine = make_engine(engine_config(128, 4, 64));
    EXPECT_TRUE(engine);
    if (!engine) return {};
    GenerationParams p = request(
        model_->tokenizer().encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
                                   /*add_special=*/true, /*parse_special=*/true),
        max_tokens);
    p.ignore_eos = false;
    p.grammar = std::move(g);
    p.reasoning = spec;
    const std::string id = add(*engine, std::move(p));
    Outputs out;
    test::run_until_idle(*engine, out);
    test::expect_idle_and_clean(*engine);
    return out.requests[id];
  }

  // The tokens after the one whose text completes `end` (searched from
  // `from`): what the grammar saw. Each must be allowed where it was sampled,
  // and the grammar must end complete.
  static void expect_answer_follows_grammar(const std::shared_ptr<const CompiledGrammar>& g, const Collected& c,
                                            const std::string& end) {
    const Tokenizer& tok = model_->tokenizer();
    std::string text;
    size_t first = c.tokens.size();
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      text += tok.token_to_piece(c.tokens[i], true);
      if (text.find(end) != std::string::npos) {
        first = i + 1;
        break;
      }
    }
    ASSERT_LT(first, c.tokens.size()) << "no answer after '" << end << "' in: " << c.text;
    auto m = g->new_matcher();
    ASSERT_TRUE(m.ok());
    for (size_t i = first; i < c.tokens.size(); ++i) {
      auto mask = (*m)->compute_mask();
      ASSERT_TRUE(mask.ok());
      EXPECT_TRUE(token_allowed(*mask, c.tokens[i])) << "answer token " << i - first << " not allowed: " << c.text;
      ASSERT_TRUE((*m)->commit(c.tokens[i]).ok());
    }
    EXPECT_TRUE((*m)->is_stopped() || (*m)->is_accepting()) << c.text;
  }

};

TEST_F(EngineReasoning, GrammarStartsAfterAMultiTokenEndMarker) {
  // The prompt opened the thinking; it ends at "of France" (two tokens). The
  // grammar (which cannot start with "The") constrains " is Paris." only.
  auto g = regex(" is [A-Z][a-z]+\\.");
  ASSERT_TRUE(g);
  const Collected c = run(g, ReasoningSpec{"", "of France", /*starts_inside=*/true});
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.final_output.status, RequestStatus::kFinishedStopped);
  EXPECT_EQ(c.text, "The capital of France is Paris.");
  expect_answer_follows_grammar(g, c, "of France");
}

TEST_F(EngineReasoning, OutputThatOpensTheThinking) {
  // Not opened by the prompt: the output opens it with "The capital" (two
  // tokens); the first step allows the grammar's tokens and the marker's.
  auto g = regex(" is [A-Z][a-z]+\\.");
  ASSERT_TRUE(g);
  const Collected c = run(g, ReasoningSpec{"The capital", "France", /*starts_inside=*/false});
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.final_output.status, RequestStatus::kFinishedStopped);
  EXPECT_EQ(c.text, "The capital of France is Paris.");
  expect_answer_follows_grammar(g, c, "France");
}

TEST_F(EngineReasoning, OutputThatDoesNotThinkIsConstrainedFromTheStart) {
  // The output never opens "<think>": the grammar applies from its first token.
  auto g = regex("The capital of France is [a-z]+\\.");
  ASSERT_TRUE(g);
  const Collected c = run(g, ReasoningSpec{});
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.final_output.status, RequestStatus::kFinishedStopped);
  EXPECT_TRUE(c.text.starts_with("The capital of France is ")) << c.text;
  auto m = g->new_matcher();
  ASSERT_TRUE(m.ok());
  for (int32_t t : c.tokens) ASSERT_TRUE((*m)->commit(t).ok()) << c.text;
  EXPECT_TRUE((*m)->is_stopped() || (*m)->is_accepting()) << c.text;
}

TEST_F(EngineReasoning, MarkerPieceTheGrammarAlsoAllowsThenThinking) {
  // "The" starts both the marker and the grammar: the grammar follows it, and
  // starts afresh once " capital" completes the marker.
  auto g = regex("The answer\\.");
  ASSERT_TRUE(g);
  const Collected c = run(g, ReasoningSpec{"The capital", "France", /*starts_inside=*/false});
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.final_output.status, RequestStatus::kFinishedStopped) << c.text;
  EXPECT_TRUE(c.text.starts_with("The capital of France")) << c.text;
  EXPECT_TRUE(c.text.ends_with("The answer.")) << c.text;
  expect_answer_follows_grammar(g, c, "France");
}

TEST_F(EngineReasoning, ThinkingCutByMaxTokensFinishesWithLength) {
  auto g = regex("[0-9]+");
  ASSERT_TRUE(g);
  const Collected c = run(g, ReasoningSpec{"", "</think>", /*starts_inside=*/true}, /*max_tokens=*/5);
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.final_output.status, RequestStatus::kFinishedLength);
  EXPECT_EQ(c.text, "The capital of France is");  // not digits: the grammar never started
}

TEST_F(EngineReasoning, WithoutAGrammarTheSpecChangesNothing) {
  const Collected c = run(nullptr, ReasoningSpec{"", "</think>", true});
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.text, "The capital of France is Paris.");
}

TEST_F(EngineReasoning, EmptyEndMarkerIsRefused) {
  auto engine = make_engine(engine_config(128, 4, 64));
  ASSERT_TRUE(engine);
  GenerationParams p = request({1, 2, 3}, 4);
  p.reasoning = ReasoningSpec{"<think>", "", false};
  EXPECT_FALSE(engine->add_request(std::move(p)).ok());
}

}  // namespace
}  // namespace inferd
