#include "server/http_server.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>

#include <array>
#include <cstdio>
#include <exception>

namespace inferd::server {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;

namespace {
constexpr size_t kMaxHeaderBytes = 64 * 1024;
// Bytes a client may send ahead (pipelining) while its previous request runs.
constexpr size_t kMaxReadAhead = 64 * 1024;

auto redirect(beast::error_code& ec) { return net::redirect_error(net::use_awaitable, ec); }
}  // namespace

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpServer& server, tcp::socket socket)
      : server_(server), stream_(std::move(socket)), wake_(stream_.get_executor()) {
    ++server_.open_connections_;
  }
  ~Connection() { --server_.open_connections_; }

  net::awaitable<void> run();

  // ---- used by Exchange ----
  net::awaitable<bool> write_response(http::response<http::string_body>& res) {
    beast::error_code ec;
    stream_.expires_after(server_.config_.write_timeout);
    co_await http::async_write(stream_, res, redirect(ec));
    if (ec) gone_ = true;
    co_return !ec;
  }
  template <class Buffers>
  net::awaitable<bool> write_raw(const Buffers& buffers) {
    if (gone_) co_return false;
    beast::error_code ec;
    stream_.expires_after(server_.config_.write_timeout);
    co_await net::async_write(stream_, buffers, redirect(ec));
    if (ec) gone_ = true;
    co_return !ec;
  }
  net::awaitable<bool> write_stream_header(http::response<http::empty_body>& res) {
    beast::error_code ec;
    stream_.expires_after(server_.config_.write_timeout);
    http::response_serializer<http::empty_body> sr{res};
    co_await http::async_write_header(stream_, sr, redirect(ec));
    if (ec) gone_ = true;
    co_return !ec;
  }
  bool gone() const { return gone_; }
  auto executor() { return stream_.get_executor(); }
  unsigned version() const { return version_; }
  // Whether the connection stays open after this response: not once the
  // server has begun shutting down.
  bool keep_alive() const { return keep_alive_ && !server_.stopping_.load(); }
  // This response ends when the connection closes (an HTTP/1.0 stream).
  void close_after_response() { keep_alive_ = false; }

  std::function<void()> waker() {
    std::weak_ptr<Connection> weak = weak_from_this();
    auto executor = stream_.get_executor();
    return [weak, executor] {
      net::post(executor, [weak] {
        if (auto self = weak.lock()) self->notify();
      });
    };
  }
  net::awaitable<void> wait(std::chrono::milliseconds timeout) {
    if (!notified_ && !gone_) {
      wake_.expires_after(timeout);
      beast::error_code ec;
      co_await wake_.async_wait(redirect(ec));
    }
    notified_ = false;
  }

 private:
  void notify() {
    notified_ = true;
    wake_.cancel();
  }
  // Reads from the socket while a handler runs: EOF or an error means the
  // client went away; bytes are the next pipelined request, kept for later.
  void start_watch() {
    if (watching_ || gone_ || buffer_.size() >= kMaxReadAhead) return;
    watching_ = true;
    stream_.socket().async_read_some(
        net::buffer(watch_buf_), [self = shared_from_this()](beast::error_code ec, size_t n) {
          self->watching_ = false;
          if (ec == net::error::operation_aborted) {
            self->notify();
            return;
          }
          if (ec) {
            self->gone_ = true;
          } else {
            net::buffer_copy(self->buffer_.prepare(n), net::buffer(self->watch_buf_.data(), n));
            self->buffer_.commit(n);
            self->start_watch();
          }
          self->notify();
        });
  }
  net::awaitable<void> stop_watch() {
    while (watching_) {
      beast::error_code ec;
      stream_.socket().cancel(ec);
      // Suspend even when the client is gone (wait() would not): the read's
      // completion runs on this strand, so spinning here would never let it
      // run, and would freeze the I/O thread with it.
      wake_.expires_after(std::chrono::milliseconds(100));
      co_await wake_.async_wait(redirect(ec));
    }
    notified_ = false;
  }
  net::awaitable<void> reject(http::status status, std::string message, std::string target = {}) {
    http::response<http::string_body> res{status, version_ ? version_ : 11};
    res.set(http::field::server, "inferd");
    res.set(http::field::content_type, "application/json");
    res.set(http::field::connection, "close");
    res.body() = server_.rejection_(status, message, std::string_view(target).substr(0, target.find('?')));
    res.prepare_payload();
    co_await write_response(res);
  }

  HttpServer& server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  net::steady_timer wake_;
  std::array<char, 4096> watch_buf_{};
  bool watching_ = false;
  bool gone_ = false;
  bool notified_ = false;
  unsigned version_ = 11;
  bool keep_alive_ = true;
};

