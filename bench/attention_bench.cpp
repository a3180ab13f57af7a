// Micro-benchmark of decode attention on the default model's shape: a 64-wide
// head, 9 query heads over 3 key/value heads in a paged f16 cache of 16-slot
// blocks, one thread's share (a group of 3 query heads and one of 2).
// Reports the best of 30 batches (the least disturbed on a shared host) for
// each context length, with the keys and values hot in cache.
//
//   attention_bench [positions ...]   (default: 16 64 128 512 1024 2048)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/quants.h"

using namespace inferd::kernels;

int main(int argc, char** argv) {
  std::vector<int64_t> lengths;
  for (int i = 1; i < argc; ++i) lengths.push_back(std::atoll(argv[i]));
  if (lengths.empty()) lengths = {16, 64, 128, 512, 1024, 2048};
  const int64_t D = 64, kv_heads = 3, kv_dim = kv_heads * D, block = 16;
  const int64_t max_pos = *std::max_element(lengths.begin(), lengths.end());
  const int64_t n_blocks = (max_pos + block - 1) / block;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> k(n_blocks * block * kv_dim), v(k.size());
  for (auto& x : k) x = f32_to_f16(dist(rng));
  for (auto& x : v) x = f32_to_f16(dist(rng));
  std::vector<int32_t> table(n_blocks);  // blocks out of order, as a pool hands them out
  for (int64_t i = 0; i < n_blocks; ++i) table[i] = static_cast<int32_t>(i);
  std::shuffle(table.begin(), table.end(), rng);
  const PagedKV kv{k.data(), v.data(), kv_dim, block, table.data()};
  std::vector<float> q(5 * D), out(5 * D);
  for (float& x : q) x = dist(rng);

  std::printf("simd %s; decode attention, 3 + 2 query heads (one thread's share of SmolLM2's 9)\n", simd_level());
  std::printf("%10s %12s\n", "positions", "us per call");
  for (int64_t n : lengths) {
    const int reps = static_cast<int>(std::max<int64_t>(20, 20000 / n));
    double best = 1e30;
    for (int batch = 0; batch < 30; ++batch) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) {
        attend_heads(q.data(), 3, kv, 0, D, 0, n, 0.125f, AttentionPass::kDecode, out.data());
        attend_heads(q.data() + 3 * D, 2, kv, D, D, 0, n, 0.125f, AttentionPass::kDecode, out.data() + 3 * D);
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
    }
    std::printf("%10lld %12.2f\n", static_cast<long long>(n), best * 1e6);
  }
}
