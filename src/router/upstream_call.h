// One HTTP request from the router to an instance, run as its own coroutine
// on the strand of the client connection that asked for it. What arrives
// (the status, then the body piece by piece) is kept here and the client's
// handler is woken (its Exchange::waker) to take it, the way an engine stream
// wakes a server handler. So the handler can wait for the upstream and for
// its own client at once: when the client goes away it calls cancel(), which
// closes the upstream connection, and the instance aborts the request.
//
// Every call opens its own connection (TCP_NODELAY): no pool to go stale,
// and on a LAN a connect costs a fraction of a millisecond beside a prefill.
//
// The handler and the call share a strand: nothing here is locked, and
// every member is read and written only from that strand.
#pragma once
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange unincluded

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "bench/base_url.h"

namespace inferd::router {

namespace http = boost::beast::http;

struct UpstreamRequest {
  http::verb method = http::verb::post;
  std::string target;         // "/v1/completions", with the instance's path prefix
  std::string body;           // JSON (POST)
  std::string authorization;  // the client's Authorization header, passed on
  // Longest wait to connect, and for the response head once the request is
  // sent (zero: no limit; a non-streaming decode sends its head at the end).
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds head_timeout{0};
};

class UpstreamCall : public std::enable_shared_from_this<UpstreamCall> {
 public:
  // Starts the request on `executor` (the caller's strand); `wake` is called
  // on that strand whenever there is something new.
  static std::shared_ptr<UpstreamCall> start(boost::asio::any_io_executor executor, const bench::BaseUrl& instance,
                                             UpstreamRequest request, std::function<void()> wake);

  bool head_ready() const { return status_ != 0; }
  unsigned status() const { return status_; }
  const std::string& content_type() const { return content_type_; }
  const std::string& retry_after() const { return retry_after_; }
  // The body bytes received since the last take.
  std::string take_body();
  // The response ended (whole, or failed: see failed()).
  bool done() const { return done_; }
  // Why the exchange failed; empty if it did not. connected() tells a refused
  // or timed-out connection (the request surely never ran) from a later failure.
  const std::string& failure() const { return failure_; }
  bool failed() const { return !failure_.empty(); }
  bool connected() const { return connected_; }
  // No response head within UpstreamRequest::head_timeout.
  bool timed_out() const { return timed_out_; }
  // Closes the connection: the instance sees its client go away.
  void cancel();

  UpstreamCall(boost::asio::any_io_executor executor, std::function<void()> wake);

 private:
  boost::asio::awaitable<void> run(bench::BaseUrl instance, UpstreamRequest request);
  void fail(std::string why);

  boost::beast::tcp_stream stream_;
  boost::asio::steady_timer drained_;  // the reader waits here while the body piles up unread
  std::function<void()> wake_;
  unsigned status_ = 0;
  std::string content_type_, retry_after_, body_;
  bool done_ = false, connected_ = false, cancelled_ = false, timed_out_ = false;
  std::string failure_;
};

}  // namespace inferd::router
