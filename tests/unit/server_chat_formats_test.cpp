// gpt-oss's harmony and Qwen3-Coder's XML tool calls on the server side:
// requests with reasoning_effort and earlier reasoning; the two real chat
// templates (llama.cpp's vendored copies, tests/data/chat/gpt_oss.jinja and
// qwen3_coder.jinja) rendering tools, tool calls, tool results, reasoning and
// reasoning_effort through our minijinja path; and the grammars of forced
// calls and of structured output on harmony's final channel, compiled
// against the committed tiny Qwen3's vocabulary (the markers as text) and fed
// tokens; and again with gpt-oss's own vocabulary (tests/data/vocab/
// gpt-oss-vocab.gguf), where the markers are tokens: the detokenizer shows
// them, <|call|> and <|return|> end the generation, a prompt's markers are
// tokens and a user's are text, the grammars take them as tokens.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "chat/chat_prompt.h"
#include "chat/harmony.h"
#include "chat/reasoning.h"
#include "chat/tool_calls.h"
#include "gguf/gguf.h"
#include "server/openai_protocol.h"
#include "server/tool_calling.h"
#include "structured/grammar.h"
#include "server_test_util.h"
#include "tokenizer/tokenizer.h"
#include "test_data.h"

namespace inferd::server {
namespace {

using json = nlohmann::json;

using test::chat_ok;

const ProtocolLimits kLimits;

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string chat_data(const std::string& name) { return read_file(inferd::test::test_data_root() + "/chat/" + name); }

const char* kWeather =
    R"({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",)"
    R"( "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},)"
    R"( "metric": {"type": "boolean"}}, "required": ["city"]}}})";
const char* kTime =
    R"({"type": "function", "function": {"name": "get_time", "description": "Time in a zone.", "parameters": {"type": "object",)"
    R"( "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}})";

// A conversation with a tool call (and the thinking before it), its result,
// and a new question.
std::string conversation(const std::string& extra) {
  return R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},)"
         R"( {"role": "assistant", "content": null, "reasoning_content": "Need the weather tool.", "tool_calls":)"
         R"( [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},)"
         R"( {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"}],)"
         R"( "tools": [)" +
         std::string(kWeather) + ", " + kTime + "]" + extra + "}";
}

TEST(ChatFormatsRequest, ReasoningEffortAndEarlierReasoning) {
  GenerationRequest r = chat_ok(conversation(R"(, "reasoning_effort": "high")"));
  EXPECT_EQ(r.reasoning_effort, "high");
  EXPECT_EQ(json::parse(r.chat_template_kwargs), json::parse(R"({"reasoning_effort": "high"})"));
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[2].reasoning_content, "Need the weather tool.");
  // chat_template_kwargs of the same name wins; other kwargs are kept.
  r = chat_ok(conversation(R"(, "reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "medium", "x": 1})"));
  EXPECT_EQ(json::parse(r.chat_template_kwargs), json::parse(R"({"reasoning_effort": "medium", "x": 1})"));
  // vLLM's newer name for the earlier reasoning.
  r = chat_ok(R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning": "r"}]})");
  EXPECT_EQ(r.messages[1].reasoning_content, "r");
  EXPECT_TRUE(chat_ok(R"({"messages": [{"role": "user", "content": "a"}], "reasoning_effort": null})").chat_template_kwargs.empty());
  for (const char* bad : {R"("reasoning_effort": "extreme")", R"("reasoning_effort": 3)"}) {
    auto e = parse_chat_request(R"({"messages": [{"role": "user", "content": "a"}], )" + std::string(bad) + "}", kLimits);
    ASSERT_TRUE(std::holds_alternative<ApiError>(e)) << bad;
    EXPECT_EQ(std::get<ApiError>(e).param, "reasoning_effort");
  }
  auto e = parse_chat_request(
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning_content": 1}]})",
      kLimits);
  ASSERT_TRUE(std::holds_alternative<ApiError>(e));
  EXPECT_EQ(reasoning_parser_from_name("openai_gptoss"), ReasoningParser::kHarmony);
  EXPECT_EQ(reasoning_parser_from_name("openai"), ReasoningParser::kHarmony);
  EXPECT_EQ(reasoning_parser_from_name("harmony"), ReasoningParser::kHarmony);
  GenerationRequest rf = chat_ok(R"({"messages": [{"role": "user", "content": "a"}], "reasoning_format": "openai_gptoss"})");
  EXPECT_EQ(rf.reasoning_format, ReasoningParser::kHarmony);
}