// The request's target as far as it was read (a copy: the parser moves on).
// The start line is parsed before the fields, so a Content-Length over the
// limit, found while the header is still being read, already has it.
std::string target_of(const http::request_parser<http::string_body>& parser) {
  const auto t = parser.get().target();
  return std::string(t.data(), t.size());
}

net::awaitable<void> Connection::run() {
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(kMaxHeaderBytes);
    parser.body_limit(server_.config_.max_body_bytes);
    beast::error_code ec;
    stream_.expires_after(server_.config_.idle_timeout);
    co_await http::async_read_header(stream_, buffer_, parser, redirect(ec));
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted)
      break;
    if (ec == http::error::body_limit) {  // announced by Content-Length
      co_await reject(http::status::payload_too_large,
                      "request body is larger than the limit of " + std::to_string(server_.config_.max_body_bytes) +
                          " bytes",
                      target_of(parser));
      break;
    }
    if (ec) {
      co_await reject(http::status::bad_request, "malformed HTTP request: " + ec.message(), target_of(parser));
      break;
    }
    version_ = parser.get().version();
    if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
      http::response<http::empty_body> cont{http::status::continue_, version_};
      stream_.expires_after(server_.config_.write_timeout);
      co_await http::async_write(stream_, cont, redirect(ec));
      if (ec) break;
    }
    stream_.expires_after(server_.config_.idle_timeout);
    co_await http::async_read(stream_, buffer_, parser, redirect(ec));
    if (ec == http::error::body_limit) {  // chunked body grew past the limit
      co_await reject(http::status::payload_too_large,
                      "request body is larger than the limit of " + std::to_string(server_.config_.max_body_bytes) +
                          " bytes",
                      target_of(parser));
      break;
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::connection_reset)
      break;
    if (ec) {
      co_await reject(http::status::bad_request, "malformed HTTP request: " + ec.message(), target_of(parser));
      break;
    }
    stream_.expires_never();
    if (server_.stopping_.load()) {
      // Shutting down: the engine takes no more requests. The body was read
      // first, so that closing does not reset the connection under the reply.
      co_await reject(http::status::service_unavailable, "the server is shutting down", target_of(parser));
      break;
    }
    keep_alive_ = parser.get().keep_alive();

    Exchange exchange(*this, parser.release());
    start_watch();
    std::exception_ptr failure;
    try {
      co_await server_.handler_(exchange);
    } catch (...) {
      failure = std::current_exception();
    }
    if (failure && !exchange.started() && !gone_) {
      // A handler bug, not bad input: still answer, as JSON.
      try {
        std::rethrow_exception(failure);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "inferd: internal error handling %s: %s\n",
                     std::string(exchange.path()).c_str(), e.what());
      } catch (...) {
      }
      co_await reject(http::status::internal_server_error, "internal error");
      break;
    }
    co_await stop_watch();
    if (failure || gone_ || !exchange.responded() || !keep_alive()) break;
  }
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream_.socket().close(ec);
}

// ---- Exchange -------------------------------------------------------------

Exchange::Exchange(Connection& conn, HttpRequest request) : conn_(conn), request_(std::move(request)) {}

std::string_view Exchange::path() const {
  std::string_view target(request_.target().data(), request_.target().size());
  return target.substr(0, target.find('?'));
}

