#include "server/serving_info.h"

#include <nlohmann/json.hpp>

namespace inferd::server {

using json = nlohmann::json;

namespace {

std::string models_json(const ServingCore& core) {
  json m = {{"id", core.options().served_model_name},
            {"object", "model"},
            {"created", unix_now()},
            {"owned_by", "inferd"},
            {"max_model_len", core.engine().config().max_model_len}};
  return dump_json(json{{"object", "list"}, {"data", json::array({m})}});
}

std::string version_json() { return json{{"version", "inferd 0.1"}}.dump(); }

}  // namespace

boost::asio::awaitable<void> serve_models(ServingCore& core, Exchange& ex) {
  co_await ex.respond(http::status::ok, "application/json", models_json(core));
}

boost::asio::awaitable<void> serve_version(ServingCore&, Exchange& ex) {
  co_await ex.respond(http::status::ok, "application/json", version_json());
}

boost::asio::awaitable<void> serve_metrics(ServingCore& core, Exchange& ex) {
  co_await ex.respond(http::status::ok, "text/plain; version=0.0.4; charset=utf-8", core.metrics_text());
}

}  // namespace inferd::server
