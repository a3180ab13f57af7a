// vLLM's tokenizer endpoints: /tokenize (a prompt, or chat messages rendered
// by the template), /detokenize, and /tokenizer_info (the special tokens'
// text, the context length and the chat template, which
// lm-evaluation-harness's remote tokenizer reads).
#pragma once
#include <utility>

#include <boost/asio/awaitable.hpp>

#include "server/serving_core.h"

namespace inferd::server {

// /tokenize (to_ids) or /detokenize.
boost::asio::awaitable<void> serve_tokenize(ServingCore& core, Exchange& ex, bool to_ids);
boost::asio::awaitable<void> serve_tokenizer_info(ServingCore& core, Exchange& ex);

}  // namespace inferd::server
