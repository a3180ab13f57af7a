// `inferd router`: the prefill/decode router (src/router/router.h). It loads
// no model: it listens, sends each generation request to a prefill instance
// and then a decode instance, and relays the answer. SIGINT or SIGTERM stop
// it: it drains (new generation requests and /health get 503 while relayed
// requests finish, for up to --shutdown-timeout seconds; a second signal cuts
// it short), stops accepting, closes what is left, exits 0.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "router/router.h"
#include "server/http_server.h"

namespace inferd::cli {

namespace {

struct RouterFlags {
  std::vector<std::string> prefill;
  std::vector<std::string> decode;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  int io_threads = 1;
  double prefill_timeout = 60.0;
  double connect_timeout = 5.0;
  double shutdown_timeout = 30.0;  // seconds relayed requests may finish after SIGTERM; 0: close at once
};

int run_router(const RouterFlags& f) {
  // Two descriptors per request (client and instance).
  sigset_t signals = prepare_server_process();
  if (f.port < 0 || f.port > 65535) {
    spdlog::error("--port {} is not a TCP port", f.port);
    return 2;
  }
  router::RouterOptions options;
  options.prefill = f.prefill;
  options.decode = f.decode;
  options.api_key = f.api_key;
  options.prefill_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.prefill_timeout * 1000));
  options.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.connect_timeout * 1000));
  auto created = router::Router::create(options);
  if (!created) {
    spdlog::error("{}", created.error().message);
    return 2;
  }
  router::Router& r = **created;

  server::HttpServerConfig hc;
  hc.host = f.host;
  hc.port = static_cast<uint16_t>(f.port);
  hc.io_threads = f.io_threads;
  auto http = std::make_unique<server::HttpServer>(
      hc, [&r](server::Exchange& ex) { return r.handle(ex); },
      [&r](server::http::status s, std::string_view m, std::string_view) { return r.rejection_body(s, m); });
  if (Status st = http->start(); !st) {
    spdlog::error("{}", st.error().message);
    return 1;
  }
  spdlog::info("router at http://{}:{}: prefill {} instance(s), decode {} instance(s)", f.host, http->port(),
               f.prefill.size(), f.decode.size());
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("{}: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
  r.begin_drain();
  if (f.shutdown_timeout > 0) drain_requests(signals, f.shutdown_timeout, [&r] { return r.in_flight(); });
  http->stop_accepting();
  http->stop(std::chrono::seconds(2));
  return 0;
}

}  // namespace

void register_router(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<RouterFlags>();
  CLI::App* sub = app.add_subcommand(
      "router", "Prefill/decode router: the OpenAI API in front of prefill and decode instances of inferd serve");
  sub->add_option("--prefill", flags->prefill,
                  "Prefill instances (inferd serve --kv-transfer-config '{\"kv_role\": \"kv_producer\"}'), "
                  "as http://host:port")
      ->expected(1, -1);
  sub->add_option("--decode", flags->decode,
                  "Decode instances (inferd serve --kv-transfer-config '{\"kv_role\": \"kv_consumer\"}'), "
                  "as http://host:port")
      ->required()
      ->expected(1, -1);
  sub->add_option("--host", flags->host, "Address to listen on")->capture_default_str();
  sub->add_option("--port", flags->port, "Port to listen on")->capture_default_str();
  sub->add_option("--api-key", flags->api_key,
                  "Require 'Authorization: Bearer KEY' on every route but /health (the header is passed on to the "
                  "instances)");
  sub->add_option("--io-threads", flags->io_threads, "HTTP I/O threads")->capture_default_str();
  sub->add_option("--prefill-timeout", flags->prefill_timeout,
                  "Seconds to wait for a prefill answer; after that the decode instance computes the prompt")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--connect-timeout", flags->connect_timeout, "Seconds to wait for a connection to an instance")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--shutdown-timeout", flags->shutdown_timeout,
                  "Seconds that relayed requests may take to finish after SIGTERM (new ones get 503, /health "
                  "reports draining); then their connections are closed. 0: at once. A second signal ends at once")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->callback([flags, &exit_code] { exit_code = run_router(*flags); });
}

}  // namespace inferd::cli
