// OpenAI's /v1/embeddings (serving_embedding.cpp) and Jina's /v1/rerank (also
// /rerank, as llama-server serves it; serving_rerank.cpp): each input, or each
// (query, document) pair, is one pooled engine request (the whole input in one
// pass of the model), batched by the engine with the others.
#pragma once
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange

#include <boost/asio/awaitable.hpp>

#include "server/serving_core.h"

namespace inferd::server {

boost::asio::awaitable<void> serve_embeddings(ServingCore& core, Exchange& ex);
boost::asio::awaitable<void> serve_rerank(ServingCore& core, Exchange& ex);

}  // namespace inferd::server
