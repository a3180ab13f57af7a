// Tool calling on /v1/chat/completions, the parts between the protocol and
// the engine: the grammar that forces a call (tool_choice "required" or a
// named function) and the ids of the calls returned.
#pragma once
#include <string>
#include <vector>

#include "chat/tool_calls.h"
#include "core/result.h"
#include "server/openai_protocol.h"

namespace inferd::server {

// A Lark grammar (llguidance's dialect) that admits exactly a call in the
// model's format to one of `tools` (only to `only` when it is not empty),
// with arguments valid against the function's parameter schema; with
// `parallel`, one or more calls. hermes: <tool_call>\n{"name", "arguments"}\n</tool_call>
// (calls separated by a newline); llama3_json: {"name", "parameters"}
// (calls separated by "; "). Mistral's format is refused: its calls begin with
// a control token, which inferd cannot check without a Mistral model.
Result<std::string> forced_tool_call_grammar(ToolCallFormat format, const std::vector<ToolSpec>& tools,
                                             const std::string& only, bool parallel);

// "call_" and 24 random letters and digits.
std::string new_tool_call_id();

// A chat template supports tools when it reads the variable `tools` at all.
bool template_supports_tools(const std::string& template_source);

}  // namespace inferd::server
