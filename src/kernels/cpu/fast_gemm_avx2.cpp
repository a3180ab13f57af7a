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
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants_blocks.h"
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
// plane of their top two bits (6-bit codes) or top bit (5-bit codes).
constexpr int kByteCodes = 0, kNibbleCodes = 1, kSixBitCodes = 2, kFiveBitCodes = 3;
template <int kNibbles>
constexpr int kTopBits = kNibbles == kSixBitCodes ? 2 : kNibbles == kFiveBitCodes ? 1 : 0;
// Code vectors whose top bits share a plane vector.
template <int kNibbles>
constexpr int kPerPlane = kTopBits<kNibbles> > 0 ? 8 / kTopBits<kNibbles> : 1;

// Code vector c's top bits from its plane vector, at bit 4 (and 5) of each
// byte (a 16-bit shift: what crosses between bytes lands outside the mask).
template <int kNibbles>
inline __m256i top_bits_of(__m256i plane, int c) {
  const int at = kTopBits<kNibbles> * (c % kPerPlane<kNibbles>);  // the bits' place in the byte
  const __m256i shifted = at < 4 ? _mm256_slli_epi16(plane, 4 - at) : at > 4 ? _mm256_srli_epi16(plane, at - 4) : plane;
  return _mm256_and_si256(shifted, _mm256_set1_epi8(kTopBits<kNibbles> == 2 ? 0x30 : 0x10));
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

// Where a tile's weights and activations come from.
//   kBlockActs: 32-column activation blocks; block b's codes at codes + b *
//     code_stride; the float steps per block.
//   kSuperStream / kSuperPrepared: Q8_K activations (super_acts), a super-
//     block's integer sums in int32 and the float steps per super-block.
//     Stream: the packed layout (block b at codes + b * code_stride), the
//     scale codes read into int16 pairs per block, the offsets per super-block.
//     Prepared: a chunk's copy made by prepare_super_group, with the codes as
//     bytes and those pairs made once (SuperPrepared).
enum class TileActs { kBlockActs, kSuperStream, kSuperPrepared };

// A block's 16 scale codes (int8, one a row) as int16 pairs (c, c), one
// 32-bit lane a row, for each half of 8 rows: a madd of a half's int16 sums
// by them multiplies both sums of a lane by its row's code and adds them.
// (Each code into the high byte of both int16s, then shifted down with its sign.)
inline void scale_pairs_of(const uint8_t* codes16, __m256i* half0, __m256i* half1) {
  const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes16)));
  constexpr char z = static_cast<char>(0x80);  // a zero byte
  const __m256i rows0_7 = _mm256_setr_epi8(z, 0, z, 0, z, 1, z, 1, z, 2, z, 2, z, 3, z, 3,  //
                                           z, 4, z, 4, z, 5, z, 5, z, 6, z, 6, z, 7, z, 7);
  const __m256i rows8_15 = _mm256_add_epi8(rows0_7, _mm256_set1_epi16(0x0800));
  *half0 = _mm256_srai_epi16(_mm256_shuffle_epi8(v, rows0_7), 8);
  *half1 = _mm256_srai_epi16(_mm256_shuffle_epi8(v, rows8_15), 8);
}

// Two blocks' int8 codes of 8 rows as int16 pairs (lo, hi), one 32-bit lane a row.
inline __m256i code_pairs(const uint8_t* lo8, const uint8_t* hi8) {
  const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(lo8));
  const __m128i hi = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(hi8));
  return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(lo, hi));
}

// Offset pairs: a super-block's blocks in pairs (2p, 2p + 1), kOffsetPairs of
// them, each as int16 pairs of the blocks' offset codes for the 8 rows of
// half h (the stored min codes, or the scale codes where the min is mf times
// the scale). A madd by the pair's quant sums (OffsetSums) and the sum over
// p give each row's sum over blocks of code times the block's sum of quants.
template <int B>
constexpr int kOffsetPairs = kFastSuperBlock / B / 2;

