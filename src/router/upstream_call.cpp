#include "router/upstream_call.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include <limits>

namespace inferd::router {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;

namespace {
// Body bytes held for a client that reads slower than the instance writes;
// past this the call stops reading until the handler takes them.
constexpr size_t kMaxUnreadBody = size_t{1} << 20;

auto redirect(beast::error_code& ec) { return net::redirect_error(net::use_awaitable, ec); }

http::request<http::string_body> make_request(const bench::BaseUrl& instance, const UpstreamRequest& r) {
  http::request<http::string_body> req{r.method, r.target, 11};
  req.set(http::field::host, instance.host_header());
  req.set(http::field::user_agent, "inferd-router");
  if (!r.authorization.empty()) req.set(http::field::authorization, r.authorization);
  if (r.method == http::verb::post) {
    req.set(http::field::content_type, "application/json");
    req.body() = r.body;
  }
  req.keep_alive(false);
  req.prepare_payload();
  return req;
}
}  // namespace

UpstreamCall::UpstreamCall(net::any_io_executor executor, std::function<void()> wake)
    : stream_(executor), drained_(executor), wake_(std::move(wake)) {}

std::shared_ptr<UpstreamCall> UpstreamCall::start(net::any_io_executor executor, const bench::BaseUrl& instance,
                                                  UpstreamRequest request, std::function<void()> wake) {
  auto call = std::make_shared<UpstreamCall>(executor, std::move(wake));
  net::co_spawn(
      executor,
      [call, instance, request = std::move(request)]() mutable -> net::awaitable<void> {
        co_await call->run(std::move(instance), std::move(request));
      },
      net::detached);
  return call;
}

std::string UpstreamCall::take_body() {
  std::string out;
  out.swap(body_);
  drained_.cancel();
  return out;
}

void UpstreamCall::cancel() {
  if (done_) return;
  cancelled_ = true;
  beast::error_code ec;
  stream_.socket().close(ec);
  drained_.cancel();
}

void UpstreamCall::fail(std::string why) {
  if (failure_.empty()) failure_ = std::move(why);
  done_ = true;
  beast::error_code ec;
  stream_.socket().close(ec);
  wake_();
}

net::awaitable<void> UpstreamCall::run(bench::BaseUrl instance, UpstreamRequest request) {
  auto self = shared_from_this();  // alive until the exchange is over, whatever the handler does
  const std::string where = instance.host_header();
  beast::error_code ec;
  tcp::resolver resolver(stream_.get_executor());
  auto endpoints = co_await resolver.async_resolve(instance.host, instance.port, redirect(ec));
  if (ec) co_return fail("cannot resolve " + instance.host + ": " + ec.message());
  if (cancelled_) co_return fail("cancelled");
  stream_.expires_after(request.connect_timeout);
  co_await stream_.async_connect(endpoints, redirect(ec));
  if (ec) co_return fail("cannot connect to " + where + ": " + ec.message());
  if (cancelled_) co_return fail("cancelled");
  connected_ = true;
  stream_.socket().set_option(tcp::no_delay(true), ec);

  auto req = make_request(instance, request);
  stream_.expires_never();
  co_await http::async_write(stream_, req, redirect(ec));
  if (ec) co_return fail("sending the request to " + where + " failed: " + ec.message());

  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // a stream runs as long as the generation
  if (request.head_timeout.count() > 0) stream_.expires_after(request.head_timeout);
  co_await http::async_read_header(stream_, buffer, parser, redirect(ec));
  if (ec) {
    timed_out_ = ec == beast::error::timeout;
    co_return fail(ec == beast::error::timeout ? where + " sent no response within " +
                                                     std::to_string(request.head_timeout.count()) + " ms"
                                               : "no response from " + where + ": " + ec.message());
  }
  stream_.expires_never();
  status_ = parser.get().result_int();
  content_type_ = std::string(parser.get()[http::field::content_type]);
  retry_after_ = std::string(parser.get()[http::field::retry_after]);
  wake_();

  char piece[16384];
  while (!parser.is_done()) {
    while (body_.size() >= kMaxUnreadBody && !cancelled_) {
      drained_.expires_after(std::chrono::seconds(1));
      co_await drained_.async_wait(redirect(ec));
    }
    if (cancelled_) co_return fail("cancelled");
    parser.get().body().data = piece;
    parser.get().body().size = sizeof piece;
    co_await http::async_read_some(stream_, buffer, parser, redirect(ec));
    if (ec == http::error::need_buffer) ec = {};  // the piece buffer is full: hand it over
    const size_t got = sizeof piece - parser.get().body().size;
    if (got > 0) {
      body_.append(piece, got);
      wake_();
    }
    // A body that runs until the connection closes ends in end_of_stream.
    if (ec == http::error::end_of_stream && parser.is_done()) break;
    if (ec) co_return fail("reading the response of " + where + " failed: " + ec.message());
  }
  done_ = true;
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.socket().close(ignored);
  wake_();
}

}  // namespace inferd::router
