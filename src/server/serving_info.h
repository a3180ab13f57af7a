// What the server says about itself: /v1/models (the served model and its
// context length), /version, and /metrics (Prometheus text).
#pragma once
#include <utility>

#include <boost/asio/awaitable.hpp>

#include "server/serving_core.h"

namespace inferd::server {

boost::asio::awaitable<void> serve_models(ServingCore& core, Exchange& ex);
boost::asio::awaitable<void> serve_version(ServingCore& core, Exchange& ex);
boost::asio::awaitable<void> serve_metrics(ServingCore& core, Exchange& ex);

}  // namespace inferd::server
