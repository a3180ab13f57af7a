#include "bench/http_client.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <cstdlib>
#include <limits>
#include <optional>
#include <vector>

namespace inferd::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr size_t kErrorBodyShown = 300;

std::string describe(const char* what, const beast::error_code& ec) {
  return std::string(what) + ": " + ec.message();
}

// Errors that mean a kept-alive connection was closed by the server before
// it saw our request; the request can safely go again on a new connection.
bool stale_connection(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
         ec == asio::error::connection_aborted;
}

}  // namespace

struct HttpClient::Impl {
  asio::any_io_executor executor;
  BaseUrl base;
  std::chrono::milliseconds timeout;
  std::optional<tcp::resolver::results_type> endpoints;  // resolved once
  std::vector<std::unique_ptr<beast::tcp_stream>> idle;  // kept-alive connections
  std::string authorization;                             // "Bearer ..." from OPENAI_API_KEY

  struct Connection {
    std::unique_ptr<beast::tcp_stream> stream;
    bool reused = false;
  };

  asio::awaitable<Result<Connection>> acquire(bool allow_reuse) {
    if (allow_reuse && !idle.empty()) {
      Connection c{std::move(idle.back()), true};
      idle.pop_back();
      co_return c;
    }
    beast::error_code ec;
    if (!endpoints) {
      tcp::resolver resolver(executor);
      auto found = co_await resolver.async_resolve(base.host, base.port,
                                                   asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return make_error(describe(("cannot resolve " + base.host).c_str(), ec));
      endpoints = std::move(found);
    }
    auto stream = std::make_unique<beast::tcp_stream>(executor);
    stream->expires_after(timeout);
    co_await stream->async_connect(*endpoints, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return make_error(describe(("cannot connect to " + base.host_header()).c_str(), ec));
    // Requests are one small write each; do not let Nagle hold them back.
    stream->socket().set_option(tcp::no_delay(true), ec);
    co_return Connection{std::move(stream), false};
  }

  http::request<http::string_body> make_request(http::verb verb, std::string_view endpoint,
                                                std::string body) const {
    http::request<http::string_body> req{verb, base.target(endpoint), 11};
    req.set(http::field::host, base.host_header());
    req.set(http::field::user_agent, "inferd-bench");
    if (!authorization.empty()) req.set(http::field::authorization, authorization);
    if (verb == http::verb::post) {
      req.set(http::field::content_type, "application/json");
      req.set(http::field::accept, "text/event-stream, application/json");
      req.body() = std::move(body);
    }
    req.keep_alive(true);
    req.prepare_payload();
    return req;
  }

  // Sends `req` and reads the response head. nullopt and `ec` set on failure.
  // `received_nothing` tells whether the failure came before any response byte.
  asio::awaitable<void> exchange_head(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                                      http::request<http::string_body>& req,
                                      http::response_parser<http::buffer_body>& parser,
                                      beast::error_code& ec) {
    stream.expires_after(timeout);
    co_await http::async_write(stream, req, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return;
    stream.expires_after(timeout);
    co_await http::async_read_header(stream, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
  }

  // Reads the rest of the body, piece by piece as the socket delivers it.
  asio::awaitable<void> read_body(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                                  http::response_parser<http::buffer_body>& parser,
                                  const BodyHandler& on_piece, beast::error_code& ec) {
    char chunk[16384];
    while (!parser.is_done()) {
      parser.get().body().data = chunk;
      parser.get().body().size = sizeof chunk;
      stream.expires_after(timeout);
      co_await http::async_read_some(stream, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
      const Clock::time_point received = Clock::now();
      if (ec == http::error::need_buffer) ec = {};  // our piece buffer filled up: hand it over
      const size_t got = sizeof chunk - parser.get().body().size;
      if (got > 0) on_piece(std::string_view(chunk, got), received);
      if (ec) co_return;
    }
  }
};

HttpClient::HttpClient(asio::any_io_executor executor, BaseUrl base, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->executor = std::move(executor);
  impl_->base = std::move(base);
  impl_->timeout = timeout;
  if (const char* key = std::getenv("OPENAI_API_KEY"); key && *key)
    impl_->authorization = std::string("Bearer ") + key;
}

HttpClient::~HttpClient() = default;

asio::awaitable<Status> HttpClient::post_json(std::string endpoint, std::string body, BodyHandler on_body) {
  Impl& im = *impl_;
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto conn = co_await im.acquire(/*allow_reuse=*/attempt == 0);
    if (!conn) co_return conn.error();
    beast::tcp_stream& stream = *conn->stream;
    beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // a long stream is not an attack here
    auto req = im.make_request(http::verb::post, endpoint, body);
    beast::error_code ec;
    co_await im.exchange_head(stream, buffer, req, parser, ec);
    if (ec) {
      if (conn->reused && stale_connection(ec)) continue;
      co_return make_error(describe("request failed", ec));
    }
    const unsigned status = parser.get().result_int();
    if (status != 200) {
      std::string text;
      co_await im.read_body(stream, buffer, parser,
                            [&](std::string_view piece, Clock::time_point) {
                              if (text.size() < kErrorBodyShown) text += piece.substr(0, kErrorBodyShown - text.size());
                            },
                            ec);
      co_return make_error("HTTP " + std::to_string(status) + ": " + text);
    }
    co_await im.read_body(stream, buffer, parser, on_body, ec);
    // A body that ends with the connection (no length, not chunked) ends in eof.
    if (ec && !(ec == http::error::end_of_stream && parser.is_done()))
      co_return make_error(describe("reading the response failed", ec));
    if (parser.is_done() && parser.keep_alive()) im.idle.push_back(std::move(conn->stream));
    co_return Status{};
  }
  co_return make_error("request failed: the server closed the connection");
}

asio::awaitable<Result<std::string>> HttpClient::get(std::string endpoint) {
  Impl& im = *impl_;
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto conn = co_await im.acquire(attempt == 0);
    if (!conn) co_return conn.error();
    beast::tcp_stream& stream = *conn->stream;
    beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    auto req = im.make_request(http::verb::get, endpoint, {});
    beast::error_code ec;
    co_await im.exchange_head(stream, buffer, req, parser, ec);
    if (ec) {
      if (conn->reused && stale_connection(ec)) continue;
      co_return make_error(describe("request failed", ec));
    }
    std::string text;
    co_await im.read_body(stream, buffer, parser,
                          [&](std::string_view piece, Clock::time_point) { text += piece; }, ec);
    if (ec && !(ec == http::error::end_of_stream && parser.is_done()))
      co_return make_error(describe("reading the response failed", ec));
    const unsigned status = parser.get().result_int();
    if (status != 200)
      co_return make_error("HTTP " + std::to_string(status) + ": " + text.substr(0, kErrorBodyShown));
    if (parser.is_done() && parser.keep_alive()) im.idle.push_back(std::move(conn->stream));
    co_return text;
  }
  co_return make_error("request failed: the server closed the connection");
}

}  // namespace inferd::bench
