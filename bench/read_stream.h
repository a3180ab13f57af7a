// Reading memory as fast as this machine can (shared by the bandwidth
// benchmarks, internal to bench/): every byte summed as 64-bit words in the
// widest vectors the CPU has, with or without a software prefetch ahead.
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace inferd::bench {

constexpr size_t kPrefetchAhead = 4096;

// Sums [p, p + n) as 64-bit words, 256 bytes per iteration (n a multiple of
// 256), in 64-byte vectors: inlined into read<kPrefetch, ...> below, which
// compile it for AVX-512 (one register a vector) or AVX2 (two).
template <bool kPrefetch>
inline __attribute__((always_inline)) uint64_t sum_stream(const uint8_t* p, size_t n) {
  typedef uint64_t Vec __attribute__((vector_size(64)));
  Vec s0 = {}, s1 = {}, s2 = {}, s3 = {};
  for (size_t i = 0; i < n; i += 256) {
    if constexpr (kPrefetch) {
      for (size_t j = 0; j < 256; j += 64) _mm_prefetch(reinterpret_cast<const char*>(p + i + kPrefetchAhead + j), _MM_HINT_T0);
    }
    s0 += *reinterpret_cast<const Vec*>(p + i);
    s1 += *reinterpret_cast<const Vec*>(p + i + 64);
    s2 += *reinterpret_cast<const Vec*>(p + i + 128);
    s3 += *reinterpret_cast<const Vec*>(p + i + 192);
  }
  const Vec s = (s0 + s1) + (s2 + s3);
  uint64_t sum = 0;
  for (int l = 0; l < 8; ++l) sum += s[l];
  return sum;
}

template <bool kPrefetch>
__attribute__((target("avx512f"))) inline uint64_t read_avx512(const uint8_t* p, size_t n) {
  return sum_stream<kPrefetch>(p, n);
}

template <bool kPrefetch>
__attribute__((target("avx2"))) inline uint64_t read_avx2(const uint8_t* p, size_t n) {
  return sum_stream<kPrefetch>(p, n);
}

using ReadFn = uint64_t (*)(const uint8_t*, size_t);

// The best reader this CPU runs (null: neither AVX-512 nor AVX2).
inline ReadFn read_stream_fn(bool prefetch) {
  if (__builtin_cpu_supports("avx512f")) return prefetch ? read_avx512<true> : read_avx512<false>;
  if (__builtin_cpu_supports("avx2")) return prefetch ? read_avx2<true> : read_avx2<false>;
  return nullptr;
}

}  // namespace inferd::bench