// ---- the templates, with the tiny Qwen3's tokenizer (committed) -----------------

class ChatFormats : public ::testing::Test {
 protected:
  void SetUp() override { load("/models/tiny-qwen3.gguf"); }

  // The tokenizer, grammar compiler and tools of a GGUF under tests/data.
  void load(const std::string& gguf) {
    auto file = gguf::File::open(inferd::test::test_data_root() + gguf);
    ASSERT_TRUE(file.ok()) << file.error().message;
    file_ = std::move(*file);
    auto tok = Tokenizer::from_gguf(*file_);
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    tok_ = std::move(*tok);
    auto gt = GrammarTokenizer::create(*tok_);
    ASSERT_TRUE(gt.ok()) << gt.error().message;
    compiler_ = std::make_unique<GrammarCompiler>(std::move(*gt));
    tools_ = chat_ok(conversation("")).tools->tools;
  }

  std::string render(const std::string& tmpl, const std::string& body) {
    GenerationRequest r = chat_ok(body);
    ChatPromptOptions options;
    options.add_generation_prompt = r.add_generation_prompt;
    options.extra_context_json = r.chat_template_kwargs;
    if (r.tools) options.tools_json = r.tools->tools_json;
    auto p = render_chat_prompt(ChatTemplate(chat_data(tmpl)), *tok_, r.messages, options);
    EXPECT_TRUE(p.ok()) << p.error().message;
    return p.ok() ? p->text : std::string();
  }

  std::shared_ptr<const CompiledGrammar> compile(const Result<std::string>& lark) {
    return test::compile_lark(*compiler_, lark);
  }

  // Feeds the text's tokens: whether every one is allowed and the grammar
  // accepts the whole.
  bool accepts(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
    return test::grammar_accepts(*g, tok_->encode(text, false, /*parse_special=*/true));
  }

  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<GrammarCompiler> compiler_;
  std::vector<ToolSpec> tools_;
};

TEST_F(ChatFormats, GptOssTemplateRendersToolsResultsReasoningAndEffort) {
  const std::string source = chat_data("gpt_oss.jinja");
  EXPECT_TRUE(template_uses_harmony(source));
  EXPECT_EQ(detect_tool_call_format(source), ToolCallFormat::kHarmony);
  EXPECT_TRUE(template_supports_tools(source));

  const std::string text = render("gpt_oss.jinja", conversation(R"(, "reasoning_effort": "high")"));
  EXPECT_EQ(text.rfind("<|start|>system<|message|>You are ChatGPT", 0), 0u) << text;
  EXPECT_NE(text.find("Reasoning: high\n"), std::string::npos) << text;
  EXPECT_NE(text.find("<|start|>developer<|message|># Instructions\n\nBe brief."), std::string::npos) << text;
  EXPECT_NE(text.find("namespace functions {"), std::string::npos) << text;
  EXPECT_NE(text.find("type get_weather = (_: {\n"), std::string::npos) << text;
  EXPECT_NE(text.find("type get_time = (_: {"), std::string::npos) << text;
  // The earlier call with its thinking (kept: no final answer follows it),
  // the result under the function's name, then the generation prompt.
  EXPECT_NE(text.find("<|start|>assistant<|channel|>analysis<|message|>Need the weather tool.<|end|>"
                      "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
                      "{\"city\": \"Paris\"}<|call|>"
                      "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
                      "\"18C and sunny\"<|end|><|start|>assistant"),
            std::string::npos)
      << text;
  EXPECT_TRUE(text.ends_with("<|start|>assistant")) << text;
  // gpt-oss's template (as with Jinja2) fails on a tool without a description.
  {
    GenerationRequest r = chat_ok(R"({"messages": [{"role": "user", "content": "Hi"}], "tools": [{"type": "function",)"
                                  R"( "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]})");
    ChatPromptOptions options;
    options.tools_json = r.tools->tools_json;
    EXPECT_FALSE(render_chat_prompt(ChatTemplate(source), *tok_, r.messages, options).ok());
  }
  // The default effort, and no tools section without tools.
  const std::string plain = render("gpt_oss.jinja", R"({"messages": [{"role": "user", "content": "Hi"}]})");
  EXPECT_NE(plain.find("Reasoning: medium\n"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("namespace functions"), std::string::npos) << plain;
  EXPECT_TRUE(plain.ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant")) << plain;
  // A finished turn drops its thinking (the template keeps CoT only before calls).
  const std::string two = render("gpt_oss.jinja",
                                 R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!",)"
                                 R"( "reasoning_content": "greet"}, {"role": "user", "content": "Bye"}]})");
  EXPECT_NE(two.find("<|start|>assistant<|channel|>final<|message|>Hello!<|end|><|start|>user<|message|>Bye"),
            std::string::npos)
      << two;
  EXPECT_EQ(two.find("greet"), std::string::npos) << two;
}

TEST_F(ChatFormats, Qwen3CoderTemplateRendersToolsCallsAndResults) {
  const std::string source = chat_data("qwen3_coder.jinja");
  EXPECT_EQ(detect_tool_call_format(source), ToolCallFormat::kQwen3Coder);
  EXPECT_FALSE(template_uses_harmony(source));
  const std::string text = render("qwen3_coder.jinja", conversation(""));
  EXPECT_EQ(text.rfind("<|im_start|>system\nBe brief.\n\n# Tools\n\nYou have access to the following tools:\n\n<tools>\n"
                       "<function>\n<name>get_weather</name>\n<description>Weather in a city.</description>\n"
                       "<parameters>\n<parameter>\n<name>city</name>\n<type>string</type>\n</parameter>",
                       0),
            0u)
      << text;
  EXPECT_NE(text.find("<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                      "</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n"
                      "18C and sunny\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n"),
            std::string::npos)
      << text;
  EXPECT_TRUE(text.ends_with("<|im_start|>assistant\n")) << text;
  // What the template writes for a call, the parser reads back.
  const ParsedAssistantMessage m = parse_tool_calls(
      ToolCallFormat::kQwen3Coder, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
      {}, {{"get_weather", tools_[0].parameters}});
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"city":"Paris"})");
}

