// Micro-benchmark of decode attention on the default model's shape: a 64-wide
// head, 9 query heads over 3 key/value heads in a paged f16 cache of 16-slot
// blocks, one thread's share (a group of 3 query heads and one of 2; --heads
// sets the groups' sizes, each reading its own key/value head).
// Reports the best of 30 batches (the least disturbed on a shared host) for
// each context length and GGML flavour, with the keys and values hot in cache.
//
//   attention_bench [--flavour=avx512|avx2|both] [--prefill] [--heads=3,2] [--dim=64] [positions ...]
//   (default: both flavours, decode; 16 64 128 512 1024 2048 positions)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string_view>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/flavour.h"
#include "kernels/cpu/quants.h"

using namespace inferd::kernels;

int main(int argc, char** argv) {
  std::vector<int64_t> lengths;
  std::vector<GgmlFlavour> flavours = {GgmlFlavour::kAvx512, GgmlFlavour::kAvx2};
  AttentionPass pass = AttentionPass::kDecode;
  std::vector<int64_t> groups = {3, 2};  // query heads per key/value head
  int64_t D = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--flavour=")) {
      const std::string_view name = arg.substr(10);
      if (name == "both") continue;
      const auto f = parse_ggml_flavour(name);
      if (!f) {
        std::fprintf(stderr, "unknown flavour %s\n", argv[i]);
        return 2;
      }
      flavours = {*f};
    } else if (arg.starts_with("--heads=")) {
      groups.clear();
      for (const char* p = argv[i] + 8; *p != 0;) {
        char* end = nullptr;
        groups.push_back(std::strtoll(p, &end, 10));
        if (end == p || groups.back() < 1) {
          std::fprintf(stderr, "bad %s\n", argv[i]);
          return 2;
        }
        p = *end == ',' ? end + 1 : end;
      }
    } else if (arg.starts_with("--dim=")) {
      D = std::atoll(argv[i] + 6);
      if (D < 1) {
        std::fprintf(stderr, "bad %s\n", argv[i]);
        return 2;
      }
    } else if (arg == "--prefill") {
      pass = AttentionPass::kPrefill;
    } else {
      lengths.push_back(std::atoll(argv[i]));
    }
  }
  if (lengths.empty()) lengths = {16, 64, 128, 512, 1024, 2048};
  const int64_t kv_heads = static_cast<int64_t>(groups.size()), kv_dim = kv_heads * D, block = 16;
  int64_t n_heads = 0;
  for (int64_t g : groups) n_heads += g;
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
  std::vector<float> q(n_heads * D), out(n_heads * D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (float& x : q) x = dist(rng);

  std::printf("simd %s; %s attention, head size %lld, query heads per key/value head:", simd_level(),
              pass == AttentionPass::kDecode ? "decode" : "prefill", static_cast<long long>(D));
  for (int64_t g : groups) std::printf(" %lld", static_cast<long long>(g));
  std::printf("\n");
  std::printf("%10s", "positions");
  for (GgmlFlavour f : flavours) std::printf(" %8s us/call", ggml_flavour_name(f));
  std::printf("\n");
  for (int64_t n : lengths) {
    std::printf("%10lld", static_cast<long long>(n));
    for (GgmlFlavour f : flavours) {
      const int reps = static_cast<int>(std::max<int64_t>(20, 20000 / n));
      double best = 1e30;
      for (int batch = 0; batch < 30; ++batch) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; ++r) {
          for (int64_t g = 0, h = 0; g < kv_heads; h += groups[g], ++g)
            attend_heads(q.data() + h * D, groups[g], kv, g * D, D, 0, n, scale, pass, out.data() + h * D, f);
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
      }
      std::printf(" %16.2f", best * 1e6);
    }
    std::printf("\n");
  }
}
