// What llama.cpp's own chat-output parsers (common/chat.cpp: the gpt-oss and
// Qwen3-Coder PEG parsers that llama-server uses) make of model outputs, for
// tests/unit/chat_harmony_test.cpp (AgreesWithLlamaCpp).
//
// Input: a JSON file {"tools": [...OpenAI tools...], "cases": [{"format":
// "harmony" | "qwen3_coder", "output": TEXT after the generation prompt,
// "why": where inferd means to differ, optional}]}. Each case is parsed as
// llama-server parses a non-streamed answer (reasoning_format auto, tools
// offered with tool_choice auto) with the template of its format
// (tests/data/chat/gpt_oss.jinja, qwen3_coder.jinja, llama.cpp's vendored
// copies). Output, on stdout: the same file with "llamacpp": {"reasoning",
// "content", "calls": [[name, arguments]]} (or {"error"}) added per case.
//
// Build against a llama.cpp build (libllama-common), from the repository root:
//   L=~/.cache/inferd/llama.cpp
//   g++ -std=c++17 -I$L/src/common -I$L/src/include -I$L/src/ggml/include -I$L/src/vendor \
//       tools/reference/chat_parsers_llamacpp.cpp -L$L/build/bin -lllama-common -lllama \
//       -Wl,-rpath,$L/build/bin -o /tmp/chat_parsers_llamacpp
//   /tmp/chat_parsers_llamacpp tests/data/chat > tests/data/chat/output_parsers_llamacpp.json
// (reads tests/data/chat/output_parsers_cases.json and the two templates).
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "chat.h"
#include "peg-parser.h"

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: chat_parsers_llamacpp DATA_DIR (tests/data/chat)\n";
    return 2;
  }
  const std::string dir = argv[1];
  nlohmann::ordered_json file = nlohmann::ordered_json::parse(slurp(dir + "/output_parsers_cases.json"));
  for (const char* format : {"harmony", "qwen3_coder"}) {
    const std::string tmpl = slurp(dir + (std::string(format) == "harmony" ? "/gpt_oss.jinja" : "/qwen3_coder.jinja"));
    auto tmpls = common_chat_templates_init(nullptr, tmpl);
    common_chat_templates_inputs in;
    common_chat_msg user;
    user.role = "user";
    user.content = "hi";
    in.messages = {user};
    for (const auto& t : file["tools"])
      in.tools.push_back({t["function"]["name"].get<std::string>(), t["function"].value("description", ""),
                          t["function"]["parameters"].dump()});
    in.tool_choice = COMMON_CHAT_TOOL_CHOICE_AUTO;
    in.reasoning_format = COMMON_REASONING_FORMAT_AUTO;
    in.parallel_tool_calls = true;
    common_chat_params params;
    try {
      params = common_chat_templates_apply(tmpls.get(), in);
    } catch (const std::exception& e) {
      std::cerr << format << ": the template failed: " << e.what() << "\n";
      return 1;
    }
    common_peg_arena arena;
    arena.load(params.parser);
    common_chat_parser_params pp(params);
    pp.reasoning_format = COMMON_REASONING_FORMAT_AUTO;
    for (auto& c : file["cases"]) {
      if (c["format"] != format) continue;
      nlohmann::ordered_json out;
      try {
        const common_chat_msg m = common_chat_peg_parse(arena, c["output"].get<std::string>(), false, pp);
        out["reasoning"] = m.reasoning_content;
        out["content"] = m.content;
        out["calls"] = nlohmann::ordered_json::array();
        for (const auto& tc : m.tool_calls) out["calls"].push_back({tc.name, tc.arguments});
      } catch (const std::exception& e) {
        out["error"] = e.what();
      }
      c["llamacpp"] = std::move(out);
    }
  }
  std::cout << file.dump(1, ' ', false) << "\n";
  return 0;
}
