// The fast tier's product with AVX2 (fast_gemm.h): a group's 16 rows as two
// halves of 8 lanes, each half against a tile of NT tokens, every code vector
// loaded (and its nibbles unpacked) once per tile and every activation word
// broadcast once per (token, vector).
//
// maddubs multiplies codes by activation bytes and adds adjacent pairs in
// int16: |u q + u' q'| <= 2 code_max 127. Its results are summed further in
// int16 while that stays below 2^15 (kRun vectors: 8 for 4-bit codes, 4 for
// Q5's and MXFP4's, 2 for Q6_K's), and only then widened to int32 by one madd:
// the integer sums are exact, and the multiplier ports, which bound this
// kernel, do one madd per run instead of one per vector. Codes of 128 and more
// (Q8_0's) are split into their top bit and the rest, each product exact.
// The float steps per block are fast_layout.h's, in its order.
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/weight_prefetch_x86.h"

namespace inferd::kernels {
namespace {

// a + b in int16 lanes, opaque to the compiler: left to itself, GCC
// reassociates a run of integer sums into a tree and spills the products it
// then holds at once.
inline __m256i add16(__m256i a, __m256i b) {
  __m256i r;
  asm("vpaddw %2, %1, %0" : "=x"(r) : "x"(a), "x"(b));
  return r;
}

// How a block's codes lie (fast_layout.h): bytes, nibbles, or nibbles and a
// plane of their top two bits (6-bit codes).
constexpr int kByteCodes = 0, kNibbleCodes = 1, kSixBitCodes = 2;

// Code vector c's top two bits from its plane vector, at bits 4 and 5 of
// each byte (a 16-bit shift: what crosses between bytes lands outside 0x30).
inline __m256i top2_of(__m256i plane, int c) {
  const int k = c % 4;  // bits 2k, 2k + 1
  const __m256i shifted = k == 0 ? _mm256_slli_epi16(plane, 4)
                          : k == 1 ? _mm256_slli_epi16(plane, 2)
                          : k == 2 ? plane
                                   : _mm256_srli_epi16(plane, 2);
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x30));
}

inline __m256i broadcast4(const int8_t* p) {
  int32_t four;
  std::memcpy(&four, p, 4);
  return _mm256_set1_epi32(four);
}

inline __m256 load8(const FastWeightsView& w, const uint8_t* at) {
  return w.half_scales ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)))
                       : _mm256_loadu_ps(reinterpret_cast<const float*>(at));
}

// 8 int8 codes as floats.
inline __m256 codes8(const uint8_t* at) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at))));
}

inline __m256 halves8(const uint8_t* at) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at))); }

// Half h's 8 scales and mins of block b of group g (fast_layout.h).
inline void scales_of(const FastWeightsView& w, int64_t g, int64_t b, int h, __m256* scale, __m256* min) {
  const uint8_t* blk = w.block_at(g, b);
  if (w.sub_scales) {
    // The file's codes times their super-block's factors: the float products the repacking would have stored.
    const uint8_t* super = w.super_at(g, b) + 16 * h;
    *scale = _mm256_mul_ps(halves8(super), codes8(blk + w.quant_bytes() + 8 * h));
    *min = w.min_factor != 0.0f ? _mm256_mul_ps(*scale, _mm256_set1_ps(w.min_factor))
                                : _mm256_mul_ps(halves8(super + 2 * kFastRows), codes8(blk + w.min_offset() + 8 * h));
    return;
  }
  const size_t half = 8 * w.scale_bytes() * static_cast<size_t>(h);
  *scale = load8(w, blk + w.quant_bytes() + half);
  *min = w.min_factor != 0.0f ? _mm256_mul_ps(*scale, _mm256_set1_ps(w.min_factor)) : load8(w, blk + w.min_offset() + half);
}