template <int B>
inline __m256i offset_pairs(const FastWeightsView& w, const uint8_t* first, size_t bytes_per_block, int h, int p) {
  const size_t at = (w.min_factor == 0.0f ? w.min_offset() : w.quant_bytes()) + 8 * static_cast<size_t>(h);
  return code_pairs(first + 2 * p * bytes_per_block + at, first + (2 * p + 1) * bytes_per_block + at);
}

// A Q8_K block's sums of quants over the blocks 2p and 2p + 1 of B columns, as
// an int16 pair in every 32-bit lane (p < kOffsetPairs<B>). Blocks of 16 are
// its own bsums; blocks of 32 the sums of theirs by twos (|sum| <= 32 * 127).
template <int B>
struct OffsetSums {
  void of(const BlockQ8_K& y) {
    at = reinterpret_cast<const int8_t*>(y.bsums);
    if constexpr (B == 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums));
      by_32 = _mm256_hadd_epi16(v, v);  // 32-bit lanes (S0,S1) (S2,S3) . . | (S4,S5) (S6,S7) . .
    }
  }
  __m256i pair(int p) const {
    if constexpr (B == 32) {
      return _mm256_permutevar8x32_epi32(by_32, _mm256_set1_epi32(p < 2 ? p : p + 2));
    } else {
      return broadcast4(at + 4 * p);
    }
  }
  const int8_t* at = nullptr;
  __m256i by_32;
};

// A prepared super-block (kSuperPrepared): per block the codes as bytes
// (B/4 vectors of 64), then its scale codes as pairs (a vector a half); after
// the blocks, the kOffsetPairs offset pair vectors of each half.
template <int B>
struct SuperPrepared {
  static constexpr size_t kBlockStride = B * kFastRows + 64;
  static constexpr size_t kOffsets = kFastSuperBlock / B * kBlockStride;
  static constexpr size_t kStride = kOffsets + 2 * kOffsetPairs<B> * 32;
};

