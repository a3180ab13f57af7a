// Anthropic's Messages API on the serving core: /v1/messages (whole or
// streamed as Anthropic's events) and /v1/messages/count_tokens. The
// protocol's shapes are in messages_protocol.h; this file renders the
// conversation through the chat path (template, tools, reasoning) and turns
// the model's output into content blocks.
#pragma once
#include <utility>

#include <boost/asio/awaitable.hpp>

#include <string_view>

#include "server/serving_core.h"

namespace inferd::server {

boost::asio::awaitable<void> serve_messages(ServingCore& core, Exchange& ex);
boost::asio::awaitable<void> serve_messages_count_tokens(ServingCore& core, Exchange& ex);

// A path of this API, whose errors (auth, routing) take Anthropic's shape.
bool is_messages_path(std::string_view path);

}  // namespace inferd::server