// NT tokens from t against the 16 rows of group g, as two halves of 8 lanes
// that share every activation broadcast. kRun: code vectors whose maddubs
// products sum in int16 (0: codes up to 255, split). The codes of block b are
// at codes + b * code_stride, 64 bytes a vector as fast_layout.h lays them
// (with kNibbleCodes, packed two to a byte, and unpacked here; with
// kSixBitCodes, their top bits or-ed in from the plane). `stream`: this
// tile is the first pass over the group's weights, which it prefetches ahead
// (weight_prefetch_x86.h: decode reads them once, from memory).
template <int B, int kNibbles, int kRun, int NT>
void tile(const FastWeightsView& w, const uint8_t* codes, size_t code_stride, const FastActsView& a, int64_t g,
          int64_t t, float* y, size_t y_stride, int rows, bool stream) {
  constexpr int V = B / 4;  // code vectors per block
  static_assert(kRun == 0 || V % kRun == 0);
  const int64_t nb32 = a.cols / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  const int8_t* q0 = a.q + t * a.cols;
  __m256 acc[2][NT];
  for (int j = 0; j < NT; ++j) acc[0][j] = acc[1][j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < w.blocks(); ++b) {
    const uint8_t* blk = codes + b * code_stride;
    const int8_t* qb = q0 + b * B;
    if (stream) prefetch_weights_ahead(w.block_at(g, b), w.block_bytes, NT == 1);
    __m256i isum[2][NT], s16[2][NT];
    const auto load = [&](int i, int h) __attribute__((always_inline)) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * i + 32 * h));
    };
    if constexpr (kRun == 0) {
      // Codes up to 255: the top bit and the rest apart, each product exact.
      const __m256i low7 = _mm256_set1_epi8(0x7F), sign_weight = _mm256_set1_epi16(128);
      for (int c = 0; c < V; ++c) {
        const __m256i c0 = load(c, 0), c1 = load(c, 1);
        const __m256i top[2] = {_mm256_srli_epi16(_mm256_andnot_si256(low7, c0), 7),
                                _mm256_srli_epi16(_mm256_andnot_si256(low7, c1), 7)};
        const __m256i rest[2] = {_mm256_and_si256(c0, low7), _mm256_and_si256(c1, low7)};
        for (int j = 0; j < NT; ++j) {
          const __m256i x = broadcast4(qb + j * a.cols + 4 * c);
          for (int h = 0; h < 2; ++h) {
            const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(rest[h], x), ones),
                                               _mm256_madd_epi16(_mm256_maddubs_epi16(top[h], x), sign_weight));
            isum[h][j] = c == 0 ? s : _mm256_add_epi32(isum[h][j], s);
          }
        }
      }
    } else {
      // Code vector c (columns 4c..4c+3) of both halves against every token,
      // into the int16 sums (starting them with the run's first vector).
      const auto step = [&](__m256i c0, __m256i c1, int c, bool first) __attribute__((always_inline)) {
        for (int j = 0; j < NT; ++j) {
          const __m256i x = broadcast4(qb + j * a.cols + 4 * c);
          const __m256i p0 = _mm256_maddubs_epi16(c0, x), p1 = _mm256_maddubs_epi16(c1, x);
          if constexpr (NT == 1) {
            // One token (decode) leaves registers to spare, and the compiler's
            // own adds ran its tile faster (kernels_bench "fast L2 GEMV").
            s16[0][j] = first ? p0 : _mm256_add_epi16(s16[0][j], p0);
            s16[1][j] = first ? p1 : _mm256_add_epi16(s16[1][j], p1);
          } else {
            s16[0][j] = first ? p0 : add16(s16[0][j], p0);
            s16[1][j] = first ? p1 : add16(s16[1][j], p1);
          }
        }
      };
      for (int r = 0; r < V / kRun; ++r) {
        if constexpr (kNibbles != kByteCodes) {
          // Load i gives columns 4i.. (low nibbles) and 4(i + V/2).. (high).
          const __m256i low_nibble = _mm256_set1_epi8(0x0F);
          for (int k = 0; k < kRun / 2; ++k) {
            const int i = r * kRun / 2 + k;
            const __m256i p0 = load(i, 0), p1 = load(i, 1);
            __m256i lo0 = _mm256_and_si256(p0, low_nibble), lo1 = _mm256_and_si256(p1, low_nibble);
            __m256i hi0 = _mm256_and_si256(_mm256_srli_epi16(p0, 4), low_nibble);
            __m256i hi1 = _mm256_and_si256(_mm256_srli_epi16(p1, 4), low_nibble);
            if constexpr (kNibbles == kSixBitCodes) {
              const auto plane = [&](int c, int h) __attribute__((always_inline)) {
                return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 8 * B + 64 * (c / 4) + 32 * h));
              };
              lo0 = _mm256_or_si256(lo0, top2_of(plane(i, 0), i));
              lo1 = _mm256_or_si256(lo1, top2_of(plane(i, 1), i));
              hi0 = _mm256_or_si256(hi0, top2_of(plane(i + V / 2, 0), i + V / 2));
              hi1 = _mm256_or_si256(hi1, top2_of(plane(i + V / 2, 1), i + V / 2));
            }
            step(lo0, lo1, i, k == 0);
            step(hi0, hi1, i + V / 2, false);
          }
        } else {
          for (int k = 0; k < kRun; ++k) {
            const int c = r * kRun + k;
            step(load(c, 0), load(c, 1), c, k == 0);
          }
        }
        for (int h = 0; h < 2; ++h)
          for (int j = 0; j < NT; ++j) {
            const __m256i s = _mm256_madd_epi16(s16[h][j], ones);
            isum[h][j] = r == 0 ? s : _mm256_add_epi32(isum[h][j], s);
          }
      }
    }
    __m256 scale[2], min[2];
    scales_of(w, g, b, 0, &scale[0], &min[0]);
    scales_of(w, g, b, 1, &scale[1], &min[1]);
    for (int j = 0; j < NT; ++j) {
      const int64_t tt = t + j;
      const __m256 d = _mm256_set1_ps(a.d[tt * nb32 + b * B / 32]);
      const __m256 dsum = _mm256_set1_ps(B == 32 ? a.dsum32[tt * nb32 + b] : a.dsum16[tt * 2 * nb32 + b]);
      for (int h = 0; h < 2; ++h) {
        acc[h][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[h][j]), _mm256_mul_ps(scale[h], d), acc[h][j]);
        acc[h][j] = _mm256_fmadd_ps(min[h], dsum, acc[h][j]);
      }
    }
  }
  for (int j = 0; j < NT; ++j) {
    float* out = y + j * y_stride;
    if (rows == kFastRows) {
      _mm256_storeu_ps(out, acc[0][j]);
      _mm256_storeu_ps(out + 8, acc[1][j]);
    } else {
      alignas(32) float tmp[kFastRows];
      _mm256_store_ps(tmp, acc[0][j]);
      _mm256_store_ps(tmp + 8, acc[1][j]);
      std::memcpy(out, tmp, sizeof(float) * rows);
    }
  }
}

