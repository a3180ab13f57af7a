// Control tokens in a request's text (GenerationParams::render_special, the
// server's skip_special_tokens=false and Mistral tool calls), on the tiny
// random Mistral (tests/data/models/tiny-mistral.gguf, whose [TOOL_CALLS],
// [INST], ... are control tokens). A Lark grammar forces the tokens, so the
// random weights do not matter: with the flag the control tokens' text is in
// the output, without it it is not, and the token that stops the request is
// never text.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "structured/grammar.h"

namespace inferd {
namespace {

using test::Collected;
using test::Outputs;

class EngineSpecialTokens : public test::GrammarModelTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(use_model("tiny-mistral.gguf"));
    GrammarModelTest::SetUp();
  }

  static int32_t id_of(const std::string& text) {
    const Tokenizer& tok = model_->tokenizer();
    for (int32_t id = 0; id < tok.n_vocab(); ++id)
      if (tok.token_text(id) == text) return id;
    return -1;
  }

  // The greedy request under the Lark grammar `lark`.
  static Collected run(const std::string& lark, bool render_special, std::vector<int32_t> stop_token_ids = {}) {
    auto engine = make_engine(engine_config(128, 4, 64));
    EXPECT_TRUE(engine);
    if (!engine) return {};
    GenerationParams p = request(model_->tokenizer().encode("[INST] Weather in Paris?[/INST]", /*add_special=*/true,
                                                            /*parse_special=*/true),
                                 32);
    p.ignore_eos = false;
    p.grammar = compile(GrammarKind::kLark, lark);
    p.render_special = render_special;
    p.stop_token_ids = std::move(stop_token_ids);
    const std::string id = add(*engine, std::move(p));
    Outputs out;
    test::run_until_idle(*engine, out);
    test::expect_idle_and_clean(*engine);
    return out.requests[id];
  }
};

TEST_F(EngineSpecialTokens, RenderedOnlyWhenAsked) {
  const int32_t calls = id_of("[TOOL_CALLS]");
  ASSERT_GE(calls, 0);
  ASSERT_TRUE(model_->tokenizer().is_control(calls));
  const std::string lark = "start: <[" + std::to_string(calls) + "]> \" [1]\"\n";
  const Collected shown = run(lark, /*render_special=*/true);
  ASSERT_TRUE(shown.finished);
  EXPECT_EQ(shown.final_output.status, RequestStatus::kFinishedStopped);
  ASSERT_FALSE(shown.tokens.empty());
  EXPECT_EQ(shown.tokens[0], calls);
  EXPECT_EQ(shown.text, "[TOOL_CALLS] [1]");
  const Collected hidden = run(lark, /*render_special=*/false);
  EXPECT_EQ(hidden.tokens, shown.tokens);
  EXPECT_EQ(hidden.text, " [1]");
}

TEST_F(EngineSpecialTokens, StopTokenIsNeverText) {
  const int32_t calls = id_of("[TOOL_CALLS]"), inst = id_of("[INST]");
  ASSERT_GE(calls, 0);
  ASSERT_GE(inst, 0);
  // [INST] stops the request: rendered, it would be text; it is left out, as
  // EOS is, while [TOOL_CALLS] before it is shown.
  const std::string lark =
      "start: <[" + std::to_string(calls) + "]> \"a\" <[" + std::to_string(inst) + "]> \"b\"\n";
  const Collected stopped = run(lark, /*render_special=*/true, {inst});
  ASSERT_TRUE(stopped.finished);
  EXPECT_EQ(stopped.final_output.status, RequestStatus::kFinishedStopped);
  ASSERT_FALSE(stopped.tokens.empty());
  EXPECT_EQ(stopped.tokens.back(), inst);
  EXPECT_EQ(stopped.text, "[TOOL_CALLS]a");
  // Not a stop token: shown like any other control token.
  const Collected through = run(lark, /*render_special=*/true);
  EXPECT_EQ(through.text, "[TOOL_CALLS]a[INST]b");
}

}  // namespace
}  // namespace inferd