// NT tokens from t against the 16 rows of group g, as two halves of 8 lanes
// that share every activation broadcast. kRun: code vectors whose maddubs
// products sum in int16 (0: codes up to 255, split). The codes of block b are
// at codes + b * code_stride (kSuperPrepared: SuperPrepared's places), 64
// bytes a vector as fast_layout.h lays them (with kNibbleCodes, packed two to
// a byte, and unpacked here; with 5- or 6-bit codes, their top bits or-ed in from
// the plane). `stream`: this tile is the first pass over the group's weights,
// which it prefetches ahead (weight_prefetch_x86.h: decode reads them once,
// from memory).
template <int B, int kNibbles, int kRun, int NT, TileActs kActs>
void tile(const FastWeightsView& w, const uint8_t* codes, size_t code_stride, const FastActsView& a, int64_t g,
          int64_t t, float* y, size_t y_stride, int rows, bool stream) {
  constexpr int V = B / 4;  // code vectors per block
  constexpr bool kSuper = kActs != TileActs::kBlockActs;
  constexpr int kPerSuper = kFastSuperBlock / B;
  static_assert(kRun == 0 || V % kRun == 0);
  static_assert(!kSuper || kRun > 0);
  const int64_t nb32 = a.cols / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  // Token j's activation bytes of block b at qb + j * act_stride.
  const size_t act_stride = kSuper ? a.super_row_bytes : static_cast<size_t>(a.cols);
  const uint8_t* act0 = kSuper ? a.super + t * a.super_row_bytes : reinterpret_cast<const uint8_t*>(a.q + t * a.cols);
  __m256 acc[2][NT];
  for (int j = 0; j < NT; ++j) acc[0][j] = acc[1][j] = _mm256_setzero_ps();
  __m256i isum[2][NT];
  for (int64_t b = 0; b < w.blocks(); ++b) {
    const int64_t sb = b / kPerSuper;  // kSuper: the super-block, and the block's place in it
    const int jb = static_cast<int>(b % kPerSuper);
    const uint8_t* blk = kActs == TileActs::kSuperPrepared
                             ? codes + sb * SuperPrepared<B>::kStride + jb * SuperPrepared<B>::kBlockStride
                             : codes + b * code_stride;
    const int8_t* qb = reinterpret_cast<const int8_t*>(
        kSuper ? act0 + sb * sizeof(BlockQ8_K) + offsetof(BlockQ8_K, qs) + jb * B : act0 + b * B);
    if (stream) prefetch_weights_ahead(w.block_at(g, b), w.block_bytes, NT == 1, kFastWeightPrefetchLead);
    // kSuper: the block's scale codes as int16 pairs, each half's.
    __m256i scale_pairs[2];
    if constexpr (kActs == TileActs::kSuperStream) scale_pairs_of(blk + w.quant_bytes(), &scale_pairs[0], &scale_pairs[1]);
    const auto scaled = [&](__m256i s16, int h) __attribute__((always_inline)) {
      if constexpr (kActs == TileActs::kSuperPrepared)
        return _mm256_madd_epi16(s16, _mm256_load_si256(reinterpret_cast<const __m256i*>(blk + B * kFastRows + 32 * h)));
      else if constexpr (kActs == TileActs::kSuperStream)
        return _mm256_madd_epi16(s16, scale_pairs[h]);
      else
        return _mm256_madd_epi16(s16, ones);
    };
    __m256i s16[2][NT];
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
          const __m256i x = broadcast4(qb + j * act_stride + 4 * c);
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
          const __m256i x = broadcast4(qb + j * act_stride + 4 * c);
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
            if constexpr (kTopBits<kNibbles> > 0) {
              const auto plane = [&](int c, int h) __attribute__((always_inline)) {
                return _mm256_loadu_si256(
                    reinterpret_cast<const __m256i*>(blk + 8 * B + 64 * (c / kPerPlane<kNibbles>) + 32 * h));
              };
              lo0 = _mm256_or_si256(lo0, top_bits_of<kNibbles>(plane(i, 0), i));
              lo1 = _mm256_or_si256(lo1, top_bits_of<kNibbles>(plane(i, 1), i));
              hi0 = _mm256_or_si256(hi0, top_bits_of<kNibbles>(plane(i + V / 2, 0), i + V / 2));
              hi1 = _mm256_or_si256(hi1, top_bits_of<kNibbles>(plane(i + V / 2, 1), i + V / 2));
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
        // The run's int16 sums widened (times the block's scale codes, kSuper).
        const bool opens = r == 0 && (!kSuper || jb == 0);
        for (int h = 0; h < 2; ++h)
          for (int j = 0; j < NT; ++j) {
            const __m256i s = scaled(s16[h][j], h);
            isum[h][j] = opens ? s : _mm256_add_epi32(isum[h][j], s);
          }
      }
    }
    if constexpr (!kSuper) {
      __m256 scale[2], min[2];
      scales_of(w, g, b, 0, &scale[0], &min[0]);
      scales_of(w, g, b, 1, &scale[1], &min[1]);
      for (int j = 0; j < NT; ++j) {
        const int64_t tt = t + j;
        const __m256 d = _mm256_set1_ps(a.d[tt * nb32 + b * B / 32]);
        if (w.min_factor != 0.0f) {  // the min folded into the integer sum (fast_layout.h)
          const int32_t* bsum = a.bsum16 + tt * 2 * nb32 + b * B / 16;
          const __m256i folded =
              _mm256_set1_epi32(static_cast<int32_t>(w.min_factor) * (B == 32 ? bsum[0] + bsum[1] : bsum[0]));
          for (int h = 0; h < 2; ++h)
            acc[h][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(isum[h][j], folded)),
                                        _mm256_mul_ps(scale[h], d), acc[h][j]);
          continue;
        }
        const __m256 dsum = _mm256_set1_ps(B == 32 ? a.dsum32[tt * nb32 + b] : a.dsum16[tt * 2 * nb32 + b]);
        for (int h = 0; h < 2; ++h) {
          acc[h][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[h][j]), _mm256_mul_ps(scale[h], d), acc[h][j]);
          acc[h][j] = _mm256_fmadd_ps(min[h], dsum, acc[h][j]);
        }
      }
    } else if (jb == kPerSuper - 1) {
      // The super-block's end: the offsets' integer sums, then its float steps.
      const uint8_t* first = blk - jb * (kActs == TileActs::kSuperPrepared ? SuperPrepared<B>::kBlockStride : code_stride);
      const auto offsets = [&](int h, int p) __attribute__((always_inline)) {
        if constexpr (kActs == TileActs::kSuperPrepared)
          return _mm256_load_si256(
              reinterpret_cast<const __m256i*>(first + SuperPrepared<B>::kOffsets + 32 * (kOffsetPairs<B> * h + p)));
        else
          return offset_pairs<B>(w, first, code_stride, h, p);
      };
      const uint8_t* act_super = act0 + sb * sizeof(BlockQ8_K);
      const auto q8k = [&](int j) __attribute__((always_inline)) -> const BlockQ8_K& {
        return *reinterpret_cast<const BlockQ8_K*>(act_super + j * act_stride);
      };
      const auto d_of = [&](int j) __attribute__((always_inline)) { return _mm256_set1_ps(q8k(j).d); };
      const uint8_t* factors = w.super_at(g, b);
      const bool mins = w.min_factor == 0.0f;
      // msum: the offset codes times the quants' sums; with mins as mf times
      // the scale, mf times that goes into isum (fast_gemm.cpp's bounds).
      __m256i msum[2][NT];
      OffsetSums<B> sums[NT];
      for (int j = 0; j < NT; ++j) sums[j].of(q8k(j));
      for (int p = 0; p < kOffsetPairs<B>; ++p) {
        const __m256i o0 = offsets(0, p), o1 = offsets(1, p);
        for (int j = 0; j < NT; ++j) {
          const __m256i x = sums[j].pair(p);
          const __m256i m0 = _mm256_madd_epi16(o0, x), m1 = _mm256_madd_epi16(o1, x);
          msum[0][j] = p == 0 ? m0 : _mm256_add_epi32(msum[0][j], m0);
          msum[1][j] = p == 0 ? m1 : _mm256_add_epi32(msum[1][j], m1);
        }
      }
      if (!mins) {
        const __m256i mf = _mm256_set1_epi32(static_cast<int32_t>(w.min_factor));
        for (int h = 0; h < 2; ++h)
          for (int j = 0; j < NT; ++j) isum[h][j] = _mm256_add_epi32(isum[h][j], _mm256_mullo_epi32(msum[h][j], mf));
      }
      for (int h = 0; h < 2; ++h) {
        const __m256 dw = halves8(factors + 16 * h);
        for (int j = 0; j < NT; ++j)
          acc[h][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[h][j]), _mm256_mul_ps(dw, d_of(j)), acc[h][j]);
        if (mins) {
          const __m256 dminw = halves8(factors + 2 * kFastRows + 16 * h);
          for (int j = 0; j < NT; ++j)
            acc[h][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum[h][j]), _mm256_mul_ps(dminw, d_of(j)), acc[h][j]);
        }
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
// broadcast and the constants, in 16 registers. The super-block form always
// has the int32 sums; prepared, its scale pairs are memory operands, and its
// float sums are touched once a super-block.
template <int B, int kRun, TileActs kActs>
constexpr int kTileTokens = kActs == TileActs::kSuperPrepared                  ? 3
                            : kActs == TileActs::kSuperStream                   ? 2
                            : (kRun == 0 || kRun < B / 4)                       ? 2
                                                                                : 3;