// Tokens per tile: 2 x NT int16 sums, 2 x NT float sums (and 2 x NT int32
// sums where a block holds more than one run) beside two code vectors, a
// broadcast and the constants, in 16 registers.
template <int B, int kRun>
constexpr int kTileTokens = (kRun == 0 || kRun < B / 4) ? 2 : 3;

// Tokens whose activation rows stay in L1/L2 while every group passes over them.
constexpr int64_t kChunkTokens = 48;
// From this many tokens a group's 4-bit codes are unpacked to bytes once per
// chunk, not once per tile.
constexpr int64_t kUnpackTokens = 6;

// A group's 4-bit (or 6-bit) codes as bytes, in the layout of a byte
// format's (V vectors of 64 bytes a block, no scales), into out.
template <int B, int kNibbles>
void unpack_group(const FastWeightsView& w, int64_t g, uint8_t* out) {
  const __m256i low_nibble = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < w.blocks(); ++b, out += B * kFastRows) {
    const uint8_t* blk = w.block_at(g, b);
    for (int i = 0; i < B / 8; ++i)
      for (int h = 0; h < 2; ++h) {
        const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * i + 32 * h));
        __m256i lo = _mm256_and_si256(p, low_nibble), hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low_nibble);
        if constexpr (kNibbles == kSixBitCodes) {
          const int c = i + B / 8;  // the high nibbles' code vector
          const auto plane = [&](int v) {
            return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 8 * B + 64 * (v / 4) + 32 * h));
          };
          lo = _mm256_or_si256(lo, top2_of(plane(i), i));
          hi = _mm256_or_si256(hi, top2_of(plane(c), c));
        }
        _mm256_store_si256(reinterpret_cast<__m256i*>(out + 64 * i + 32 * h), lo);
        _mm256_store_si256(reinterpret_cast<__m256i*>(out + 64 * (i + B / 8) + 32 * h), hi);
      }
  }
}

