// The structured-output fields of the OpenAI API, as inferd parses them
// without a model: OpenAI's response_format, vLLM's structured_outputs and
// guided_* fields, llama-server's json_schema and grammar; one constraint per
// request; errors that name the field. (Compilation and generation:
// structured_grammar_test, engine_structured_test and tests/e2e.)
#include <gtest/gtest.h>

#include "server/openai_protocol.h"

namespace inferd::server {
namespace {

const ProtocolLimits kLimits;

GenerationRequest ok(const std::string& fields, bool chat = true) {
  const std::string body = chat ? R"({"messages":[{"role":"user","content":"hi"}],)" + fields + "}"
                                : R"({"prompt":"hi",)" + fields + "}";
  auto r = chat ? parse_chat_request(body, kLimits) : parse_completion_request(body, kLimits);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << " -> " << e->message;
  return std::holds_alternative<GenerationRequest>(r) ? std::get<GenerationRequest>(r) : GenerationRequest{};
}

ApiError error(const std::string& fields, bool chat = true) {
  const std::string body = chat ? R"({"messages":[{"role":"user","content":"hi"}],)" + fields + "}"
                                : R"({"prompt":"hi",)" + fields + "}";
  auto r = chat ? parse_chat_request(body, kLimits) : parse_completion_request(body, kLimits);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(StructuredOutputsProtocol, ResponseFormatOnBothEndpoints) {
  for (bool chat : {true, false}) {
    EXPECT_FALSE(ok(R"("response_format":{"type":"text"})", chat).structured.has_value());
    GenerationRequest j = ok(R"("response_format":{"type":"json_object"})", chat);
    ASSERT_TRUE(j.structured);
    EXPECT_EQ(j.structured->kind, GrammarKind::kJsonObject);
    EXPECT_EQ(j.structured->param, "response_format");
    // The schema's keys keep the client's order (fields are generated in it).
    GenerationRequest s = ok(R"("response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,)"
                             R"("schema":{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}}}})",
                             chat);
    ASSERT_TRUE(s.structured);
    EXPECT_EQ(s.structured->kind, GrammarKind::kJsonSchema);
    EXPECT_EQ(s.structured->text,
              R"({"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}})");
  }
  // No schema (optional in OpenAI's API): any JSON object.
  EXPECT_EQ(ok(R"("response_format":{"type":"json_schema","json_schema":{"name":"x"}})").structured->kind,
            GrammarKind::kJsonObject);
}

TEST(StructuredOutputsProtocol, VllmAndLlamaServerFields) {
  struct Case {
    std::string fields;
    GrammarKind kind;
    std::string text;
    std::string param;
  };
  const std::vector<Case> cases = {
      {R"("structured_outputs":{"json":{"type":"integer"}})", GrammarKind::kJsonSchema, R"({"type":"integer"})",
       "structured_outputs.json"},
      {R"("structured_outputs":{"json":"{\"type\": \"string\", \"b\": 1, \"a\": 2}"})", GrammarKind::kJsonSchema,
       R"({"type":"string","b":1,"a":2})", "structured_outputs.json"},  // a schema given as a string
      {R"("structured_outputs":{"regex":"[0-9]+","backend":"guidance"})", GrammarKind::kRegex, "[0-9]+",
       "structured_outputs.regex"},
      {R"("structured_outputs":{"choice":["a","b\""]})", GrammarKind::kLark, "start: \"a\" | \"b\\\"\"\n",
       "structured_outputs.choice"},
      {R"("structured_outputs":{"grammar":"start: \"x\""})", GrammarKind::kLark, "start: \"x\"",
       "structured_outputs.grammar"},
      {R"("structured_outputs":{"grammar":"root ::= \"x\""})", GrammarKind::kGbnf, "root ::= \"x\"",
       "structured_outputs.grammar"},
      {R"("structured_outputs":{"json_object":true})", GrammarKind::kJsonObject, "", "structured_outputs.json_object"},
      {R"("guided_json":{"type":"boolean"})", GrammarKind::kJsonSchema, R"({"type":"boolean"})", "guided_json"},
      {R"("guided_regex":"a|b")", GrammarKind::kRegex, "a|b", "guided_regex"},
      {R"("guided_choice":["x"])", GrammarKind::kLark, "start: \"x\"\n", "guided_choice"},
      {R"("guided_grammar":"start: /[a-z]+/")", GrammarKind::kLark, "start: /[a-z]+/", "guided_grammar"},
      {R"("json_schema":{"type":"array"})", GrammarKind::kJsonSchema, R"({"type":"array"})", "json_schema"},
      {R"("grammar":"root ::= [a-z]+")", GrammarKind::kGbnf, "root ::= [a-z]+", "grammar"},
  };
  for (const Case& c : cases) {
    for (bool chat : {true, false}) {
      GenerationRequest r = ok(c.fields, chat);
      ASSERT_TRUE(r.structured) << c.fields;
      EXPECT_EQ(r.structured->kind, c.kind) << c.fields;
      EXPECT_EQ(r.structured->text, c.text) << c.fields;
      EXPECT_EQ(r.structured->param, c.param) << c.fields;
    }
  }
}

