// A few threads for the server's CPU work on requests (JSON parsing and
// validation, chat templates, tokenization), so that the I/O threads only move
// bytes: a 16 MB prompt tokenizes for seconds, and on an I/O thread every
// other connection (health checks, running streams) would wait that long.
//
// run(f) is awaited from a connection's coroutine: f runs on a worker and the
// coroutine resumes on its own strand with f's result.
#pragma once
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange unincluded

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <cstddef>
#include <type_traits>

namespace inferd::server {

class WorkerPool {
 public:
  explicit WorkerPool(size_t threads) : pool_(std::max<size_t>(1, threads)) {}
  ~WorkerPool() { join(); }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // f's result must be default-constructible (Asio's co_spawn needs one for
  // the exception path); an exception thrown by f is rethrown in the caller.
  // f must not reference anything the caller's frame may lose before join():
  // a coroutine destroyed while f runs does not stop f.
  template <class F>
  boost::asio::awaitable<std::invoke_result_t<F&>> run(F f) {
    using R = std::invoke_result_t<F&>;
    return boost::asio::co_spawn(
        pool_.get_executor(), [f = std::move(f)]() mutable -> boost::asio::awaitable<R> { co_return f(); },
        boost::asio::use_awaitable);
  }

  // Waits until all work handed out so far has run (its callers resume on
  // their own executors, or are destroyed with them). Call it after the I/O
  // threads have stopped and before their io_context is destroyed: work
  // handed out later would never run.
  void join() { pool_.join(); }

 private:
  boost::asio::thread_pool pool_;
};

}  // namespace inferd::server