// Tokens [t, t + n) of a chunk against group g, in tiles of NT, then the rest.
// `stream`: the group's weights are read from where they lie (not unpacked
// into L1 first), so the first tile prefetches them.
template <int B, int kNibbles, int kRun>
void tokens(const FastWeightsView& w, const uint8_t* codes, size_t code_stride, const FastActsView& a, int64_t g,
            int64_t t, int64_t n, float* y, size_t y_stride, int rows, bool stream) {
  constexpr int NT = kTileTokens<B, kRun>;
  int64_t i = 0;
  for (; i + NT <= n; i += NT)
    tile<B, kNibbles, kRun, NT>(w, codes, code_stride, a, g, t + i, y + i * y_stride, y_stride, rows, stream && i == 0);
  if (n - i == 1) tile<B, kNibbles, kRun, 1>(w, codes, code_stride, a, g, t + i, y + i * y_stride, y_stride, rows, stream && i == 0);
  if constexpr (NT > 2)
    if (n - i == 2)
      tile<B, kNibbles, kRun, 2>(w, codes, code_stride, a, g, t + i, y + i * y_stride, y_stride, rows, stream && i == 0);
}

template <int B, int kNibbles, int kRun>
void groups(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0, int64_t g1, float* y,
            size_t y_stride) {
  thread_local std::vector<__m256i> unpacked;  // grown once, then reused: no allocation on the hot path
  if (kNibbles && nt >= kUnpackTokens) {
    const size_t need = static_cast<size_t>(w.blocks()) * B * kFastRows / sizeof(__m256i);
    if (unpacked.size() < need) unpacked.resize(need);
  }
  for (int64_t c0 = 0; c0 < nt; c0 += kChunkTokens) {
    const int64_t cn = std::min(kChunkTokens, nt - c0);
    for (int64_t g = g0; g < g1; ++g) {
      const int rows = static_cast<int>(std::min<int64_t>(kFastRows, w.rows - g * kFastRows));
      float* yg = y + c0 * y_stride + g * kFastRows;
      if (kNibbles && nt >= kUnpackTokens) {
        const auto* codes = reinterpret_cast<const uint8_t*>(unpacked.data());
        unpack_group<B, kNibbles>(w, g, reinterpret_cast<uint8_t*>(unpacked.data()));
        tokens<B, kByteCodes, kRun>(w, codes, B * kFastRows, a, g, t0 + c0, cn, yg, y_stride, rows, false);
      } else {
        tokens<B, kNibbles, kRun>(w, w.block_at(g, 0), w.block_bytes, a, g, t0 + c0, cn, yg, y_stride, rows, true);
      }
    }
  }
}

// The longest run of maddubs results an int16 lane holds: 2 code_max 127 each.
int run_of(const FastWeightsView& w) {
  if (w.code_max > 127) return 0;
  const int fit = 32767 / (2 * w.code_max * 127);
  int run = 1;
  while (run * 2 <= std::min(fit, w.block / 4)) run *= 2;
  return run;
}

