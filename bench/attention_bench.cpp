// Micro-benchmark of decode attention on the default model's shape: a 64-wide
// head, 9 query heads over 3 key/value heads in a paged f16 cache of 16-slot
// blocks, one thread's share (a group of 3 query heads and one of 2; --heads
// sets the groups' sizes, each reading its own key/value head).
// Reports the best of 30 batches (the least disturbed on a shared host) for
// each context length and GGML flavour, with the keys and values hot in cache.
//
//   attention_bench [--flavour=avx512|avx2|both] [--prefill] [--heads=3,2] [--dim=64] [positions ...]
//   (default: both flavours, decode; 16 64 128 512 1024 2048 positions)
//
// --tile=T measures prefill as a model step runs it: the last 64 tokens of a
// causal prompt of n positions (token i reads positions [0, i + 1)), token by
// token (attend_heads, kPrefill) and in tiles of T tokens
// (attend_heads_tile), alternating batch by batch, in the flavour asked for
// (the first of --flavour's); us per token (best of 30 batches, the thread's
// CPU time) and the ratio:
//
//   attention_bench --tile=8 [--heads=3,3,3] [--dim=64] [--fast-tile=16] [positions ...]
//
// --fast-tile=F adds the fast tier's kernel (attention_fast.h) in tiles of F
// tokens, alternating with the other two, and its time against the tiled one's.
//
// --cold measures long-context decode as a model step sees it: the keys and
// values come from memory, not cache (each call reads another layer of a pool
// of several hundred MiB, far beyond L3, while a real step streams the weights
// between two attention layers), blocks of 16 slots are shuffled in the block
// table and a block holds every layer (PagedKV::block_stride), as the KV cache
// lays them out (8 layers, as Qwen3.5-4B's full-attention ones; sequences
// enough to fill 512 MiB), a block's slots head by head as the cache keeps
// them (kv::KVCacheSpec). It reports the best of --reps rounds as GB/s of keys and
// values read, for each shape, cache dtype and context length:
//
//   attention_bench --cold [--reps=5] [--in-order] [--slot-by-slot] [--flavour=...]
//                   [--shape=D:groups:slot_heads ...] [--dtype=f16,q8_0,q4_0] [positions ...]
//   (--in-order: the block table in pool order, as a fresh pool deals it;
//   --slot-by-slot: a slot's heads together, the cache's layout before)
//   (--warm: the same, each call reading the same layer of one sequence, so
//   keys and values that fit stay in cache: the kernel's compute bound)
//   (--fast-decode: also the fast tier's decode, attend_heads_fast_parts over
//   the whole range in one call and the join, f16 only, as flavour "fast")
//   (default shapes: 256:4,4:4 (Qwen3.5-4B, one thread of two), 64:3,2:3
//   (SmolLM2-135M's 9 over 3), 64:7:2 (Qwen2.5-0.5B's 14 over 2, one
//   thread); positions 4096 16384)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <random>
#include <string_view>
#include <vector>

#include "core/aligned_bytes.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_fast.h"
#include "kernels/cpu/flavour.h"
#include "kernels/cpu/quants.h"

using namespace inferd::kernels;
using inferd::DType;

