// A small HTTP/1.1 client for benchmarks, on Boost.Beast with C++20
// coroutines: many requests in flight on one thread, each response body
// handed over piece by piece as it arrives (server-sent events), and
// keep-alive connections reused between requests.
#pragma once
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without including it

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "bench/base_url.h"
#include "core/result.h"

namespace inferd::bench {

using Clock = std::chrono::steady_clock;

class HttpClient {
 public:
  // `timeout`: the longest wait for the connection or for the next bytes of a
  // response (a stalled server fails the request, a slow one does not).
  HttpClient(boost::asio::any_io_executor executor, BaseUrl base, std::chrono::milliseconds timeout);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Called with each piece of a 200 response's body and the moment it was read.
  using BodyHandler = std::function<void(std::string_view piece, Clock::time_point received)>;

  // POSTs a JSON body to `endpoint` and streams a 200 response's body to
  // `on_body`. Any other status is an error that quotes the start of the
  // body. A reused connection the server had closed is retried once on a new one.
  boost::asio::awaitable<Status> post_json(std::string endpoint, std::string body,
                                           BodyHandler on_body);

  // GETs `endpoint`; the body of a 200 response.
  boost::asio::awaitable<Result<std::string>> get(std::string endpoint);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace inferd::bench
