// OpenAI's Completions API (/v1/completions): prompts as text or token ids,
// echo, logprobs and vLLM's prompt_logprobs, on the serving core.
#pragma once
#include <utility>

#include <boost/asio/awaitable.hpp>

#include <string>
#include <variant>

#include "server/serving_core.h"

namespace inferd::server {

// Worker thread: the body parsed and validated, its prompts tokenized and checked.
std::variant<PreparedGeneration, ApiError> prepare_completion(const ServingCore& core, const std::string& body);

boost::asio::awaitable<void> serve_completions(ServingCore& core, Exchange& ex);

}  // namespace inferd::server
