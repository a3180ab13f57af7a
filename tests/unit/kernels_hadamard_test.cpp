// The Walsh-Hadamard rotation of quantized KV caches (kernels/cpu/hadamard.h):
// orthonormal (norms and dot products kept), its own inverse, and the matrix
// llama.cpp builds (Sylvester's order: entry (i, j) is (-1)^popcount(i & j)
// over sqrt(n)), chunk by chunk.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/hadamard.h"

namespace inferd::kernels {
namespace {

std::vector<float> random_vector(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(KernelsHadamard, IsSylvestersMatrixChunkByChunk) {
  for (int64_t chunk : {64, 128, 256}) {
    const int64_t n = 2 * chunk;
    const std::vector<float> x = random_vector(n, static_cast<uint32_t>(chunk));
    std::vector<float> y = x;
    hadamard_rotate(y.data(), n, chunk);
    for (int64_t c = 0; c < n; c += chunk) {
      for (int64_t i = 0; i < chunk; ++i) {
        double want = 0;
        for (int64_t j = 0; j < chunk; ++j)
          want += (std::popcount(static_cast<uint64_t>(i & j)) % 2 ? -1.0 : 1.0) * x[c + j];
        want /= std::sqrt(static_cast<double>(chunk));
        EXPECT_NEAR(y[c + i], want, 1e-5) << "chunk " << chunk << " element " << c + i;
      }
    }
  }
}

TEST(KernelsHadamard, RotatingTwiceIsTheIdentityAndDotProductsAreKept) {
  const int64_t n = 128;
  const std::vector<float> a = random_vector(n, 1), b = random_vector(n, 2);
  std::vector<float> ra = a, rb = b;
  hadamard_rotate(ra.data(), n, 128);
  hadamard_rotate(rb.data(), n, 128);
  double dot = 0, rdot = 0;
  for (int64_t i = 0; i < n; ++i) dot += a[i] * b[i], rdot += ra[i] * rb[i];
  EXPECT_NEAR(rdot, dot, 1e-4 * n);
  hadamard_rotate(ra.data(), n, 128);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(ra[i], a[i], 1e-5) << i;
}

}  // namespace
}  // namespace inferd::kernels
