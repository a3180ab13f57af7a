// ChatTemplate: byte-identical to llama.cpp's renderings of real model
// templates (tests/data/chat, made by tools/reference/chat_reference.py), and
// the Hugging Face semantics and sandbox limits of the renderer.
#include "chat/chat_template.h"
#include "chat/reasoning.h"
#include "test_data.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace inferd {
namespace {

using Json = nlohmann::json;

std::string data_path(const std::string& name) { return inferd::test::test_data_root() + "/chat/" + name; }

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f) << "missing test data " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<ChatMessage> to_messages(const Json& list) {
  std::vector<ChatMessage> out;
  for (const Json& m : list) out.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
  return out;
}

// Renders a template that needs no messages.
Result<std::string> render_source(const std::string& source, ChatTemplateOptions options = {}) {
  return ChatTemplate(source).render({}, options);
}

std::string render_ok(const std::string& source, const std::vector<ChatMessage>& messages = {},
                      ChatTemplateOptions options = {}) {
  Result<std::string> r = ChatTemplate(source).render(messages, options);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : "";
}

// Every case of a reference file renders byte for byte as llama.cpp's Jinja2 did.
void expect_reference_cases(const std::string& source, const Json& ref) {
  ASSERT_FALSE(ref.at("cases").empty());
  ChatTemplate tmpl(source);
  for (const Json& c : ref.at("cases")) {
    ChatTemplateOptions options;
    options.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    options.bos_token = ref.at("bos_token").get<std::string>();
    options.eos_token = ref.at("eos_token").get<std::string>();
    Result<std::string> got = tmpl.render(to_messages(c.at("messages")), options);
    ASSERT_TRUE(got.ok()) << c.at("name") << ": " << got.error().message;
    EXPECT_EQ(got.value(), c.at("expected").get<std::string>()) << c.at("name");
  }
}

TEST(ChatTemplate, SmolLM2MatchesLlamaCppReference) {
  const Json ref = Json::parse(read_text(data_path("smollm2_three_turn.json")));
  expect_reference_cases(ref.at("template").get<std::string>(), ref);
}

TEST(ChatTemplate, Gemma3MatchesLlamaCppReference) {
  const Json ref = Json::parse(read_text(data_path("gemma3_cases.json")));
  const std::string source = read_text(data_path("gemma3.jinja"));
  expect_reference_cases(source, ref);
  for (const Json& c : ref.at("error_cases")) {
    ChatTemplateOptions options;
    options.bos_token = ref.at("bos_token").get<std::string>();
    Result<std::string> got = ChatTemplate(source).render(to_messages(c.at("messages")), options);
    ASSERT_FALSE(got.ok()) << c.at("name");
    EXPECT_NE(got.error().message.find(c.at("error").get<std::string>()), std::string::npos)
        << got.error().message;
  }
}

TEST(ChatTemplate, Qwen25MatchesLlamaCppReference) {
  const Json ref = Json::parse(read_text(data_path("qwen2.5_cases.json")));
  expect_reference_cases(ref.at("template").get<std::string>(), ref);
}

