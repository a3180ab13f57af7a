// HTTP/1.1 server on Boost.Beast with C++20 coroutines: every connection is a
// coroutine on its own strand, so thousands of idle or streaming connections
// cost a few kilobytes each and no thread. A handful of I/O threads serve them
// all; the engine runs on its own thread and wakes a connection when its
// request has new output (Exchange::waker).
//
// While a handler runs, the connection watches its socket for the client going
// away (a read completing with EOF or an error), so a request can be aborted
// the moment its client disconnects — whether it is queued, prefilling or
// decoding, streaming or not.
//
// Once stop_accepting() has been called, a request that still arrives on an
// open connection gets 503 with Connection: close instead of its handler, and
// responses already under way close their connection when done.
#pragma once
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange unincluded

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/result.h"

namespace inferd::server {

namespace http = boost::beast::http;
using HttpRequest = http::request<http::string_body>;
using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0: any free port (see HttpServer::port())
  int io_threads = 1;
  size_t max_body_bytes = size_t{16} << 20;  // larger bodies get 413
  std::chrono::seconds idle_timeout{120};    // keep-alive connection with no request
  std::chrono::seconds write_timeout{60};    // a client that stops reading is dropped
};

class Connection;

// One request and its response, as a handler sees it.
class Exchange {
 public:
  explicit Exchange(Connection& conn, HttpRequest request);
  const HttpRequest& request() const { return request_; }
  // The request path without the query string.
  std::string_view path() const;

  // A whole response at once.
  boost::asio::awaitable<void> respond(http::status status, std::string_view content_type,
                                       std::string body, const Headers& extra = {});
  // A response written piece by piece (server-sent events): chunked for
  // HTTP/1.1; for HTTP/1.0, which has no chunked encoding, the body runs
  // until the server closes the connection. Each returns false once the
  // client is gone; the handler should stop then.
  boost::asio::awaitable<bool> begin_stream(http::status status, std::string_view content_type);
  boost::asio::awaitable<bool> write_chunk(std::string data);
  boost::asio::awaitable<void> end_stream();

  // The client closed or reset the connection.
  bool client_gone() const;
  // Thread-safe: wakes a wait(). Safe to call after the exchange has ended.
  std::function<void()> waker() const;
  // Suspends until waker() is called, the client goes away, or `timeout`.
  boost::asio::awaitable<void> wait(std::chrono::milliseconds timeout = std::chrono::seconds(1));

  bool responded() const { return state_ == State::kDone; }
  bool started() const { return state_ != State::kNone; }

 private:
  enum class State { kNone, kStreaming, kDone };
  Connection& conn_;
  HttpRequest request_;
  State state_ = State::kNone;
  bool chunked_ = false;
};

using Handler = std::function<boost::asio::awaitable<void>(Exchange&)>;
// Answers a request the server refused before the handler saw it (413, 400):
// returns the body (JSON) for the status and message; `path` is the request's
// (empty when its header could not be read), so that each API's errors keep
// its own shape.
using RejectionBody =
    std::function<std::string(http::status status, std::string_view message, std::string_view path)>;

class HttpServer {
 public:
  HttpServer(HttpServerConfig config, Handler handler, RejectionBody rejection);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the I/O threads. Fails with a message naming the
  // address for a bad host or a port in use.
  Status start();
  // Stops accepting; connections keep running.
  void stop_accepting();
  // Waits up to `grace` for open connections to finish, then closes the rest
  // and joins the I/O threads.
  void stop(std::chrono::milliseconds grace);

  uint16_t port() const { return port_; }
  int64_t open_connections() const { return open_connections_.load(); }

 private:
  friend class Connection;
  boost::asio::awaitable<void> accept_loop();

  // Declared so that the I/O context (whose destruction destroys suspended
  // connection coroutines) goes before anything those coroutines touch.
  HttpServerConfig config_;
  Handler handler_;
  RejectionBody rejection_;
  uint16_t port_ = 0;
  std::atomic<int64_t> open_connections_{0};
  std::atomic<bool> stopping_{false};
  boost::asio::io_context ioc_;
  std::unique_ptr<boost::asio::ip::tcp::acceptor> acceptor_;
  std::vector<std::thread> threads_;
};

}  // namespace inferd::server