// Tokens whose activation rows stay in L1/L2 while every group passes over them.
constexpr int64_t kChunkTokens = 48;
// From this many tokens a group's 4-bit codes are unpacked to bytes once per
// chunk, not once per tile (and a super-block form's group prepared).
constexpr int64_t kUnpackTokens = 6;

// Block b's codes as bytes (4-, 5- or 6-bit codes unpacked), in the layout of a
// byte format's (V vectors of 64 bytes, no scales), into out.
template <int B, int kNibbles>
void unpack_block(const FastWeightsView& w, const uint8_t* blk, uint8_t* out) {
  if constexpr (kNibbles == kByteCodes) {
    std::memcpy(out, blk, B * kFastRows);
    return;
  }
  const __m256i low_nibble = _mm256_set1_epi8(0x0F);
  for (int i = 0; i < B / 8; ++i)
    for (int h = 0; h < 2; ++h) {
      const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * i + 32 * h));
      __m256i lo = _mm256_and_si256(p, low_nibble), hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low_nibble);
      if constexpr (kTopBits<kNibbles> > 0) {
        const int c = i + B / 8;  // the high nibbles' code vector
        const auto plane = [&](int v) {
          return _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(blk + 8 * B + 64 * (v / kPerPlane<kNibbles>) + 32 * h));
        };
        lo = _mm256_or_si256(lo, top_bits_of<kNibbles>(plane(i), i));
        hi = _mm256_or_si256(hi, top_bits_of<kNibbles>(plane(c), c));
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + 64 * i + 32 * h), lo);
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + 64 * (i + B / 8) + 32 * h), hi);
    }
  (void)w;
}

