// OpenAI's Responses API on the serving core: POST /v1/responses (whole or
// streamed as semantic events), GET and DELETE /v1/responses/{id} on the
// stored responses. A request becomes the Chat Completions request it means
// (responses_protocol.h) and is prepared as chat is; the choice's text,
// split by the chat path's parsers (reasoning, tool calls, harmony), comes
// back as reasoning, message and function_call items.
#pragma once
#include <utility>

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstddef>

#include "server/response_store.h"
#include "server/serving_core.h"

namespace inferd::server {

class ResponsesApi {
 public:
  ResponsesApi(ServingCore& core, size_t max_stored, std::chrono::seconds ttl)
      : core_(core), store_(max_stored, ttl) {}

  boost::asio::awaitable<void> create(Exchange& ex);    // POST /v1/responses
  boost::asio::awaitable<void> retrieve(Exchange& ex);  // GET /v1/responses/{id}
  boost::asio::awaitable<void> remove(Exchange& ex);    // DELETE /v1/responses/{id}

 private:
  ServingCore& core_;
  ResponseStore store_;
};

}  // namespace inferd::server