TEST_F(ChatFormats, Qwen3CoderForcedCallGrammar) {
  auto g = compile(forced_tool_call_grammar(ToolCallFormat::kQwen3Coder, tools_, "", /*parallel=*/false));
  ASSERT_TRUE(g);
  const std::string weather =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n"
      "</parameter>\n</function>\n</tool_call>";
  const std::string time = "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(accepts(g, weather));
  EXPECT_TRUE(accepts(g, time));
  // Optional parameters may be left out; a string may span lines.
  EXPECT_TRUE(accepts(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan\nJose\n</parameter>\n</function>\n"
                         "</tool_call>"));
  EXPECT_TRUE(accepts(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=metric>\n"
                         "true\n</parameter>\n</function>\n</tool_call>"));
  // A required parameter missing, a value against its type, an unknown
  // function, text first, two calls without parallel.
  EXPECT_FALSE(accepts(g, "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=days>\n"
                          "three\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(g, "<tool_call>\n<function=get_date>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(g, "Sure. " + time));
  EXPECT_FALSE(accepts(g, time + "\n" + time));
  // What the grammar accepts, the parser reads as the call.
  std::vector<ToolSignature> sigs;
  for (const ToolSpec& t : tools_) sigs.push_back({t.name, t.parameters});
  const ParsedAssistantMessage m = parse_tool_calls(ToolCallFormat::kQwen3Coder, weather, {}, sigs);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"city":"New York","days":3})");

  auto parallel = compile(forced_tool_call_grammar(ToolCallFormat::kQwen3Coder, tools_, "", /*parallel=*/true));
  ASSERT_TRUE(parallel);
  EXPECT_TRUE(accepts(parallel, time + "\n" + weather));
  // A string's enum is a choice among its values.
  std::vector<ToolSpec> units = {{"set_unit", R"({"type": "object", "properties": {"unit": {"type": "string", "enum": ["C", "F"]}},)"
                                              R"( "required": ["unit"]})"}};
  auto unit = compile(forced_tool_call_grammar(ToolCallFormat::kQwen3Coder, units, "", false));
  ASSERT_TRUE(unit);
  EXPECT_TRUE(accepts(unit, "<tool_call>\n<function=set_unit>\n<parameter=unit>\nF\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(unit, "<tool_call>\n<function=set_unit>\n<parameter=unit>\nK\n</parameter>\n</function>\n</tool_call>"));
  auto named = compile(forced_tool_call_grammar(ToolCallFormat::kQwen3Coder, tools_, "get_time", false));
  ASSERT_TRUE(named);
  EXPECT_TRUE(accepts(named, time));
  EXPECT_FALSE(accepts(named, weather));
}

TEST_F(ChatFormats, HarmonyForcedCallGrammar) {
  auto g = compile(forced_tool_call_grammar(ToolCallFormat::kHarmony, tools_, "", /*parallel=*/true));
  ASSERT_TRUE(g);
  const std::string call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
  EXPECT_TRUE(accepts(g, call));
  // Thinking and a preamble first, free; the recipient in the role; no constraint.
  EXPECT_TRUE(accepts(g, "<|channel|>analysis<|message|>Need <b>weather</b> | <|e.<|end|><|start|>assistant" + call));
  EXPECT_TRUE(accepts(g, "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary<|message|>"
                         "Checking.<|end|><|start|>assistant" + call));
  EXPECT_TRUE(accepts(g, " to=functions.get_time<|channel|>commentary json<|message|>{\"zone\": \"UTC\"}"));
  EXPECT_TRUE(accepts(g, "<|channel|>commentary to=functions.get_time<|message|>{\"zone\": \"UTC\"}"));
  // A final answer instead, an unknown function, arguments against the schema.
  EXPECT_FALSE(accepts(g, "<|channel|>final<|message|>Hi"));
  EXPECT_FALSE(accepts(g, "<|channel|>commentary to=functions.get_date <|constrain|>json<|message|>{}"));
  EXPECT_FALSE(accepts(g, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}"));
  EXPECT_FALSE(accepts(g, "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": 1}"));
  // What it accepts, the harmony parser reads as the call.
  const HarmonyMessage m = parse_harmony("<|channel|>analysis<|message|>x<|end|><|start|>assistant" + call);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  EXPECT_EQ(m.reasoning, "x");
  auto named = compile(forced_tool_call_grammar(ToolCallFormat::kHarmony, tools_, "get_time", false));
  ASSERT_TRUE(named);
  EXPECT_FALSE(accepts(named, call));
}

TEST_F(ChatFormats, HarmonyStructuredOutputAppliesToTheFinalMessage) {
  const std::string schema =
      R"({"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]})";
  auto g = compile(harmony_final_grammar(GrammarKind::kJsonSchema, schema));
  ASSERT_TRUE(g);
  EXPECT_TRUE(accepts(g, "<|channel|>final<|message|>{\"answer\": 4}"));
  EXPECT_TRUE(accepts(g, "<|channel|>analysis<|message|>2+2 is {not JSON}.<|end|><|start|>assistant"
                         "<|channel|>final <|constrain|>json<|message|>{\"answer\": 4}"));
  EXPECT_TRUE(accepts(g, "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b"
                         "<|end|><|start|>assistant<|channel|>final<|message|>{\"answer\": 4}"));
  EXPECT_FALSE(accepts(g, "<|channel|>final<|message|>{\"answer\": \"four\"}"));
  EXPECT_FALSE(accepts(g, "<|channel|>final<|message|>4"));
  EXPECT_FALSE(accepts(g, "{\"answer\": 4}"));
  EXPECT_FALSE(accepts(g, "<|channel|>commentary to=functions.f<|message|>{\"answer\": 4}"));
  auto any = compile(harmony_final_grammar(GrammarKind::kJsonObject, ""));
  ASSERT_TRUE(any);
  EXPECT_TRUE(accepts(any, "<|channel|>final<|message|>{\"x\": [1]}"));
  EXPECT_FALSE(harmony_final_grammar(GrammarKind::kRegex, "a+").ok());
}