// Qwen3.5's template (qwen3.5.jinja): every case as Jinja2 renders it, the
// enable_thinking=false ones with that variable; its generation prompt opens
// the thinking (so the output starts inside it, split as the deepseek_r1 way
// of reasoning.h does) or, with thinking off, closes it (nothing to split).
TEST(ChatTemplate, Qwen35MatchesJinja2ReferenceAndItsThinkingSplits) {
  const Json ref = Json::parse(read_text(data_path("qwen3.5_cases.json")));
  const std::string source = read_text(data_path("qwen3.5.jinja"));
  ASSERT_TRUE(template_thinks(source));
  ChatTemplate tmpl(source);
  ASSERT_GE(ref.at("cases").size(), 5u);
  for (const Json& c : ref.at("cases")) {
    ChatTemplateOptions options;
    options.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    options.bos_token = ref.at("bos_token").get<std::string>();
    options.eos_token = ref.at("eos_token").get<std::string>();
    if (!c.at("extra_context").empty()) options.extra_context_json = c.at("extra_context").dump();
    Result<std::string> got = tmpl.render(to_messages(c.at("messages")), options);
    ASSERT_TRUE(got.ok()) << c.at("name") << ": " << got.error().message;
    EXPECT_EQ(got.value(), c.at("expected").get<std::string>()) << c.at("name");
    const bool thinking_off = c.at("extra_context").contains("enable_thinking");
    const PromptThinking where = prompt_thinking(got.value());
    if (!options.add_generation_prompt) EXPECT_EQ(where, PromptThinking::kNone) << c.at("name");
    else EXPECT_EQ(where, thinking_off ? PromptThinking::kClosed : PromptThinking::kOpen) << c.at("name");
  }
  // An output after the open <think>: its thinking becomes reasoning_content.
  const ReasoningDelta split = parse_reasoning(true, "The user asks about Italy.\n</think>\n\nRome.");
  EXPECT_EQ(split.reasoning, "The user asks about Italy.");
  EXPECT_EQ(split.content, "Rome.");
}

TEST(ChatTemplate, Qwen25InsertsItsDefaultSystemPrompt) {
  // Without a system message Qwen2.5's template opens with its own; with one, it
  // uses that instead, and a later system message stays where it is.
  const Json ref = Json::parse(read_text(data_path("qwen2.5_cases.json")));
  ChatTemplate tmpl(ref.at("template").get<std::string>());
  const std::string header = "<|im_start|>system\n" + ref.at("default_system").get<std::string>() + "<|im_end|>\n";
  Result<std::string> plain = tmpl.render({{"user", "Hi"}}, {});
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_EQ(plain.value(), header + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  Result<std::string> own = tmpl.render({{"system", "Be brief."}, {"user", "Hi"}}, {});
  ASSERT_TRUE(own.ok()) << own.error().message;
  EXPECT_EQ(own.value().find(ref.at("default_system").get<std::string>()), std::string::npos);
  EXPECT_EQ(own.value().rfind("<|im_start|>system\nBe brief.<|im_end|>\n", 0), 0u);
}

TEST(ChatTemplate, AddGenerationPromptAppendsAssistantHeader) {
  const Json ref = Json::parse(read_text(data_path("smollm2_three_turn.json")));
  ChatTemplate tmpl(ref.at("template").get<std::string>());
  const std::vector<ChatMessage> messages = {{"user", "Hi"}};
  ChatTemplateOptions on;
  ChatTemplateOptions off;
  off.add_generation_prompt = false;
  Result<std::string> with = tmpl.render(messages, on);
  Result<std::string> without = tmpl.render(messages, off);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_EQ(with.value(), without.value() + "<|im_start|>assistant\n");
  EXPECT_EQ(without.value().rfind("<|im_start|>user\nHi<|im_end|>\n"),
            without.value().size() - std::string("<|im_start|>user\nHi<|im_end|>\n").size());
}

TEST(ChatTemplate, PassesBosEosAndMessagesInOrder) {
  ChatTemplateOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  const std::string out = render_ok(
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m['content'] }}|{{ m|tojson }}]{% endfor %}{{ eos_token }}",
      {{"user", "a\"b"}, {"assistant", "é"}}, options);
  // Keys keep their order (role, content) as Python dicts do; tojson leaves
  // non-ASCII alone (ensure_ascii=False, as HF sets it).
  EXPECT_EQ(out,
            "<s>[user:a\"b|{\"role\": \"user\", \"content\": \"a\\\"b\"}]"
            "[assistant:é|{\"role\": \"assistant\", \"content\": \"é\"}]</s>");
}

