// Sustained memory read bandwidth of this machine: every thread streams over
// its share of a buffer far larger than the caches, summing 64-bit words so the
// loads cannot be optimized away. The best of several passes is reported.
// Decode at batch 1 reads every weight once per token, so
// weight bytes / this bandwidth is the floor on time per token.
//   memory_bandwidth [threads] [MiB]     (defaults: all cores, 1024 MiB)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : static_cast<int>(std::thread::hardware_concurrency());
  const size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1024;
  const size_t n = mib * 1024 * 1024 / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = i;  // touch every page before timing
  inferd::ThreadPool pool(threads);
  std::vector<uint64_t> sums(threads);
  double best = 0;
  for (int pass = 0; pass < 7; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int ti, int nt) {
      auto [b, e] = inferd::ThreadPool::split(static_cast<int64_t>(n), ti, nt, 8);
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t i = b; i + 4 <= e; i += 4) {
        s0 += buf[i];
        s1 += buf[i + 1];
        s2 += buf[i + 2];
        s3 += buf[i + 3];
      }
      sums[ti] = s0 + s1 + s2 + s3;
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / s / 1e9);
  }
  uint64_t check = 0;
  for (uint64_t s : sums) check += s;
  std::printf("read bandwidth: %.1f GB/s (%d threads, %zu MiB buffer, best of 7; checksum %llu)\n",
              best, threads, mib, static_cast<unsigned long long>(check % 1000));
  return 0;
}