void fast_groups_avx2_impl(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0,
                           int64_t g1, float* y, size_t y_stride) {
  // The formats' runs (fast_gemm.cpp's code_max): 4-bit codes 8 (a whole
  // 32-column block) or 4 (a 16-column one), Q5's and MXFP4's 4, Q6_K's 2,
  // Q8_0's split.
  const int run = run_of(w);
  if (w.block == 32) {
    if (w.nibbles && !w.top2 && run == 8) return groups<32, kNibbleCodes, 8>(w, a, t0, nt, g0, g1, y, y_stride);
    if (!w.nibbles && run == 4) return groups<32, kByteCodes, 4>(w, a, t0, nt, g0, g1, y, y_stride);
    if (!w.nibbles && run == 0) return groups<32, kByteCodes, 0>(w, a, t0, nt, g0, g1, y, y_stride);
  } else {
    if (w.top2 && run == 2) return groups<16, kSixBitCodes, 2>(w, a, t0, nt, g0, g1, y, y_stride);
    if (w.nibbles && !w.top2 && run == 4) return groups<16, kNibbleCodes, 4>(w, a, t0, nt, g0, g1, y, y_stride);
    if (!w.nibbles && run == 2) return groups<16, kByteCodes, 2>(w, a, t0, nt, g0, g1, y, y_stride);
  }
  // A format of other codes: one vector a run (exact for codes below 128),
  // nibbles and 6-bit codes unpacked to bytes first.
  if (run == 0) return groups<32, kByteCodes, 0>(w, a, t0, nt, g0, g1, y, y_stride);
  assert(!w.nibbles && "every format with nibbles has its own case above");
  if (w.block == 32) return groups<32, kByteCodes, 1>(w, a, t0, nt, g0, g1, y, y_stride);
  return groups<16, kByteCodes, 1>(w, a, t0, nt, g0, g1, y, y_stride);
}

// The quantizer (FastQuantizeFn), a block per step: the scalar reference's
// float steps (the maximum of |x| and integer sums are exact in any order).
void fast_quantize_avx2_impl(const float* x, int64_t n_blocks, int8_t* q, float* d_out, float* dsum32, float* dsum16) {
  const __m256 round = _mm256_set1_ps(12582912.0f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < n_blocks; ++b, x += 32, q += 32) {
    __m256 v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(x + 8 * k);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                             _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i qi[4];
    for (int k = 0; k < 4; ++k) {
      __m256 p = _mm256_mul_ps(v[k], vid);
      // Opaque, so the compiler does not fuse the product into the add (one
      // rounding where the reference has two: other bits near halves).
      asm("" : "+x"(p));
      qi[k] = _mm256_cvtps_epi32(_mm256_sub_ps(_mm256_add_ps(p, round), round));
    }
    // int32 -> int8 (no saturation happens: |q| <= 127), back in column order.
    const __m256i p16 = _mm256_packs_epi32(qi[0], qi[1]), p16b = _mm256_packs_epi32(qi[2], qi[3]);
    const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), p8);
    auto hsum = [](__m256i lo, __m256i hi) {
      const __m256i s = _mm256_add_epi32(lo, hi);
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
      return _mm_cvtsi128_si32(s4);
    };
    const int s0 = hsum(qi[0], qi[1]), s1 = hsum(qi[2], qi[3]);
    d_out[b] = d;
    dsum32[b] = d * static_cast<float>(s0 + s1);
    dsum16[2 * b] = d * static_cast<float>(s0);
    dsum16[2 * b + 1] = d * static_cast<float>(s1);
  }
}

}  // namespace

FastGroupsFn fast_groups_avx2() { return fast_groups_avx2_impl; }
FastQuantizeFn fast_quantize_avx2() { return fast_quantize_avx2_impl; }

}  // namespace inferd::kernels