namespace {

// Query heads per key/value head for each key/value head a thread reads, of D
// elements, in slots of slot_heads heads.
struct Shape {
  int64_t D;
  std::vector<int64_t> groups;
  int64_t slot_heads;
};

std::vector<int64_t> parse_list(const char* p) {
  std::vector<int64_t> out;
  while (*p != 0 && *p != ':') {
    char* end = nullptr;
    out.push_back(std::strtoll(p, &end, 10));
    if (end == p || out.back() < 1) return {};
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

// "D:g0,g1,...:slot_heads"
std::optional<Shape> parse_shape(const char* text) {
  Shape s;
  char* end = nullptr;
  s.D = std::strtoll(text, &end, 10);
  if (*end != ':' || s.D < 32 || s.D % 32 != 0) return std::nullopt;
  s.groups = parse_list(end + 1);
  const char* colon = std::strchr(end + 1, ':');
  if (s.groups.empty() || colon == nullptr) return std::nullopt;
  s.slot_heads = std::atoll(colon + 1);
  if (s.slot_heads < static_cast<int64_t>(s.groups.size())) return std::nullopt;
  return s;
}

// One cold measurement: decode attention of the shape's groups at n
// positions, over a pool whose blocks hold kLayers layers, shared by as many
// sequences as make the pool 512 MiB or more; each call reads another layer
// of another sequence. Returns the best GB/s over `reps` rounds of them all.
double cold_gbps(const Shape& shape, DType dtype, GgmlFlavour flavour, int64_t n, int reps, bool in_order,
                 bool slot_by_slot, bool warm, bool fast, std::mt19937& rng) {
  constexpr int64_t kBlock = 16, kLayers = 8;  // Qwen3.5-4B's full-attention layers
  const int64_t D = shape.D, slot = shape.slot_heads * D;
  const size_t slot_bytes = row_bytes(dtype, slot), layer_bytes = kBlock * slot_bytes;
  const size_t block_stride = kLayers * layer_bytes;
  const int64_t n_blocks = (n + kBlock - 1) / kBlock;
  const int64_t seqs = std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(512.0 * (1 << 20) / static_cast<double>(n_blocks * block_stride))));
  const int64_t pool_blocks = seqs * n_blocks;
  // Huge pages, not zeroed, as the KV cache allocates its pools.
  inferd::AlignedBytes k_pool(pool_blocks * block_stride, /*huge_pages=*/true, /*zeroed=*/false),
      v_pool(k_pool.size(), true, false);
  std::byte* k = reinterpret_cast<std::byte*>(k_pool.data());
  std::byte* v = reinterpret_cast<std::byte*>(v_pool.data());
  // Eight random layer-blocks of values, copied round the pool (the values do
  // not change the time; quantizing 1 GiB would).
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> row(slot);
  std::vector<std::byte> pattern(8 * 2 * layer_bytes);
  for (size_t off = 0; off < pattern.size(); off += slot_bytes) {
    for (float& x : row) x = dist(rng);
    quantize_row(dtype, row.data(), pattern.data() + off, slot);
  }
  for (int64_t b = 0; b < pool_blocks * kLayers; ++b) {
    const std::byte* src = pattern.data() + (b % 8) * 2 * layer_bytes;
    std::memcpy(k + b * layer_bytes, src, layer_bytes);
    std::memcpy(v + b * layer_bytes, src + layer_bytes, layer_bytes);
  }
  // The pool's blocks dealt out to the sequences in random order (a pool
  // after many requests), or in order (a fresh one).
  std::vector<int32_t> tables(pool_blocks);
  for (int64_t i = 0; i < pool_blocks; ++i) tables[i] = static_cast<int32_t>(i);
  if (!in_order) std::shuffle(tables.begin(), tables.end(), rng);

  int64_t n_heads = 0;
  for (int64_t g : shape.groups) n_heads += g;
  std::vector<float> q(n_heads * D), out(n_heads * D);
  for (float& x : q) x = dist(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // The fast tier's decode: every part of the range in one call, then the join.
  const int64_t n_parts = fast_decode_parts(0, n), max_group = *std::max_element(shape.groups.begin(), shape.groups.end());
  std::vector<float> part_m(fast ? n_parts * max_group : 0), part_lanes(8 * part_m.size()), part_o(part_m.size() * D);
  const FastAttentionState parts{part_m.data(), part_lanes.data(), part_o.data()};
  const double bytes_read =
      2.0 * static_cast<double>(n) * static_cast<double>(row_bytes(dtype, D)) * static_cast<double>(shape.groups.size());
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    for (int64_t call = 0; call < seqs * kLayers; ++call) {
      const int64_t l = warm ? 0 : call % kLayers, seq = warm ? 0 : call / kLayers;
      // Head by head: a slot is a head apart, head g's run g * kBlock heads in.
      const PagedKV kv{k + l * layer_bytes, v + l * layer_bytes, slot_by_slot ? slot : D, kBlock,
                       tables.data() + seq * n_blocks, dtype, static_cast<int64_t>(block_stride)};
      const int64_t head_stride = slot_by_slot ? D : kBlock * D;
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t g = 0, h = 0; g < static_cast<int64_t>(shape.groups.size()); h += shape.groups[g], ++g) {
        if (fast) {
          attend_heads_fast_parts(q.data() + h * D, shape.groups[g], kv, g * head_stride, D, 0, n, scale, parts);
          join_fast_attention_states(parts, n_parts, shape.groups[g], D, nullptr, out.data() + h * D);
          continue;
        }
        attend_heads(q.data() + h * D, shape.groups[g], kv, g * head_stride, D, 0, n, scale, AttentionPass::kDecode,
                     out.data() + h * D, flavour);
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  return bytes_read / best * 1e-9;
}

int run_cold(std::vector<Shape> shapes, std::vector<DType> dtypes, const std::vector<GgmlFlavour>& flavours,
             std::vector<int64_t> lengths, int reps, bool in_order, bool slot_by_slot, bool warm, bool fast_decode) {
  if (shapes.empty()) shapes = {{256, {4, 4}, 4}, {64, {3, 2}, 3}, {64, {7}, 2}};
  if (dtypes.empty()) dtypes = {DType::F16, DType::Q8_0, DType::Q4_0};
  if (lengths.empty()) lengths = {4096, 16384};
  std::mt19937 rng(1);
  std::printf("simd %s; %s decode attention, blocks %s, slots %s, GB/s of keys and values read (best of %d)\n",
              simd_level(), warm ? "warm (one sequence's layer again and again)" : "cold",
              in_order ? "in order" : "shuffled", slot_by_slot ? "slot by slot" : "head by head", reps);
  std::printf("%-14s %-6s %-7s %9s %9s\n", "shape", "dtype", "flavour", "positions", "GB/s");
  for (const Shape& shape : shapes) {
    char name[64];
    int len = std::snprintf(name, sizeof name, "%lld:", static_cast<long long>(shape.D));
    for (size_t i = 0; i < shape.groups.size(); ++i)
      len += std::snprintf(name + len, sizeof name - len, "%s%lld", i ? "," : "", static_cast<long long>(shape.groups[i]));
    std::snprintf(name + len, sizeof name - len, ":%lld", static_cast<long long>(shape.slot_heads));
    for (DType dtype : dtypes) {
      // Quantized caches have one kernel whatever the flavour.
      const std::vector<GgmlFlavour> fl = dtype == DType::F16 ? flavours : std::vector<GgmlFlavour>{flavours[0]};
      for (GgmlFlavour f : fl)
        for (int64_t n : lengths)
          std::printf("%-14s %-6s %-7s %9lld %9.1f\n", name, inferd::dtype_name(dtype),
                      dtype == DType::F16 ? ggml_flavour_name(f) : "-", static_cast<long long>(n),
                      cold_gbps(shape, dtype, f, n, reps, in_order, slot_by_slot, warm, false, rng));
      if (fast_decode && fast_attention_reads(dtype, shape.D))
        for (int64_t n : lengths)
          std::printf("%-14s %-6s %-7s %9lld %9.1f\n", name, inferd::dtype_name(dtype), "fast",
                      static_cast<long long>(n),
                      cold_gbps(shape, dtype, flavours[0], n, reps, in_order, slot_by_slot, warm, true, rng));
      std::fflush(stdout);
    }
  }
  return 0;
}

// --tile: the last kTokens tokens of causal prompts of each length, token by
// token and in tiles, for each key/value head's group of query heads.
int run_tiles(const std::vector<int64_t>& groups, int64_t D, std::vector<int64_t> lengths, int64_t tile,
              GgmlFlavour flavour, int64_t fast_tile) {
  constexpr int64_t kTokens = 64, kBlock = 16;
  if (lengths.empty()) lengths = {512, 2048, 8192};
  const int64_t kv_heads = static_cast<int64_t>(groups.size());
  int64_t n_heads = 0;
  for (int64_t g : groups) n_heads += g;
  const int64_t max_pos = *std::max_element(lengths.begin(), lengths.end());
  const int64_t n_blocks = (max_pos + kBlock - 1) / kBlock;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  // Head by head, as the KV cache lays a block out.
  std::vector<uint16_t> k(n_blocks * kBlock * kv_heads * D), v(k.size());
  for (auto& x : k) x = f32_to_f16(dist(rng));
  for (auto& x : v) x = f32_to_f16(dist(rng));
  std::vector<int32_t> table(n_blocks);
  for (int64_t i = 0; i < n_blocks; ++i) table[i] = static_cast<int32_t>(i);
  std::shuffle(table.begin(), table.end(), rng);
  const PagedKV kv{k.data(), v.data(), D, kBlock, table.data(), DType::F16,
                   static_cast<int64_t>(kBlock * kv_heads * D * sizeof(uint16_t))};
  const int64_t row = n_heads * D;
  std::vector<float> q(kTokens * row), out(q.size()), out_tiled(q.size()), out_fast(q.size());
  for (float& x : q) x = dist(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::printf("simd %s; prefill attention of %lld tokens ending at each length, flavour %s, head size %lld, query "
              "heads per key/value head:", simd_level(), static_cast<long long>(kTokens), ggml_flavour_name(flavour),
              static_cast<long long>(D));
  for (int64_t g : groups) std::printf(" %lld", static_cast<long long>(g));
  std::printf("; tiles of %lld\n%10s %18s %18s %12s", static_cast<long long>(tile), "positions",
              "per token us/tok", "tiled us/tok", "tiled/per");
  if (fast_tile > 0) std::printf(" %14s %12s", "fast us/tok", "fast/tiled");
  std::printf("\n");
  for (int64_t n : lengths) {
    std::vector<int64_t> begin(kTokens, 0), end(kTokens);
    for (int64_t i = 0; i < kTokens; ++i) end[i] = n - kTokens + i + 1;
    auto per_token = [&] {
      for (int64_t g = 0, h = 0; g < kv_heads; h += groups[g], ++g)
        for (int64_t i = 0; i < kTokens; ++i)
          attend_heads(q.data() + i * row + h * D, groups[g], kv, g * kBlock * D, D, begin[i], end[i], scale,
                       AttentionPass::kPrefill, out.data() + i * row + h * D, flavour);
    };
    // Each key/value head's tokens in tiles of `size` through `kernel(tile, group, head offset)`.
    auto in_tiles = [&](int64_t size, std::vector<float>& result, auto&& kernel) {
      for (int64_t g = 0, h = 0; g < kv_heads; h += groups[g], ++g)
        for (int64_t i0 = 0; i0 < kTokens; i0 += size) {
          const AttentionTile t{q.data() + i0 * row + h * D, row, result.data() + i0 * row + h * D, row,
                                std::min(size, kTokens - i0), begin.data() + i0, end.data() + i0};
          kernel(t, groups[g], g * kBlock * D);
        }
    };
    auto tiled = [&] {
      in_tiles(tile, out_tiled, [&](const AttentionTile& t, int64_t group, int64_t head_offset) {
        attend_heads_tile(t, group, kv, head_offset, D, scale, flavour);
      });
    };
    auto fast = [&] {
      in_tiles(fast_tile, out_fast, [&](const AttentionTile& t, int64_t group, int64_t head_offset) {
        attend_heads_tile_fast(t, group, kv, head_offset, D, scale, nullptr);
      });
    };
    // The thread's CPU time, not the wall clock's: on a shared host the
    // other processes' time slices would count otherwise.
    auto cpu_seconds = [] {
      timespec ts{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
    };
    double best[3] = {1e30, 1e30, 1e30};
    for (int batch = 0; batch < 30; ++batch) {
      for (int which = 0; which < (fast_tile > 0 ? 3 : 2); ++which) {
        const double t0 = cpu_seconds();
        which == 0 ? per_token() : which == 1 ? tiled() : fast();
        best[which] = std::min(best[which], cpu_seconds() - t0);
      }
    }
    if (std::memcmp(out.data(), out_tiled.data(), out.size() * sizeof(float)) != 0) {
      std::fprintf(stderr, "tiled results differ from per-token ones at %lld positions\n", static_cast<long long>(n));
      return 1;
    }
    std::printf("%10lld %18.2f %18.2f %12.3f", static_cast<long long>(n), best[0] / kTokens * 1e6,
                best[1] / kTokens * 1e6, best[1] / best[0]);
    if (fast_tile > 0) std::printf(" %14.2f %12.3f", best[2] / kTokens * 1e6, best[2] / best[1]);
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lengths;
  std::vector<GgmlFlavour> flavours = {GgmlFlavour::kAvx512, GgmlFlavour::kAvx2};
  AttentionPass pass = AttentionPass::kDecode;
  std::vector<int64_t> groups = {3, 2};  // query heads per key/value head
  int64_t D = 64, tile = 0, fast_tile = 0;
  bool cold = false, in_order = false, slot_by_slot = false, warm = false, fast_decode = false;
  int reps = 5;
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--in-order") {
      in_order = true;
      continue;
    }
    if (arg == "--fast-decode") {
      fast_decode = true;
      continue;
    }
    if (arg == "--slot-by-slot") {
      slot_by_slot = true;
      continue;
    }
    if (arg == "--cold") {
      cold = true;
      continue;
    }
    if (arg == "--warm") {  // --cold's shapes and dtypes, from cache
      cold = warm = true;
      continue;
    }
    if (arg.starts_with("--reps=")) {
      reps = std::max(1, std::atoi(argv[i] + 7));
      continue;
    }
    if (arg.starts_with("--shape=")) {
      const auto shape = parse_shape(argv[i] + 8);
      if (!shape) {
        std::fprintf(stderr, "bad %s (D:groups:slot_heads, e.g. 256:4,4:4)\n", argv[i]);
        return 2;
      }
      shapes.push_back(*shape);
      continue;
    }
    if (arg.starts_with("--dtype=")) {
      for (std::string_view rest = arg.substr(8); !rest.empty();) {
        const size_t comma = rest.find(',');
        const std::string_view name = rest.substr(0, comma);
        if (name == "f16") dtypes.push_back(DType::F16);
        else if (name == "q8_0") dtypes.push_back(DType::Q8_0);
        else if (name == "q4_0") dtypes.push_back(DType::Q4_0);
        else {
          std::fprintf(stderr, "bad %s (f16, q8_0, q4_0)\n", argv[i]);
          return 2;
        }
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
      }
      continue;
    }
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
    } else if (arg.starts_with("--tile=")) {
      tile = std::atoll(argv[i] + 7);
      if (tile < 1) {
        std::fprintf(stderr, "bad %s\n", argv[i]);
        return 2;
      }
    } else if (arg.starts_with("--fast-tile=")) {
      fast_tile = std::atoll(argv[i] + 12);
      if (fast_tile < 1) {
        std::fprintf(stderr, "bad %s\n", argv[i]);
        return 2;
      }
    } else if (arg == "--prefill") {
      pass = AttentionPass::kPrefill;
    } else {
      lengths.push_back(std::atoll(argv[i]));
    }
  }
  if (cold) return run_cold(shapes, dtypes, flavours, lengths, reps, in_order, slot_by_slot, warm, fast_decode);
  if (tile > 0) return run_tiles(groups, D, lengths, tile, flavours[0], fast_tile);
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
