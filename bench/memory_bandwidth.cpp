// Sustained memory read bandwidth of this machine: every thread streams over
// its share of a buffer, with the widest loads the CPU has, and the best pass
// is reported. Decode at batch 1 reads every weight once per token, so
// weight bytes / this bandwidth is the floor on time per token.
//
// The floor must not flatter the engine: the buffer is on huge pages (as the
// packed weights are) and each pass is read twice, once leaving the stream to
// the hardware prefetchers and once prefetching 4 KiB ahead in software (as
// the packed kernels do); the faster of all passes is the reading. On a loaded
// host either way alone was seen reading at half the rate of the other. The
// median pass is printed too: what a long run can count on when the host is
// busy, where the best pass is what it gets at a quiet moment.
//   memory_bandwidth [threads] [MiB]     (defaults: all cores, 1024 MiB)
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "core/aligned_bytes.h"
#include "read_stream.h"

using namespace inferd::bench;

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : static_cast<int>(std::thread::hardware_concurrency());
  const size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1024;
  const size_t n = mib * 1024 * 1024;
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!avx512 && !__builtin_cpu_supports("avx2")) {
    std::fprintf(stderr, "memory_bandwidth: needs AVX2 or AVX-512\n");
    return 1;
  }
  const ReadFn plain = read_stream_fn(false);
  const ReadFn prefetched = read_stream_fn(true);
  inferd::AlignedBytes buf(n, /*huge_pages=*/true, /*zeroed=*/false);
  for (size_t i = 0; i < n; i += 8) {  // touch every page before timing
    const uint64_t v = i;
    std::copy_n(reinterpret_cast<const uint8_t*>(&v), 8, buf.data() + i);
  }
  inferd::ThreadPool pool(threads);
  std::vector<uint64_t> sums(threads);
  double best = 0;
  const char* best_way = "";
  std::vector<double> passes;
  for (int pass = 0; pass < 14; ++pass) {
    const ReadFn read = pass % 2 ? prefetched : plain;
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int ti, int nt) {
      const auto [b, e] = inferd::ThreadPool::split(static_cast<int64_t>(n), ti, nt, 256);
      sums[ti] = read(buf.data() + b, static_cast<size_t>(e - b));
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    passes.push_back(static_cast<double>(n) / s / 1e9);
    if (static_cast<double>(n) / s / 1e9 > best) {
      best = static_cast<double>(n) / s / 1e9;
      best_way = pass % 2 ? "software prefetch" : "hardware prefetch";
    }
  }
  uint64_t check = 0;
  for (uint64_t s : sums) check += s;
  std::nth_element(passes.begin(), passes.begin() + passes.size() / 2, passes.end());
  std::printf("read bandwidth: %.1f GB/s (%d threads, %zu MiB buffer on huge pages, %s loads, best of 14 passes by %s;"
              " median pass: %.1f GB/s; checksum %llu)\n",
              best, threads, mib, avx512 ? "AVX-512" : "AVX2", best_way, passes[passes.size() / 2],
              static_cast<unsigned long long>(check % 1000));
  return 0;
}
