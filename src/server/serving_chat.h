// OpenAI's Chat Completions API (/v1/chat/completions): messages rendered by
// the chat template, tools and their calls, reasoning (reasoning_content),
// gpt-oss's harmony channels, streamed as chat.completion.chunk deltas.
#pragma once
#include <utility>

#include <boost/asio/awaitable.hpp>

#include <string>
#include <variant>

#include "server/serving_core.h"

namespace inferd::server {

// Worker thread: the body parsed and validated, its messages rendered and
// tokenized, its tools and structured output prepared.
std::variant<PreparedGeneration, ApiError> prepare_chat(const ServingCore& core, const std::string& body);

boost::asio::awaitable<void> serve_chat_completions(ServingCore& core, Exchange& ex);

}  // namespace inferd::server