// A group's 4-bit (or 5- or 6-bit) codes as bytes, block after block, into out.
template <int B, int kNibbles>
void unpack_group(const FastWeightsView& w, int64_t g, uint8_t* out) {
  for (int64_t b = 0; b < w.blocks(); ++b, out += B * kFastRows) unpack_block<B, kNibbles>(w, w.block_at(g, b), out);
}

// A group as SuperPrepared lays it (kSuperPrepared), into out (32-byte aligned).
template <int B, int kNibbles>
void prepare_super_group(const FastWeightsView& w, int64_t g, uint8_t* out) {
  constexpr int kPerSuper = kFastSuperBlock / B;
  for (int64_t s = 0; s < w.blocks() / kPerSuper; ++s, out += SuperPrepared<B>::kStride) {
    const uint8_t* first = w.block_at(g, s * kPerSuper);
    for (int j = 0; j < kPerSuper; ++j) {
      const uint8_t* blk = first + j * w.block_bytes;
      uint8_t* to = out + j * SuperPrepared<B>::kBlockStride;
      unpack_block<B, kNibbles>(w, blk, to);
      __m256i half0, half1;
      scale_pairs_of(blk + w.quant_bytes(), &half0, &half1);
      _mm256_store_si256(reinterpret_cast<__m256i*>(to + B * kFastRows), half0);
      _mm256_store_si256(reinterpret_cast<__m256i*>(to + B * kFastRows + 32), half1);
    }
    for (int h = 0; h < 2; ++h)
      for (int p = 0; p < kOffsetPairs<B>; ++p)
        _mm256_store_si256(reinterpret_cast<__m256i*>(out + SuperPrepared<B>::kOffsets + 32 * (kOffsetPairs<B> * h + p)),
                           offset_pairs<B>(w, first, w.block_bytes, h, p));
  }
}

// Tokens [t, t + n) of a chunk against group g, in tiles of NT, then the rest.
// `stream`: the group's weights are read from where they lie (not unpacked
// into L1 first), so the first tile prefetches them.
template <int B, int kNibbles, int kRun, TileActs kActs>
void tokens(const FastWeightsView& w, const uint8_t* codes, size_t code_stride, const FastActsView& a, int64_t g,
            int64_t t, int64_t n, float* y, size_t y_stride, int rows, bool stream) {
  constexpr int NT = kTileTokens<B, kRun, kActs>;
  int64_t i = 0;
  for (; i + NT <= n; i += NT)
    tile<B, kNibbles, kRun, NT, kActs>(w, codes, code_stride, a, g, t + i, y + i * y_stride, y_stride, rows,
                                       stream && i == 0);
  if (n - i == 1)
    tile<B, kNibbles, kRun, 1, kActs>(w, codes, code_stride, a, g, t + i, y + i * y_stride, y_stride, rows,
                                      stream && i == 0);
  if constexpr (NT > 2)
    if (n - i == 2)
      tile<B, kNibbles, kRun, 2, kActs>(w, codes, code_stride, a, g, t + i, y + i * y_stride, y_stride, rows,
                                        stream && i == 0);
}