TEST(ChatTemplate, RaiseExceptionBecomesErrorWithItsMessage) {
  Result<std::string> r = ChatTemplate(
                              "{% for m in messages %}{% if m.role == 'system' %}"
                              "{{ raise_exception('System role not supported') }}{% endif %}{% endfor %}")
                              .render({{"system", "x"}}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("raised an exception"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("System role not supported"), std::string::npos) << r.error().message;
}

TEST(ChatTemplate, SyntaxErrorsAreErrors) {
  for (const char* bad : {"{% if messages %}never closed", "{{ messages[ }}", "{% endfor %}", "{{ 1 +* 2 }}"}) {
    Result<std::string> r = render_source(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find("chat template error"), std::string::npos) << r.error().message;
  }
}

TEST(ChatTemplate, RuntimeErrorsAreErrors) {
  EXPECT_FALSE(render_source("{{ messages | no_such_filter }}").ok());
  EXPECT_FALSE(render_source("{{ 1 + 'a' }}").ok());
  EXPECT_FALSE(render_source("{% include 'other.jinja' %}").ok());  // no file access
  EXPECT_FALSE(render_source("{% import 'macros.jinja' as m %}").ok());
}

// Runs `source` with the default limits and checks it fails for `reason`.
// (No timing assertion: these loops would run for hours without the limit, so
// finishing at all shows the limit worked; ctest's timeout catches a hang.)
void expect_fails_fast(const std::string& source, const std::string& reason) {
  Result<std::string> r = render_source(source);
  ASSERT_FALSE(r.ok()) << source;
  EXPECT_NE(r.error().message.find(reason), std::string::npos) << r.error().message;
}

TEST(ChatTemplate, FuelStopsEndlessLoops) {
  // 10^10 iterations: only the step limit can stop this.
  expect_fails_fast("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                    "ran out of fuel");
  expect_fails_fast("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
                    "ran out of fuel");
  // A single huge range is refused outright by the engine.
  expect_fails_fast("{% for i in range(100000000) %}x{% endfor %}", "chat template error");
  // Unbounded recursion hits the recursion limit.
  expect_fails_fast("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "chat template error");
}

TEST(ChatTemplate, SmallFuelBudgetIsEnforced) {
  ChatTemplateOptions options;
  options.limits.fuel = 1000;
  Result<std::string> r = render_source("{% for i in range(10000) %}{% endfor %}", options);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("ran out of fuel"), std::string::npos) << r.error().message;
  EXPECT_TRUE(render_source("{% for i in range(10) %}{% endfor %}ok", options).ok());
}

TEST(ChatTemplate, FuelGrowsWithTheConversation) {
  // Each message adds fuel_per_message to the budget, so long conversations
  // are not cut off by a limit meant for runaway loops.
  ChatTemplateOptions options;
  options.limits.fuel = 1000;
  options.limits.fuel_per_message = 1000;
  const std::string loop = "{% for i in range(5000) %}{% endfor %}{{ messages | length }}";
  EXPECT_FALSE(ChatTemplate(loop).render({{"user", "x"}}, options).ok());
  EXPECT_EQ(ChatTemplate(loop).render(std::vector<ChatMessage>(30, {"user", "x"}), options).value(), "30");
  // The default budget is ample for a real template over a long conversation.
  const Json ref = Json::parse(read_text(data_path("smollm2_three_turn.json")));
  std::vector<ChatMessage> many;
  for (int i = 0; i < 10000; ++i) many.push_back({i % 2 ? "assistant" : "user", "turn " + std::to_string(i)});
  Result<std::string> long_chat = ChatTemplate(ref.at("template").get<std::string>()).render(many, {});
  ASSERT_TRUE(long_chat.ok()) << long_chat.error().message;
  EXPECT_NE(long_chat.value().find("turn 9999<|im_end|>"), std::string::npos);
}

TEST(ChatTemplate, OutputSizeIsBounded) {
  ChatTemplateOptions options;
  options.limits.max_output_bytes = 1000;
  Result<std::string> r = render_source("{% for i in range(5000) %}x{% endfor %}", options);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("too large"), std::string::npos) << r.error().message;
  EXPECT_EQ(render_source("{% for i in range(1000) %}x{% endfor %}", options).value(), std::string(1000, 'x'));
}

TEST(ChatTemplate, UnknownVariablesAreLenientLikeJinja2) {
  EXPECT_EQ(render_ok("[{{ nothing }}]"), "[]");
  EXPECT_EQ(render_ok("{% if nothing %}yes{% else %}no{% endif %}"), "no");
  EXPECT_EQ(render_ok("{% for x in nothing %}x{% endfor %}done"), "done");
  EXPECT_EQ(render_ok("{{ nothing is defined }} {{ bos_token is defined }}"), "False True");
  EXPECT_EQ(render_ok("{{ nothing | default('fallback') }}"), "fallback");
  EXPECT_EQ(render_ok("{% if messages[0] is defined %}x{% endif %}{{ messages | length }}"), "0");
  // Like Jinja2's default Undefined, an attribute of an undefined value fails.
  EXPECT_FALSE(render_source("{{ nothing.attribute }}").ok());
}

TEST(ChatTemplate, WhitespaceControlLikeHuggingFace) {
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the
  // indentation before it goes; output tags keep their surroundings.
  const std::string source =
      "{% for m in messages %}\n"
      "    {% if m.role == 'user' %}\n"
      "  <{{ m.content }}>\n"
      "    {% endif %}\n"
      "{% endfor %}\n";
  EXPECT_EQ(render_ok(source, {{"user", "a"}, {"assistant", "b"}, {"user", "c"}}), "  <a>\n  <c>\n");
  // keep_trailing_newline=False: one trailing newline of the template is dropped.
  EXPECT_EQ(render_ok("x\n"), "x");
  EXPECT_EQ(render_ok("x\n\n"), "x\n");
  EXPECT_EQ(render_ok("{{- ' a ' -}}\n"), " a ");
}

TEST(ChatTemplate, PythonMethodsAndLoopControls) {
  EXPECT_EQ(render_ok("{{ '  hi  '.strip() }}|{{ 'abc'.startswith('ab') }}|{{ 'a,b'.split(',') | join('+') }}"
                      "|{{ 'X'.lower() }}|{{ 'a b'.replace(' ', '_') }}"),
            "hi|True|a+b|x|a_b");
  ChatTemplateOptions options;
  options.extra_context_json = R"({"d": {"z": 1, "a": 2}})";
  EXPECT_EQ(render_ok("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {}, options), "z=1;a=2;");
  EXPECT_EQ(render_ok("{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}"
                      "{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}"),
            "02");
  EXPECT_EQ(render_ok("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}"
                      "{{ ns.n }}"),
            "6");
  // HF's {% generation %} tag renders its body.
  EXPECT_EQ(render_ok("a{% generation %}b{% endgeneration %}c"), "abc");
}

TEST(ChatTemplate, ToJsonIsPythonJsonDumps) {
  ChatTemplateOptions options;
  options.extra_context_json =
      R"({"tools": [{"name": "get_weather", "parameters": {"city": {"type": "string"}, "days": 3, "x": 0.5, "n": null, "ok": true}}]})";
  EXPECT_EQ(render_ok("{{ tools | tojson }}", {}, options),
            R"([{"name": "get_weather", "parameters": {"city": {"type": "string"}, "days": 3, "x": 0.5, "n": null, "ok": true}}])");
  EXPECT_EQ(render_ok("{{ tools[0].parameters.city | tojson(indent=2) }}", {}, options),
            "{\n  \"type\": \"string\"\n}");
  EXPECT_EQ(render_ok("{{ {'b': 1, 'a': '<é>'} | tojson(sort_keys=true, ensure_ascii=true) }}"),
            R"({"a": "<\u00e9>", "b": 1})");
  EXPECT_EQ(render_ok("{{ [1, 2] | tojson(separators=(',', ':')) }}"), "[1,2]");
}

TEST(ChatTemplate, StrftimeNowUsesLocalTime) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char year[8];
  std::strftime(year, sizeof year, "%Y", &local);
  EXPECT_EQ(render_ok("{{ strftime_now('%Y') }}"), year);
  EXPECT_EQ(render_ok("{{ strftime_now('%d %B %Y') | length > 8 }}"), "True");
}

TEST(ChatTemplate, ExtraContextOverridesAndIsValidated) {
  ChatTemplateOptions options;
  options.extra_context_json = R"({"add_generation_prompt": false, "enable_thinking": true})";
  EXPECT_EQ(render_ok("{{ add_generation_prompt }} {{ enable_thinking }}", {}, options), "False True");
  options.extra_context_json = "[1, 2]";
  EXPECT_FALSE(render_source("x", options).ok());
  options.extra_context_json = "{not json";
  EXPECT_FALSE(render_source("x", options).ok());
}

TEST(ChatTemplate, RenderJsonTakesRichMessages) {
  ChatTemplate tmpl("{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}");
  Result<std::string> r =
      tmpl.render_json(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value(), "ab");
  EXPECT_FALSE(tmpl.render_json("[]").ok());
  EXPECT_FALSE(tmpl.render_json("").ok());
}

TEST(ChatTemplate, InvalidUtf8IsRejected) {
  Result<std::string> r = ChatTemplate("{{ messages[0].content }}").render({{"user", "bad \xff byte"}}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("UTF-8"), std::string::npos) << r.error().message;
  EXPECT_FALSE(render_source("bad \xff template").ok());
}

TEST(ChatTemplate, EmbeddedNulSurvives) {
  EXPECT_EQ(render_ok("[{{ messages[0].content }}]", {{"user", std::string("a\0b", 3)}}), std::string("[a\0b]", 5));
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("inferd_chat_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::filesystem::path dir_;
};

using ChatTemplateSelect = TempDir;

TEST_F(ChatTemplateSelect, UserFileWinsOverModelTemplate) {
  const std::string path = write("mine.jinja", "mine {{ bos_token }}\n");
  Result<ChatTemplate> t = select_chat_template("from gguf", path);
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->source(), "mine {{ bos_token }}\n");
  Result<ChatTemplate> g = select_chat_template("from gguf", "");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->source(), "from gguf");
}

TEST_F(ChatTemplateSelect, MissingTemplateIsAnError) {
  Result<ChatTemplate> none = select_chat_template("", "");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("tokenizer.chat_template"), std::string::npos);
  EXPECT_FALSE(select_chat_template("x", (dir_ / "does_not_exist.jinja").string()).ok());
}

TEST_F(ChatTemplateSelect, ReadsHuggingFaceConfigFiles) {
  Result<std::string> plain = read_chat_template_file(write("tokenizer_config.json", R"({"chat_template": "T1"})"));
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_EQ(plain.value(), "T1");
  Result<std::string> named = read_chat_template_file(write(
      "chat_template.json",
      R"({"chat_template": [{"name": "tool_use", "template": "T2"}, {"name": "default", "template": "T3"}]})"));
  ASSERT_TRUE(named.ok()) << named.error().message;
  EXPECT_EQ(named.value(), "T3");
  EXPECT_FALSE(read_chat_template_file(write("no_key.json", R"({"bos_token": "<s>"})")).ok());
  EXPECT_FALSE(read_chat_template_file(write("broken.json", "{")).ok());
  EXPECT_FALSE(
      read_chat_template_file(write("ambiguous.json", R"({"chat_template": [{"name": "a", "template": "A"}, {"name": "b", "template": "B"}]})"))
          .ok());
}

}  // namespace
}  // namespace inferd