// ---- gpt-oss's own vocabulary (tests/data/vocab/gpt-oss-vocab.gguf): the markers are tokens ----

class GptOssVocab : public ChatFormats {
 protected:
  void SetUp() override { load("/vocab/gpt-oss-vocab.gguf"); }

  int32_t one_token(const std::string& text) {
    const std::vector<int32_t> ids = tok_->encode(text, false, /*parse_special=*/true);
    EXPECT_EQ(ids.size(), 1u) << text;
    return ids.empty() ? -1 : ids[0];
  }

  std::string detokenize(const std::vector<int32_t>& ids, bool render_special) {
    IncrementalDecoder dec(*tok_, render_special);
    std::string text;
    for (int32_t id : ids) text += dec.push(id);
    return text + dec.flush();
  }
};

TEST_F(GptOssVocab, MarkersAreTokensTheDetokenizerShowsAndCallEndsTheOutput) {
  // llama.cpp's ids: <|return|> 200002, <|call|> 200012 end the generation; <|end|> does not.
  EXPECT_EQ(one_token("<|return|>"), 200002);
  EXPECT_EQ(one_token("<|call|>"), 200012);
  EXPECT_TRUE(tok_->is_eog(200002));
  EXPECT_TRUE(tok_->is_eog(200012));
  EXPECT_FALSE(tok_->is_eog(one_token("<|end|>")));
  const std::string out = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>commentary "
                          "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
  std::vector<int32_t> ids = tok_->encode(out, false, /*parse_special=*/true);
  for (const char* m : {"<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>"})
    EXPECT_NE(std::find(ids.begin(), ids.end(), one_token(m)), ids.end()) << m;
  // The request's decoder renders the markers for the parser (with or
  // without control tokens: they are user-defined tokens here).
  for (bool render : {true, false}) {
    const HarmonyMessage m = parse_harmony(detokenize(ids, render));
    EXPECT_EQ(m.reasoning, "hm");
    ASSERT_EQ(m.tool_calls.size(), 1u);
    EXPECT_EQ(m.tool_calls[0].arguments, R"({"city":"Paris"})");
  }
}