template <int B, int kNibbles, int kRun>
void groups(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0, int64_t g1, float* y,
            size_t y_stride) {
  thread_local std::vector<__m256i> unpacked;  // grown once, then reused: no allocation on the hot path
  const bool super = w.super_acts;
  const bool prepare = (kNibbles || super) && nt >= kUnpackTokens;
  if (prepare) {
    const size_t bytes = super ? static_cast<size_t>(w.blocks() / (kFastSuperBlock / B)) * SuperPrepared<B>::kStride
                               : static_cast<size_t>(w.blocks()) * B * kFastRows;
    const size_t need = bytes / sizeof(__m256i);
    if (unpacked.size() < need) unpacked.resize(need);
  }
  auto* buffer = reinterpret_cast<uint8_t*>(unpacked.data());
  for (int64_t c0 = 0; c0 < nt; c0 += kChunkTokens) {
    const int64_t cn = std::min(kChunkTokens, nt - c0);
    for (int64_t g = g0; g < g1; ++g) {
      const int rows = static_cast<int>(std::min<int64_t>(kFastRows, w.rows - g * kFastRows));
      float* yg = y + c0 * y_stride + g * kFastRows;
      if constexpr (kRun > 0) {
        if (super && prepare) {
          prepare_super_group<B, kNibbles>(w, g, buffer);
          tokens<B, kByteCodes, kRun, TileActs::kSuperPrepared>(w, buffer, 0, a, g, t0 + c0, cn, yg, y_stride, rows,
                                                                false);
          continue;
        }
        if (super) {
          tokens<B, kNibbles, kRun, TileActs::kSuperStream>(w, w.block_at(g, 0), w.block_bytes, a, g, t0 + c0, cn, yg,
                                                            y_stride, rows, true);
          continue;
        }
      }
      if (kNibbles && prepare) {
        unpack_group<B, kNibbles>(w, g, buffer);
        tokens<B, kByteCodes, kRun, TileActs::kBlockActs>(w, buffer, B * kFastRows, a, g, t0 + c0, cn, yg, y_stride,
                                                          rows, false);
      } else {
        tokens<B, kNibbles, kRun, TileActs::kBlockActs>(w, w.block_at(g, 0), w.block_bytes, a, g, t0 + c0, cn, yg,
                                                        y_stride, rows, true);
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
    if (w.nibbles && w.top_bits == 0 && run == 8) return groups<32, kNibbleCodes, 8>(w, a, t0, nt, g0, g1, y, y_stride);
    if (w.top_bits == 1 && run == 4) return groups<32, kFiveBitCodes, 4>(w, a, t0, nt, g0, g1, y, y_stride);
    if (!w.nibbles && run == 4) return groups<32, kByteCodes, 4>(w, a, t0, nt, g0, g1, y, y_stride);
    if (!w.nibbles && run == 0) return groups<32, kByteCodes, 0>(w, a, t0, nt, g0, g1, y, y_stride);
  } else {
    if (w.top_bits == 2 && run == 2) return groups<16, kSixBitCodes, 2>(w, a, t0, nt, g0, g1, y, y_stride);
    if (w.nibbles && w.top_bits == 0 && run == 4) return groups<16, kNibbleCodes, 4>(w, a, t0, nt, g0, g1, y, y_stride);
    if (!w.nibbles && run == 2) return groups<16, kByteCodes, 2>(w, a, t0, nt, g0, g1, y, y_stride);
  }
  // A format of other codes: one vector a run (exact for codes below 128),
  // nibbles and 5- or 6-bit codes unpacked to bytes first.
  if (run == 0) return groups<32, kByteCodes, 0>(w, a, t0, nt, g0, g1, y, y_stride);
  assert(!w.nibbles && "every format with nibbles has its own case above");
  if (w.block == 32) return groups<32, kByteCodes, 1>(w, a, t0, nt, g0, g1, y, y_stride);
  return groups<16, kByteCodes, 1>(w, a, t0, nt, g0, g1, y, y_stride);
}

// The quantizer (FastQuantizeFn), a block per step: the scalar reference's
// float steps (the maximum of |x| and integer sums are exact in any order).
void fast_quantize_avx2_impl(const float* x, int64_t n_blocks, int8_t* q, float* d_out, float* dsum32, float* dsum16,
                             int32_t* bsum16) {
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
    bsum16[2 * b] = s0, bsum16[2 * b + 1] = s1;
  }
}

}  // namespace

FastGroupsFn fast_groups_avx2() { return fast_groups_avx2_impl; }
FastQuantizeFn fast_quantize_avx2() { return fast_quantize_avx2_impl; }

}  // namespace inferd::kernels