TEST(StructuredOutputsProtocol, DisableAnyWhitespaceBecomesLlguidanceOption) {
  GenerationRequest r = ok(R"("structured_outputs":{"json":{"type":"object"},"disable_any_whitespace":true})");
  ASSERT_TRUE(r.structured);
  EXPECT_EQ(r.structured->text, R"({"type":"object","x-guidance":{"whitespace_flexible":false}})");
  GenerationRequest any = ok(R"("structured_outputs":{"json_object":true,"disable_any_whitespace":true})");
  EXPECT_EQ(any.structured->kind, GrammarKind::kJsonSchema);
  EXPECT_EQ(any.structured->text, R"({"type":"object","x-guidance":{"whitespace_flexible":false}})");
}

TEST(StructuredOutputsProtocol, BadFieldsAreRefusedNamingThem) {
  struct Case {
    std::string fields;
    std::string param;
    std::string message_part;
  };
  const std::vector<Case> cases = {
      {R"("response_format":{"type":"json_object"},"guided_regex":"a")", "guided_regex", "only one structured output"},
      {R"("json_schema":{"type":"object"},"grammar":"root ::= \"a\"")", "grammar", "only one structured output"},
      {R"("structured_outputs":{"regex":"a","choice":["b"]})", "structured_outputs.regex", "only one"},
      {R"("response_format":{"type":"xml"})", "response_format", "'xml'"},
      {R"("response_format":"json")", "response_format", "must be an object"},
      {R"("response_format":{"type":"json_schema"})", "response_format", "'schema'"},
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":[1]}})",
       "response_format.json_schema.schema", "JSON schema"},
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":{},"strict":"yes"}})", "response_format",
       "strict"},
      {R"("structured_outputs":{"json":"{not json"})", "structured_outputs.json", "not valid JSON"},
      {R"("structured_outputs":{"regex":5})", "structured_outputs.regex", "must be a string"},
      {R"("structured_outputs":{"regex":""})", "structured_outputs.regex", "must not be empty"},
      {R"("structured_outputs":{"choice":[]})", "structured_outputs.choice", "non-empty array"},
      {R"("structured_outputs":{"choice":["a",""]})", "structured_outputs.choice", "empty string"},
      {R"("structured_outputs":{"structural_tag":"x"})", "structured_outputs.structural_tag", "not supported"},
      {R"("structured_outputs":[1])", "structured_outputs", "must be an object"},
      {R"("guided_choice":"a")", "guided_choice", "non-empty array"},
      {R"("guided_whitespace_pattern":" ")", "guided_whitespace_pattern", "not supported"},
      {R"("grammar":7)", "grammar", "must be a string"},
  };
  for (const Case& c : cases) {
    ApiError e = error(c.fields);
    EXPECT_EQ(e.status, 400) << c.fields;
    EXPECT_EQ(e.param, c.param) << c.fields << " -> " << e.message;
    EXPECT_NE(e.message.find(c.message_part), std::string::npos) << c.fields << " -> " << e.message;
  }
}

}  // namespace
}  // namespace inferd::server