TEST_F(GptOssVocab, TemplatePromptTokenizesMarkersAsTokensAndContentAsText) {
  GenerationRequest r = chat_ok(conversation(R"(, "reasoning_effort": "low")"));
  // The harmony markers are user-defined tokens, which the tokenizer reads
  // in any text (llama.cpp does too; only control tokens typed in a message
  // stay text, chat_prompt.h): a user typing one gets the token.
  r.messages[1].content = "Weather in <|channel|>Paris?";
  ChatPromptOptions options;
  options.extra_context_json = r.chat_template_kwargs;
  options.tools_json = r.tools->tools_json;
  auto p = render_chat_prompt(ChatTemplate(chat_data("gpt_oss.jinja")), *tok_, r.messages, options);
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_NE(p->text.find("Reasoning: low"), std::string::npos);
  const std::vector<int32_t> ids = tokenize_chat_prompt(*tok_, *p);
  const int32_t channel = one_token("<|channel|>");
  // The template's own <|channel|> markers (the analysis before the call, the
  // call, the tool result) and the user's.
  EXPECT_EQ(std::count(ids.begin(), ids.end(), channel), 4) << p->text;
  EXPECT_EQ(std::count(ids.begin(), ids.end(), one_token("<|call|>")), 1);
  const std::vector<int32_t> tail = tok_->encode("<|start|>assistant", false, true);
  ASSERT_GE(ids.size(), tail.size());
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), ids.end() - static_cast<long>(tail.size())));
}

TEST_F(GptOssVocab, GrammarsAcceptTheMarkersAsTokens) {
  auto call = compile(forced_tool_call_grammar(ToolCallFormat::kHarmony, tools_, "", false));
  ASSERT_TRUE(call);
  EXPECT_TRUE(accepts(call, "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary "
                            "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}"));
  EXPECT_FALSE(accepts(call, "<|channel|>final<|message|>Hi"));
  auto json_final = compile(harmony_final_grammar(GrammarKind::kJsonSchema, R"({"type": "object", "properties":)"
                                                                             R"( {"ok": {"type": "boolean"}}, "required": ["ok"]})"));
  ASSERT_TRUE(json_final);
  EXPECT_TRUE(accepts(json_final, "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>{\"ok\": true}"));
  EXPECT_FALSE(accepts(json_final, "<|channel|>final<|message|>{\"ok\": 1}"));
  // After the analysis header, the model may write anything but the grammar
  // keeps <|end|>, and then only <|start|>, open to it.
  auto m = json_final->new_matcher();
  ASSERT_TRUE(m.ok());
  for (int32_t id : tok_->encode("<|channel|>analysis<|message|>Some thought", false, true)) {
    auto mask = (*m)->compute_mask();
    ASSERT_TRUE(mask.ok());
    ASSERT_TRUE(token_allowed(*mask, id));
    ASSERT_TRUE((*m)->commit(id).ok());
  }
  auto mask = (*m)->compute_mask();
  ASSERT_TRUE(mask.ok());
  EXPECT_TRUE(token_allowed(*mask, one_token("<|end|>")));
  EXPECT_TRUE(token_allowed(*mask, tok_->encode(" more", false, false).at(0)));
  EXPECT_FALSE(token_allowed(*mask, 200002));  // not finished: no end of generation
}

}  // namespace
}  // namespace inferd::server
