// Tool calling on /v1/chat/completions, the parts between the protocol and
// the engine: the grammar that forces a call (tool_choice "required" or a
// named function) and the ids of the calls returned.
#pragma once
#include <string>
#include <vector>

#include "chat/tool_calls.h"
#include "core/result.h"
#include "server/openai_protocol.h"
#include "tokenizer/tokenizer.h"

namespace inferd::server {

// A Lark grammar (llguidance's dialect) that admits exactly a call in the
// model's format to one of `tools` (only to `only` when it is not empty),
// with arguments valid against the function's parameter schema; with
// `parallel`, one or more calls. hermes: <tool_call>\n{"name", "arguments"}\n</tool_call>
// (calls separated by a newline); llama3_json: {"name", "parameters"}
// (calls separated by "; "); mistral: [TOOL_CALLS], an optional space, then a
// JSON array of {"name", "arguments"} (one item, or with `parallel` one or
// more); qwen3_coder: <tool_call>\n<function=NAME>\n, each parameter as
// <parameter=KEY>\nVALUE\n</parameter>\n (the schema's required ones, its
// others optionally, in its order; a string's value any text, any other
// JSON valid against its schema), </function>\n</tool_call> (calls separated
// by a newline); harmony (gpt-oss): free analysis and commentary messages,
// then one message to functions.NAME whose body is the arguments' JSON (one
// call: <|call|> ends the output). `marker_token` is the id of the vocabulary's control token for the
// format's marker (tool_call_marker_token), matched as that token; -1: the
// marker is matched as text.
Result<std::string> forced_tool_call_grammar(ToolCallFormat format, const std::vector<ToolSpec>& tools,
                                             const std::string& only, bool parallel, int32_t marker_token = -1);

// Structured output under gpt-oss's harmony format: free analysis messages,
// then the final message's header and a body valid against the JSON schema
// (kJsonSchema, kJsonObject; other kinds are refused): the constraint applies
// to the final channel only, as llama-server's gpt-oss grammar does.
Result<std::string> harmony_final_grammar(GrammarKind kind, const std::string& text);

// The control token whose text is the marker that opens the format's calls
// (mistral's [TOOL_CALLS]); -1 for the other formats, whose markers are text
// (Qwen2.5's <tool_call> is a user-defined token, which the detokenizer keeps),
// and where the vocabulary has no such control token.
int32_t tool_call_marker_token(ToolCallFormat format, const Tokenizer& tokenizer);

// "call_" and 24 random letters and digits.
std::string new_tool_call_id();

// A chat template supports tools when it reads the variable `tools` at all.
bool template_supports_tools(const std::string& template_source);

}  // namespace inferd::server
