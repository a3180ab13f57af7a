// A persistent pool of worker threads for data-parallel kernels.
//
// run(fn) calls fn(thread_index, n_threads) once on every thread (the caller is
// thread 0) and returns when all are done. Workers spin briefly before sleeping,
// because a forward pass issues hundreds of short parallel regions per token and
// waking a sleeping thread costs more than most of them.
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace inferd {

// Work a thread does while it waits at a barrier, between polls: work that
// helps the next phase, such as prefetching what it will read. fn returns
// false when it has nothing left to do.
struct BarrierIdle {
  bool (*fn)(void* ctx) = nullptr;
  void* ctx = nullptr;
};

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // One per hardware thread (at least 1): the default pool size.
  static int hardware_threads();
  void run(const std::function<void(int thread_index, int n_threads)>& fn);

  // Called by every thread inside run(): returns once all of them have called
  // it. Lets one run() hold a whole forward pass, its phases separated by
  // barriers, instead of paying a run() wake-up per kernel. Spins, then yields.
  // While it waits, a thread calls `idle` (when given) between polls.
  void barrier(BarrierIdle idle = {});

  // Splits [0, n) into n_threads contiguous chunks, chunk boundaries rounded to
  // `align`; returns [begin, end) for `thread_index`.
  static std::pair<int64_t, int64_t> split(int64_t n, int thread_index, int n_threads,
                                           int64_t align = 1);

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> barrier_waiting_{0};
  std::atomic<uint64_t> barrier_generation_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace inferd