net::awaitable<void> Exchange::respond(http::status status, std::string_view content_type,
                                       std::string body, const Headers& extra) {
  if (state_ != State::kNone) co_return;
  state_ = State::kDone;
  http::response<http::string_body> res{status, conn_.version()};
  res.set(http::field::server, "inferd");
  res.set(http::field::content_type, beast::string_view(content_type.data(), content_type.size()));
  for (const auto& [name, value] : extra) res.set(name, value);
  res.keep_alive(conn_.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();
  // A 304 has no body; a Content-Length there must be the resource's own
  // length (RFC 9110 8.6), and Beast's 0 is not.
  if (status == http::status::not_modified) res.erase(http::field::content_length);
  co_await conn_.write_response(res);
}

net::awaitable<bool> Exchange::begin_stream(http::status status, std::string_view content_type) {
  if (state_ != State::kNone) co_return false;
  state_ = State::kStreaming;
  http::response<http::empty_body> res{status, conn_.version()};
  res.set(http::field::server, "inferd");
  res.set(http::field::content_type, beast::string_view(content_type.data(), content_type.size()));
  res.set(http::field::cache_control, "no-cache");
  chunked_ = conn_.version() >= 11;
  if (chunked_) {
    res.keep_alive(conn_.keep_alive());
    res.chunked(true);
  } else {
    conn_.close_after_response();
    res.set(http::field::connection, "close");
  }
  co_return co_await conn_.write_stream_header(res);
}

net::awaitable<bool> Exchange::write_chunk(std::string data) {
  if (state_ != State::kStreaming) co_return false;
  if (data.empty()) co_return !conn_.gone();  // an empty chunk would end the body
  if (!chunked_) co_return co_await conn_.write_raw(net::buffer(data));
  co_return co_await conn_.write_raw(http::make_chunk(net::buffer(data)));
}

net::awaitable<void> Exchange::end_stream() {
  if (state_ != State::kStreaming) co_return;
  state_ = State::kDone;
  if (chunked_) co_await conn_.write_raw(http::make_chunk_last());
}

bool Exchange::client_gone() const { return conn_.gone(); }
std::function<void()> Exchange::waker() const { return conn_.waker(); }
net::awaitable<void> Exchange::wait(std::chrono::milliseconds timeout) { return conn_.wait(timeout); }

// ---- HttpServer -----------------------------------------------------------

HttpServer::HttpServer(HttpServerConfig config, Handler handler, RejectionBody rejection)
    : config_(std::move(config)), handler_(std::move(handler)), rejection_(std::move(rejection)) {}

HttpServer::~HttpServer() { stop(std::chrono::milliseconds(0)); }

Status HttpServer::start() {
  beast::error_code ec;
  const auto address = net::ip::make_address(config_.host, ec);
  if (ec) return make_error("bad host address '" + config_.host + "': " + ec.message());
  const tcp::endpoint endpoint{address, config_.port};
  acceptor_ = std::make_unique<tcp::acceptor>(net::make_strand(ioc_));
  const std::string where = config_.host + ":" + std::to_string(config_.port);
  acceptor_->open(endpoint.protocol(), ec);
  if (!ec) acceptor_->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_->bind(endpoint, ec);
  if (ec) return make_error("cannot bind " + where + ": " + ec.message());
  acceptor_->listen(net::socket_base::max_listen_connections, ec);
  if (ec) return make_error("cannot listen on " + where + ": " + ec.message());
  port_ = acceptor_->local_endpoint().port();
  net::co_spawn(acceptor_->get_executor(), accept_loop(), net::detached);
  for (int i = 0; i < std::max(1, config_.io_threads); ++i) threads_.emplace_back([this] { ioc_.run(); });
  return {};
}

net::awaitable<void> HttpServer::accept_loop() {
  while (!stopping_.load()) {
    beast::error_code ec;
    tcp::socket socket(net::make_strand(ioc_));
    co_await acceptor_->async_accept(socket, redirect(ec));
    if (ec == net::error::operation_aborted || stopping_.load()) break;
    if (ec) {  // out of file descriptors and the like: back off, keep serving
      net::steady_timer t(co_await net::this_coro::executor, std::chrono::milliseconds(50));
      co_await t.async_wait(redirect(ec));
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    auto conn = std::make_shared<Connection>(*this, std::move(socket));
    auto executor = conn->executor();
    net::co_spawn(executor, [conn]() -> net::awaitable<void> { co_await conn->run(); }, net::detached);
  }
}

void HttpServer::stop_accepting() {
  if (stopping_.exchange(true)) return;
  if (acceptor_)
    net::post(acceptor_->get_executor(), [this] {
      beast::error_code ec;
      acceptor_->close(ec);
    });
}

void HttpServer::stop(std::chrono::milliseconds grace) {
  stop_accepting();
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (open_connections_.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ioc_.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

}  // namespace inferd::server
