// The host's int8 multiply-add peak, the ceiling of the fast tier's integer
// products (docs/benchmarks.md): AVX-512 VNNI (vpdpbusd on 12 independent
// accumulators, so latency never limits) and, where the CPU has AMX-INT8 and
// the OS grants the tile state, AMX (tdpbssd on 4 independent C tiles), on
// N threads at once; on a CPU without VNNI, AVX2's vpmaddubsw (32 byte
// products and 16 int16 sums an instruction) summed by vpaddw on 12
// accumulators: the multiplier's own rate, which any AVX2 int8 product (that
// must also widen its sums to int32) stays below. Prints one line per unit:
// "<unit> int8 peak: X GOPS" (one multiply-add counts as two operations).
//
// Usage: int8_peak [threads] [seconds per unit]
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

__attribute__((target("avx512f,avx512vnni"))) uint64_t vnni_loop(double seconds, int64_t* sink) {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  uint64_t iters = 0;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    for (int rep = 0; rep < 4096; ++rep)
      for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    iters += 4096;
  }
  __m512i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, acc[i]);
  *sink += _mm512_reduce_add_epi32(s);
  return iters * 12 * 64 * 2;  // 64 multiply-adds per instruction
}

// In assembly: each product is an independent instruction on fixed registers
// (a compiler is free to share the products of equal operands, or to spill).
uint64_t avx2_loop(double seconds, int64_t* sink) {
  alignas(32) int16_t out[16];
  uint64_t iters = 0;
  asm volatile("vpxor %%ymm0, %%ymm0, %%ymm0\n" ::: "xmm0");
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    for (int rep = 0; rep < 4096; ++rep) {
#define INFERD_PEAK_STEP(acc) "vpmaddubsw %%ymm13, %%ymm14, %%ymm15\n vpaddw %%ymm15, %%" acc ", %%" acc "\n"
      asm volatile(INFERD_PEAK_STEP("ymm0") INFERD_PEAK_STEP("ymm1") INFERD_PEAK_STEP("ymm2") INFERD_PEAK_STEP("ymm3")
                   INFERD_PEAK_STEP("ymm4") INFERD_PEAK_STEP("ymm5") INFERD_PEAK_STEP("ymm6") INFERD_PEAK_STEP("ymm7")
                   INFERD_PEAK_STEP("ymm8") INFERD_PEAK_STEP("ymm9") INFERD_PEAK_STEP("ymm10") INFERD_PEAK_STEP("ymm11")
                   ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                   "xmm11", "xmm15");
#undef INFERD_PEAK_STEP
    }
    iters += 4096;
  }
  asm volatile("vmovdqa %%ymm0, %0\n vzeroupper\n" : "=m"(out) :: "xmm0");
  *sink += out[0];
  return iters * 12 * 32 * 2;  // 32 multiply-adds per instruction
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

bool amx_granted() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8")) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

__attribute__((target("amx-tile,amx-int8"))) uint64_t amx_loop(double seconds, int64_t* sink) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
  alignas(64) static thread_local int8_t a[16 * 64], b[16 * 64];
  alignas(64) static thread_local int32_t c[16 * 16];
  for (int i = 0; i < 16 * 64; ++i) a[i] = static_cast<int8_t>(i % 7 - 3), b[i] = static_cast<int8_t>(i % 5 - 2);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, b, 64);
  _tile_loadd(6, a, 64);
  _tile_loadd(7, b, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  uint64_t iters = 0;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end) {
    for (int rep = 0; rep < 1024; ++rep) {
      _tile_dpbssd(0, 4, 5);
      _tile_dpbssd(1, 4, 7);
      _tile_dpbssd(2, 6, 5);
      _tile_dpbssd(3, 6, 7);
    }
    iters += 1024;
  }
  _tile_stored(0, c, 64);
  *sink += c[0];
  _tile_release();
  return iters * 4 * 16 * 16 * 64 * 2;  // a tile op: 16 x 16 x 64 multiply-adds
}

double measure(int threads, double seconds, uint64_t (*loop)(double, int64_t*)) {
  std::vector<std::thread> pool;
  std::atomic<uint64_t> ops{0};
  std::vector<int64_t> sinks(static_cast<size_t>(threads));
  const auto start = Clock::now();
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { ops += loop(seconds, &sinks[static_cast<size_t>(t)]); });
  for (std::thread& th : pool) th.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  return static_cast<double>(ops.load()) / elapsed / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 1.0;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512f")) {
    std::printf("vnni int8 peak: %.1f GOPS (%d threads)\n", measure(threads, seconds, vnni_loop), threads);
  } else {
    std::printf("vnni int8 peak: none (no AVX-512 VNNI)\n");
    if (__builtin_cpu_supports("avx2"))
      std::printf("avx2 int8 peak: %.1f GOPS (%d threads)\n", measure(threads, seconds, avx2_loop), threads);
  }
  if (amx_granted()) {
    std::printf("amx int8 peak: %.1f GOPS (%d threads)\n", measure(threads, seconds, amx_loop), threads);
  } else {
    std::printf("amx int8 peak: none (no AMX-INT8, or the tile state is not granted)\n");
  }
  return 0;
}
