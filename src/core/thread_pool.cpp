#include "core/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#define INFERD_PAUSE() _mm_pause()
#else
#define INFERD_PAUSE() ((void)0)
#endif

namespace inferd {

namespace {
// Busy-wait first (a parallel region is often only microseconds away), then
// yield the core (another process may need it: spinning on an oversubscribed
// machine starves the very thread we wait for), then sleep.
constexpr int kSpinIterations = 4000;
constexpr int kYieldIterations = 20000;
}

int ThreadPool::hardware_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  fn(0, n_threads_);
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kSpinIterations) INFERD_PAUSE(); else std::this_thread::yield();
  }
}

void ThreadPool::barrier(BarrierIdle idle) {
  if (n_threads_ == 1) return;
  // Read the generation before arriving: the last thread to arrive bumps it
  // only after every thread has arrived, so no thread can miss the bump.
  const uint64_t gen = barrier_generation_.load(std::memory_order_acquire);
  if (barrier_waiting_.fetch_add(1, std::memory_order_acq_rel) == n_threads_ - 1) {
    barrier_waiting_.store(0, std::memory_order_relaxed);
    barrier_generation_.fetch_add(1, std::memory_order_release);
    return;
  }
  for (int spin = 0; barrier_generation_.load(std::memory_order_acquire) == gen;) {
    if (idle.fn && idle.fn(idle.ctx)) continue;  // useful work first; it does not count as spinning
    if (spin++ < kSpinIterations) INFERD_PAUSE(); else std::this_thread::yield();
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < kSpinIterations + kYieldIterations; ++spin) {
      if (spin < kSpinIterations) INFERD_PAUSE(); else std::this_thread::yield();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load() != seen; });
      gen = generation_.load();
    }
    seen = gen;
    if (stop_.load()) return;
    const std::function<void(int, int)>* job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job = job_;
    }
    (*job)(index, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

std::pair<int64_t, int64_t> ThreadPool::split(int64_t n, int thread_index, int n_threads,
                                              int64_t align) {
  const int64_t units = (n + align - 1) / align;
  const int64_t per = units / n_threads, rem = units % n_threads;
  const int64_t begin_u = thread_index * per + std::min<int64_t>(thread_index, rem);
  const int64_t end_u = begin_u + per + (thread_index < rem ? 1 : 0);
  return {std::min(n, begin_u * align), std::min(n, end_u * align)};
}

}  // namespace inferd
