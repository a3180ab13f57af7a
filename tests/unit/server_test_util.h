// Shared pieces of the server's chat-request tests (server_chat_formats_test,
// server_tool_calling_test): parsing a request that must parse, compiling
// a forced-call grammar and feeding it tokens.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "server/openai_protocol.h"
#include "structured/grammar.h"

namespace inferd::server::test {

// The parsed request; a failure of the test (and an empty request) where it
// does not parse.
inline GenerationRequest chat_ok(const std::string& body) {
  static const ProtocolLimits limits;
  auto r = parse_chat_request(body, limits);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << " -> " << e->message;
    return {};
  }
  return std::get<GenerationRequest>(r);
}

// The Lark grammar compiled; null (and a failure of the test) where either
// step fails.
inline std::shared_ptr<const CompiledGrammar> compile_lark(GrammarCompiler& compiler, const Result<std::string>& lark) {
  EXPECT_TRUE(lark.ok()) << lark.error().message;
  if (!lark.ok()) return nullptr;
  auto g = compiler.compile(GrammarKind::kLark, *lark);
  EXPECT_TRUE(g.ok()) << g.error().message << "\n" << *lark;
  return g.ok() ? *g : nullptr;
}

// Feeds the tokens: whether every one is allowed and the grammar accepts the
// whole.
inline bool grammar_accepts(const CompiledGrammar& g, const std::vector<int32_t>& ids) {
  auto m = g.new_matcher();
  EXPECT_TRUE(m.ok());
  if (!m.ok()) return false;
  for (int32_t id : ids) {
    auto mask = (*m)->compute_mask();
    EXPECT_TRUE(mask.ok());
    if (!mask.ok() || !token_allowed(*mask, id)) return false;
    if (!(*m)->commit(id).ok()) return false;
  }
  return (*m)->is_accepting();
}

}  // namespace inferd::server::test
