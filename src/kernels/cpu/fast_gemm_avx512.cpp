// The fast tier's product with AVX-512 VNNI, and with AMX tiles (fast_gemm.h).
// A group's 16 rows are the 16 lanes of every vector: dpbusd (or a TDPBSUD,
// whose C tile holds a token's 16 rows in a row) leaves a block's exact int32
// sums per row, and the float steps of fast_layout.h run one row per lane.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/lanes_avx512.h"
#include "kernels/cpu/quants_blocks.h"
#include "kernels/cpu/weight_prefetch_x86.h"

namespace inferd::kernels {
namespace {

using detail::dpbusd_broadcast;
using detail::dpwssd_broadcast;

struct Block {
  const uint8_t* quants;
  __m512 scale, min;
};

inline __m512 load16(const FastWeightsView& w, const uint8_t* at) {
  return w.half_scales ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)))
                       : _mm512_loadu_ps(reinterpret_cast<const float*>(at));
}

inline __m512 codes16(const uint8_t* at) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at))));
}

inline __m512 halves16(const uint8_t* at) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at))); }

// Where a block's scales and mins lie (fast_layout.h), found once per group
// pass, not per block: in a kernel this large GCC calls the view's accessors
// instead of inlining them.
struct BlockOffsets {
  size_t scales, mins;
  explicit BlockOffsets(const FastWeightsView& w) : scales(w.quant_bytes()), mins(w.min_offset()) {}
};

// A block's codes, and its 16 scales and mins (fast_layout.h).
inline Block block_of(const FastWeightsView& w, const BlockOffsets& at, int64_t g, int64_t b) {
  const uint8_t* blk = w.block_at(g, b);
  if (w.sub_scales) {
    // The file's codes times their super-block's factors: the float products the repacking would have stored.
    const uint8_t* super = w.super_at(g, b);
    const __m512 scale = _mm512_mul_ps(halves16(super), codes16(blk + at.scales));
    return {blk, scale,
            w.min_factor != 0.0f ? _mm512_mul_ps(scale, _mm512_set1_ps(w.min_factor))
                                 : _mm512_mul_ps(halves16(super + 2 * kFastRows), codes16(blk + at.mins))};
  }
  const __m512 scale = load16(w, blk + at.scales);
  return {blk, scale,
          w.min_factor != 0.0f ? _mm512_mul_ps(scale, _mm512_set1_ps(w.min_factor)) : load16(w, blk + at.mins)};
}

// How a block's codes lie (fast_layout.h): bytes, nibbles, or nibbles and a
// plane of their top two bits (6-bit codes) or top bit (5-bit codes).
constexpr int kByteCodes = 0, kNibbleCodes = 1, kSixBitCodes = 2, kFiveBitCodes = 3;
template <int kNibbles>
constexpr int kTopBits = kNibbles == kSixBitCodes ? 2 : kNibbles == kFiveBitCodes ? 1 : 0;

// Code vector i of a block (fast_layout.h), and for 4-, 5- and 6-bit codes
// vector i + B/8 (the same load's high nibbles), unpacked: 5- and 6-bit
// codes' top bits or-ed in at bit 4 (and 5) (a 16-bit shift: whatever
// crosses between bytes lands outside the mask).
template <int B, int kNibbles>
inline void code_vectors(const uint8_t* quants, int i, __m512i* lo, __m512i* hi) {
  if constexpr (kNibbles == kByteCodes) {
    *lo = _mm512_loadu_si512(quants + 64 * i);
  } else {
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512i p = _mm512_loadu_si512(quants + 64 * i);
    *lo = _mm512_and_si512(p, low);
    *hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
    if constexpr (kTopBits<kNibbles> > 0) {
      constexpr int kPerPlane = 8 / kTopBits<kNibbles>;  // code vectors whose top bits share a plane vector
      // codes | (plane's bits of vector c, moved to bit 4, & mask): one ternary-logic op.
      const auto with_top = [&](__m512i codes, int c) __attribute__((always_inline)) {
        const __m512i plane = _mm512_loadu_si512(quants + 8 * B + 64 * (c / kPerPlane));
        const int at = kTopBits<kNibbles> * (c % kPerPlane);
        const __m512i shifted =
            at < 4 ? _mm512_slli_epi16(plane, 4 - at) : at > 4 ? _mm512_srli_epi16(plane, at - 4) : plane;
        return _mm512_ternarylogic_epi32(codes, shifted, _mm512_set1_epi8(kTopBits<kNibbles> == 2 ? 0x30 : 0x10),
                                         0xF8);
      };
      *lo = with_top(*lo, i);
      *hi = with_top(*hi, i + B / 8);
    }
  }
}

// The block's B/4 vectors of codes.
template <int B, int kNibbles>
inline void load_codes(const uint8_t* quants, __m512i* v) {
  if constexpr (kNibbles != kByteCodes) {
    for (int i = 0; i < B / 8; ++i) code_vectors<B, kNibbles>(quants, i, &v[i], &v[i + B / 8]);
  } else {
    for (int i = 0; i < B / 4; ++i) code_vectors<B, kNibbles>(quants, i, &v[i], nullptr);
  }
}

// The quants' integer sum over block b (B columns) of token t.
template <int B>
inline int32_t block_sum(const FastActsView& a, int64_t t, int64_t b) {
  const int32_t* bsum = a.bsum16 + t * (a.cols / 16) + b * B / 16;
  return B == 32 ? bsum[0] + bsum[1] : bsum[0];
}

// The float steps of block b for token t, from its 16 rows' int32 sums; mf:
// the format's min factor (0 where mins are stored), folded into the sums.
template <int B>
inline __m512 fold(__m512 acc, __m512i isum, const Block& blk, const FastActsView& a, int64_t t, int64_t b,
                   int32_t mf) {
  const int64_t nb32 = a.cols / 32;
  const float d = a.d[t * nb32 + b * B / 32];
  if (mf != 0) isum = _mm512_add_epi32(isum, _mm512_set1_epi32(mf * block_sum<B>(a, t, b)));
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(blk.scale, _mm512_set1_ps(d)), acc);
  if (mf != 0) return acc;
  const float dsum = B == 32 ? a.dsum32[t * nb32 + b] : a.dsum16[t * 2 * nb32 + b];
  return _mm512_fmadd_ps(blk.min, _mm512_set1_ps(dsum), acc);
}

inline void store_rows(float* y, __m512 v, int rows) {
  if (rows == kFastRows) {
    _mm512_storeu_ps(y, v);
  } else {
    _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << rows) - 1), v);
  }
}

// A tile of NT tokens' activations as the VNNI kernel reads them, block by
// block: per code vector i the NT tokens' 4 bytes of it, then the NT tokens'
// d, then their dsum (dsum32, or dsum16 for 16-column blocks) or, for a
// format whose min is the scale times mf, the int32 mf times the block's sum
// of quants, which starts the token's integer sum. Every operand
// of a block is then an offset from one pointer: with each token's rows
// apart, the tokens' pointers outnumber the general registers.
template <int B, int NT>
constexpr size_t kTileActsBlockBytes = static_cast<size_t>(B + 8) * NT;

// Eight rows' 32 bytes (8 words of 4) turned: out's 32 bytes i are word i
// of each row, row by row (an 8 x 8 transpose of 32-bit words).
inline void transpose_words8(const int8_t* const* rows, uint8_t* out) {
  __m256i r[8];
  for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[j]));
  __m256i t[8], u[8];
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_epi32(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_epi32(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
    u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
    u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
    u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * i), _mm256_permute2x128_si256(u[i], u[i + 4], 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * (i + 4)),
                        _mm256_permute2x128_si256(u[i], u[i + 4], 0x31));
  }
}

template <int B, int NT>
void pack_tile_acts(const FastActsView& a, int64_t t, int32_t mf, uint8_t* out) {
  const int64_t nb32 = a.cols / 32, blocks = a.cols / B;
  for (int64_t b = 0; b < blocks; ++b, out += kTileActsBlockBytes<B, NT>) {
    if constexpr (B == 32 && NT == 8) {
      const int8_t* rows[8];
      for (int j = 0; j < 8; ++j) rows[j] = a.q + (t + j) * a.cols + b * B;
      transpose_words8(rows, out);
    }
    for (int j = 0; j < NT; ++j) {
      const int8_t* q = a.q + (t + j) * a.cols + b * B;
      if constexpr (!(B == 32 && NT == 8))
        for (int i = 0; i < B / 4; ++i) std::memcpy(out + 4 * (i * NT + j), q + 4 * i, 4);
      const float d = a.d[(t + j) * nb32 + b * B / 32];
      std::memcpy(out + B * NT + 4 * j, &d, 4);
      if (mf != 0) {
        const int32_t folded = mf * block_sum<B>(a, t + j, b);
        std::memcpy(out + B * NT + 4 * (NT + j), &folded, 4);
      } else {
        const float dsum = B == 32 ? a.dsum32[(t + j) * nb32 + b] : a.dsum16[(t + j) * 2 * nb32 + b];
        std::memcpy(out + B * NT + 4 * (NT + j), &dsum, 4);
      }
    }
  }
}

// A zeroed vector by the xor idiom, which the renamer breaks without an
// execution port (GCC would copy a kept zero register: a vector uop on the
// ports the products use).
inline __m512i zero_idiom() {
  __m512i z;
  asm("vpxord %0, %0, %0" : "=v"(z));
  return z;
}

// Independent dpbusd chains per token: a tile of few tokens (decode) would
// otherwise wait on dpbusd's latency at every step of its one chain.
template <int NT>
constexpr int kChains = NT >= 4 ? 1 : NT >= 2 ? 2 : 4;

// The chains' sums into chain 0 (integers: the same sums in any order).
template <int NT>
inline void sum_chains(__m512i* chains) {
#pragma GCC unroll 4
  for (int c = 1; c < kChains<NT>; ++c)
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) chains[j] = _mm512_add_epi32(chains[j], chains[c * NT + j]);
}

// NT tokens (their tile of activations, pack_tile_acts) against group g, with
// VNNI. The tokens' sums of a block are NT chains of dpbusd, interleaved code
// vector by code vector: one token's chain alone would wait on dpbusd's
// latency at every step. (Integer sums: any order gives the same int32.) A
// token's 4 activation bytes are dpbusd's embedded broadcast from memory.
// kFolded: the format's min is the scale times an integer, and each token's
// first chain starts from mf times its block sum (the tile's int32): one
// float step a block, where a stored min takes two.
template <int B, int kNibbles, int NT, bool kFolded>
inline __attribute__((always_inline)) void vnni_tokens(const FastWeightsView& w, const uint8_t* acts, int64_t g,
                                                       float* y, size_t y_stride, int rows, bool stream) {
  // (Every loop over tokens or vectors unrolled before GCC places the
  // arrays: else it keeps them in memory, stored at every step.)
  const BlockOffsets at(w);
  __m512 acc[NT];
#pragma GCC unroll 8
  for (int j = 0; j < NT; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < w.blocks(); ++b, acts += kTileActsBlockBytes<B, NT>) {
    if (stream) prefetch_weights_ahead(w.block_at(g, b), w.block_bytes, NT == 1, kFastWeightPrefetchLead);
    const Block blk = block_of(w, at, g, b);
    __m512i codes[B / 4];
    load_codes<B, kNibbles>(blk.quants, codes);
    __m512i isum[kChains<NT> * NT];  // chain c of token j at c NT + j
    const int32_t* folded = reinterpret_cast<const int32_t*>(acts + B * NT + 4 * NT);
#pragma GCC unroll 16
    for (int k = 0; k < kChains<NT> * NT; ++k) isum[k] = kFolded && k < NT ? _mm512_set1_epi32(folded[k]) : zero_idiom();
    const int8_t* qb = reinterpret_cast<const int8_t*>(acts);
#pragma GCC unroll 8
    for (int i = 0; i < B / 4; ++i) {
      const int c = i % kChains<NT>;
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) isum[c * NT + j] = dpbusd_broadcast(isum[c * NT + j], codes[i], qb + 4 * (i * NT + j));
    }
    sum_chains<NT>(isum);
    const float* d = reinterpret_cast<const float*>(acts + B * NT);
    // The float steps of fast_layout.h, in its order.
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(blk.scale, _mm512_set1_ps(d[j])), acc[j]);
      if constexpr (!kFolded) acc[j] = _mm512_fmadd_ps(blk.min, _mm512_set1_ps(d[NT + j]), acc[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NT; ++j) store_rows(y + j * y_stride, acc[j], rows);
}

// ---- The super-block form (fast_layout.h, super_acts: K-quants) ----------
// A super-block's 256 columns in integers: per block the tokens' dpbusd sums
// times the block's scale codes (vpmulld), the offsets' sums against the Q8_K
// block sums in int16 pairs (vpdpwssd), and the float steps once per super-
// block instead of per block. The sums are the scalar reference's int32, so
// the bits are its own (and AVX2's).

// Blocks of a super-block, in pairs for the offsets (B = 32: 4 pairs, 16: 8).
template <int B>
constexpr int kOffsetPairs = kFastSuperBlock / B / 2;

// A tile's Q8_K activations per super-block: its 64 code vectors' 4 bytes of
// each of the NT tokens (vector c, token j at 4 (c NT + j)), the tokens' d,
// then per pair of blocks p the tokens' two block sums as an int16 pair.
template <int B, int NT>
constexpr size_t kSuperTileBytes = static_cast<size_t>(kFastSuperBlock + 4 + 4 * kOffsetPairs<B>) * NT;

template <int B, int NT>
void pack_super_tile(const FastActsView& a, int64_t t, uint8_t* out) {
  const int64_t supers = a.cols / kFastSuperBlock;
  for (int64_t sb = 0; sb < supers; ++sb, out += kSuperTileBytes<B, NT>) {
    if constexpr (NT == 8) {  // the quants by 8 code vectors (32 columns) at a time
      for (int k = 0; k < kFastSuperBlock / 32; ++k) {
        const int8_t* rows[8];
        for (int j = 0; j < 8; ++j)
          rows[j] = reinterpret_cast<const BlockQ8_K*>(a.super + (t + j) * a.super_row_bytes +
                                                       sb * static_cast<int64_t>(sizeof(BlockQ8_K)))->qs + 32 * k;
        transpose_words8(rows, out + 32 * NT * k);
      }
    }
    for (int j = 0; j < NT; ++j) {
      const auto& y = *reinterpret_cast<const BlockQ8_K*>(a.super + (t + j) * a.super_row_bytes +
                                                          sb * static_cast<int64_t>(sizeof(BlockQ8_K)));
      if constexpr (NT != 8)
        for (int c = 0; c < kFastSuperBlock / 4; ++c) std::memcpy(out + 4 * (c * NT + j), y.qs + 4 * c, 4);
      std::memcpy(out + kFastSuperBlock * NT + 4 * j, &y.d, 4);
      for (int p = 0; p < kOffsetPairs<B>; ++p) {
        // Blocks of 32: the sums of Q8_K's 16-column sums by twos (|sum| <= 32 * 127).
        const int16_t pair[2] = {
            static_cast<int16_t>(B == 32 ? y.bsums[4 * p] + y.bsums[4 * p + 1] : y.bsums[2 * p]),
            static_cast<int16_t>(B == 32 ? y.bsums[4 * p + 2] + y.bsums[4 * p + 3] : y.bsums[2 * p + 1])};
        std::memcpy(out + (kFastSuperBlock + 4) * NT + 4 * (p * NT + j), pair, 4);
      }
    }
  }
}

// A pair of blocks' offset codes (the stored min codes, or the scale codes
// where the min is mf times the scale) as int16 pairs, one 32-bit lane a row.
inline __m512i offset_pairs16(const uint8_t* lo16, const uint8_t* hi16) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo16));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi16));
  return _mm512_cvtepi8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi)));
}

// NT tokens (their tile, pack_super_tile) against group g in the super-block form.
template <int B, int kNibbles, int NT>
inline __attribute__((always_inline)) void vnni_super_tokens(const FastWeightsView& w, const uint8_t* acts, int64_t g,
                                                             float* y, size_t y_stride, int rows, bool stream) {
  constexpr int V = B / 4, kPerSuper = kFastSuperBlock / B;
  const bool mins = w.min_factor == 0.0f;
  const BlockOffsets at(w);
  const size_t offset_at = mins ? at.mins : at.scales;
  __m512 acc[NT];
#pragma GCC unroll 8
  for (int j = 0; j < NT; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < w.blocks() / kPerSuper; ++sb, acts += kSuperTileBytes<B, NT>) {
    const int8_t* q = reinterpret_cast<const int8_t*>(acts);
    const uint8_t* first = w.block_at(g, sb * kPerSuper);
    __m512i isum[NT];
    for (int jb = 0; jb < kPerSuper; ++jb) {
      const uint8_t* blk = first + jb * w.block_bytes;
      if (stream) prefetch_weights_ahead(blk, w.block_bytes, NT == 1, kFastWeightPrefetchLead);
      constexpr int kC = kChains<NT>;
      __m512i part[kC * NT];  // chain c of token j at c NT + j
#pragma GCC unroll 16
      for (int k = 0; k < kC * NT; ++k) part[k] = zero_idiom();
      const int8_t* qb = q + 4 * jb * V * NT;
#pragma GCC unroll 8
      for (int i = 0; i < (kNibbles == kByteCodes ? V : V / 2); ++i) {
        __m512i lo, hi;
        code_vectors<B, kNibbles>(blk, i, &lo, &hi);
        const int c_lo = (kNibbles == kByteCodes ? i : 2 * i) % kC, c_hi = (2 * i + 1) % kC;
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j)
          part[c_lo * NT + j] = dpbusd_broadcast(part[c_lo * NT + j], lo, qb + 4 * (i * NT + j));
        if constexpr (kNibbles != kByteCodes) {
#pragma GCC unroll 8
          for (int j = 0; j < NT; ++j)
            part[c_hi * NT + j] = dpbusd_broadcast(part[c_hi * NT + j], hi, qb + 4 * ((i + V / 2) * NT + j));
        }
      }
      sum_chains<NT>(part);
      const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + at.scales)));
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) {
        const __m512i scaled = _mm512_mullo_epi32(part[j], sc);
        isum[j] = jb == 0 ? scaled : _mm512_add_epi32(isum[j], scaled);
      }
    }
    // The offsets' codes times the quants' sums.
    const uint8_t* sums = acts + (kFastSuperBlock + 4) * NT;
    __m512i msum[NT];
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) msum[j] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int p = 0; p < kOffsetPairs<B>; ++p) {
      const __m512i o =
          offset_pairs16(first + 2 * p * w.block_bytes + offset_at, first + (2 * p + 1) * w.block_bytes + offset_at);
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j)
        msum[j] = dpwssd_broadcast(msum[j], o, reinterpret_cast<const int16_t*>(sums + 4 * (p * NT + j)));
    }
    const float* d = reinterpret_cast<const float*>(acts + kFastSuperBlock * NT);
    const uint8_t* factors = w.super_at(g, sb * kPerSuper);
    const __m512 dw = halves16(factors);
    if (mins) {
      const __m512 dminw = halves16(factors + 2 * kFastRows);
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) {
        const __m512 dj = _mm512_set1_ps(d[j]);
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_mul_ps(dw, dj), acc[j]);
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum[j]), _mm512_mul_ps(dminw, dj), acc[j]);
      }
    } else {
      const __m512i mf = _mm512_set1_epi32(static_cast<int32_t>(w.min_factor));
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) {
        const __m512i whole = _mm512_add_epi32(isum[j], _mm512_mullo_epi32(msum[j], mf));
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(whole), _mm512_mul_ps(dw, _mm512_set1_ps(d[j])), acc[j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NT; ++j) store_rows(y + j * y_stride, acc[j], rows);
}

constexpr int kVnniTokens = 8;
// Tokens whose activation rows stay in cache while every group passes over
// them (32 rows of a 4096-column input: 128 KiB).
constexpr int64_t kChunkTokens = 16;

// A tile's activations and its kernel, in the per-32 form (kFolded: the
// format's min folded into the integer sums) or the super-block form.
template <int B, int kNibbles, bool kSuper, bool kFolded = false>
struct VnniForm {
  template <int NT>
  static constexpr size_t tile_bytes(int64_t cols) {
    return kSuper ? kSuperTileBytes<B, NT> * static_cast<size_t>(cols / kFastSuperBlock)
                  : kTileActsBlockBytes<B, NT> * static_cast<size_t>(cols / B);
  }
  template <int NT>
  static void pack(const FastWeightsView& w, const FastActsView& a, int64_t t, uint8_t* out) {
    if constexpr (kSuper) pack_super_tile<B, NT>(a, t, out);
    else pack_tile_acts<B, NT>(a, t, kFolded ? static_cast<int32_t>(w.min_factor) : 0, out);
  }
  // `stream`: the first pass over the group's weights, which prefetches them
  // ahead (weight_prefetch_x86.h: decode reads them once, from memory).
  template <int NT>
  static void run(const FastWeightsView& w, const uint8_t* acts, int64_t g, float* y, size_t y_stride, int rows,
                  bool stream) {
    if constexpr (kSuper) vnni_super_tokens<B, kNibbles, NT>(w, acts, g, y, y_stride, rows, stream);
    else vnni_tokens<B, kNibbles, NT, kFolded>(w, acts, g, y, y_stride, rows, stream);
  }
};

// Tokens [t0, t0 + nt) (nt <= kChunkTokens) against groups [g0, g1): the
// tiles' activations packed first, then group by group every tile, so that
// a group's weights are read from memory once per chunk.
template <class Form>
void vnni_chunk(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0, int64_t g1,
                float* y, size_t y_stride) {
  const size_t tile_bytes = Form::template tile_bytes<kVnniTokens>(a.cols);
  const int64_t full = nt / kVnniTokens;
  const int tail = static_cast<int>(nt % kVnniTokens);
  thread_local std::vector<uint8_t> packed;
  packed.resize(tile_bytes * static_cast<size_t>(full + (tail > 0)));
  for (int64_t k = 0; k < full; ++k)
    Form::template pack<kVnniTokens>(w, a, t0 + k * kVnniTokens, packed.data() + k * tile_bytes);
  uint8_t* tail_acts = packed.data() + full * tile_bytes;
  const int64_t t_tail = t0 + full * kVnniTokens;
  switch (tail) {
#define INFERD_FAST_TAIL(n) \
  case n: Form::template pack<n>(w, a, t_tail, tail_acts); break;
    INFERD_FAST_TAIL(1) INFERD_FAST_TAIL(2) INFERD_FAST_TAIL(3) INFERD_FAST_TAIL(4)
    INFERD_FAST_TAIL(5) INFERD_FAST_TAIL(6) INFERD_FAST_TAIL(7)
#undef INFERD_FAST_TAIL
    default: break;
  }
  for (int64_t g = g0; g < g1; ++g) {
    const int rows = static_cast<int>(std::min<int64_t>(kFastRows, w.rows - g * kFastRows));
    float* yg = y + g * kFastRows;
    for (int64_t k = 0; k < full; ++k)
      Form::template run<kVnniTokens>(w, packed.data() + k * tile_bytes, g, yg + k * kVnniTokens * y_stride, y_stride,
                                      rows, k == 0);
    float* y_tail = yg + full * kVnniTokens * y_stride;
    switch (tail) {
#define INFERD_FAST_TAIL(n) \
  case n: Form::template run<n>(w, tail_acts, g, y_tail, y_stride, rows, full == 0); break;
      INFERD_FAST_TAIL(1) INFERD_FAST_TAIL(2) INFERD_FAST_TAIL(3) INFERD_FAST_TAIL(4)
      INFERD_FAST_TAIL(5) INFERD_FAST_TAIL(6) INFERD_FAST_TAIL(7)
#undef INFERD_FAST_TAIL
      default: break;
    }
  }
}

template <int B, int kNibbles, bool kSuper, bool kFolded>
void vnni_form_groups(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0, int64_t g1,
                      float* y, size_t y_stride) {
  for (int64_t i = 0; i < nt; i += kChunkTokens)
    vnni_chunk<VnniForm<B, kNibbles, kSuper, kFolded>>(w, a, t0 + i, std::min(kChunkTokens, nt - i), g0, g1,
                                                       y + i * y_stride, y_stride);
}

// The per-32 form's kernels fold a min given as a factor (min_factor) into the integer sums.
template <int B, int kNibbles, bool kSuper = false>
void vnni_groups(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0, int64_t g1,
                 float* y, size_t y_stride) {
  if constexpr (kSuper) {
    vnni_form_groups<B, kNibbles, true, false>(w, a, t0, nt, g0, g1, y, y_stride);
  } else {
    (w.min_factor != 0.0f ? vnni_form_groups<B, kNibbles, false, true>
                          : vnni_form_groups<B, kNibbles, false, false>)(w, a, t0, nt, g0, g1, y, y_stride);
  }
}

void fast_groups_vnni(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0, int64_t g1,
                      float* y, size_t y_stride) {
  if (w.super_acts) {
    if (w.block == 32) {
      (w.top_bits == 1 ? vnni_groups<32, kFiveBitCodes, true>
       : w.nibbles     ? vnni_groups<32, kNibbleCodes, true>
                       : vnni_groups<32, kByteCodes, true>)(w, a, t0, nt, g0, g1, y, y_stride);
    } else {
      (w.top_bits == 2 ? vnni_groups<16, kSixBitCodes, true>
       : w.nibbles ? vnni_groups<16, kNibbleCodes, true>
                   : vnni_groups<16, kByteCodes, true>)(w, a, t0, nt, g0, g1, y, y_stride);
    }
    return;
  }
  if (w.block == 32) {
    (w.top_bits == 1 ? vnni_groups<32, kFiveBitCodes>
     : w.nibbles     ? vnni_groups<32, kNibbleCodes>
                     : vnni_groups<32, kByteCodes>)(w, a, t0, nt, g0, g1, y, y_stride);
  } else {
    (w.top_bits == 2 ? vnni_groups<16, kSixBitCodes>
     : w.nibbles ? vnni_groups<16, kNibbleCodes>
                 : vnni_groups<16, kByteCodes>)(w, a, t0, nt, g0, g1, y, y_stride);
  }
}

// ---- AMX ------------------------------------------------------------------
// Tiles: 0 a block's int32 sums (tokens x 16 rows), 1 the tokens' activation
// bytes of the block (tokens x B), 2 the block's codes (B/4 x 64 bytes).
constexpr int kAmxTokens = 16;
// Fewer tokens than this go to VNNI, whose bits are the same: a tile op's
// fixed cost pays only over enough tokens.
constexpr int kAmxMinTokens = 8;

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// GCC's tile intrinsics do not tell the compiler which memory they read or
// write: keep stores and loads around them in place.
inline void memory_barrier() { asm volatile("" ::: "memory"); }

void configure_tiles(int nt, int block) {
  TileConfig cfg;
  cfg.rows[0] = static_cast<uint8_t>(nt), cfg.colsb[0] = 64;
  cfg.rows[1] = static_cast<uint8_t>(nt), cfg.colsb[1] = static_cast<uint16_t>(block);
  cfg.rows[2] = static_cast<uint8_t>(block / 4), cfg.colsb[2] = 64;
  memory_barrier();
  _tile_loadconfig(&cfg);
}

template <int B, int kNibbles>
void amx_tokens(const FastWeightsView& w, const FastActsView& a, int64_t g, int64_t t, int nt, float* y,
                size_t y_stride, int rows) {
  alignas(64) int32_t sums[kAmxTokens][kFastRows];
  alignas(64) uint8_t codes[B / 4][64];
  __m512 acc[kAmxTokens];
  for (int j = 0; j < kAmxTokens; ++j) acc[j] = _mm512_setzero_ps();
  const BlockOffsets at(w);
  const auto mf = static_cast<int32_t>(w.min_factor);  // folded into the sums where not 0 (fast_layout.h)
  for (int64_t b = 0; b < w.blocks(); ++b) {
    const Block blk = block_of(w, at, g, b);
    const uint8_t* tile_b = blk.quants;
    if constexpr (kNibbles) {
      __m512i v[B / 4];
      load_codes<B, kNibbles>(blk.quants, v);
      for (int i = 0; i < B / 4; ++i) _mm512_store_si512(codes[i], v[i]);
      tile_b = codes[0];
    }
    memory_barrier();
    _tile_zero(0);
    _tile_loadd(1, a.q + t * a.cols + b * B, a.cols);
    _tile_loadd(2, tile_b, 64);
    _tile_dpbsud(0, 1, 2);
    _tile_stored(0, sums, 64);
    memory_barrier();
    for (int j = 0; j < nt; ++j) acc[j] = fold<B>(acc[j], _mm512_load_si512(sums[j]), blk, a, t + j, b, mf);
  }
  for (int j = 0; j < nt; ++j) store_rows(y + j * y_stride, acc[j], rows);
}

template <int B, int kNibbles>
void amx_groups(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0, int64_t g1,
                float* y, size_t y_stride) {
  int64_t i = 0;
  int configured = 0;
  for (; nt - i >= kAmxMinTokens; i += kAmxTokens) {
    const int n = static_cast<int>(std::min<int64_t>(kAmxTokens, nt - i));
    if (n != configured) configure_tiles(n, B), configured = n;
    for (int64_t g = g0; g < g1; ++g) {
      const int rows = static_cast<int>(std::min<int64_t>(kFastRows, w.rows - g * kFastRows));
      amx_tokens<B, kNibbles>(w, a, g, t0 + i, n, y + i * y_stride + g * kFastRows, y_stride, rows);
    }
  }
  if (configured) _tile_release();  // a thread holding tile state makes every context switch save 8 KiB more
  if (i < nt) vnni_groups<B, kNibbles>(w, a, t0 + i, nt - i, g0, g1, y + i * y_stride, y_stride);
}

void fast_groups_amx_impl(const FastWeightsView& w, const FastActsView& a, int64_t t0, int64_t nt, int64_t g0,
                          int64_t g1, float* y, size_t y_stride) {
  if (w.super_acts) return fast_groups_vnni(w, a, t0, nt, g0, g1, y, y_stride);
  if (w.block == 32) {
    (w.top_bits == 1 ? amx_groups<32, kFiveBitCodes>
     : w.nibbles     ? amx_groups<32, kNibbleCodes>
                     : amx_groups<32, kByteCodes>)(w, a, t0, nt, g0, g1, y, y_stride);
  } else {
    (w.top_bits == 2 ? amx_groups<16, kSixBitCodes>
     : w.nibbles ? amx_groups<16, kNibbleCodes>
                 : amx_groups<16, kByteCodes>)(w, a, t0, nt, g0, g1, y, y_stride);
  }
}

// One block's codes from its floats times id (the scalar reference's steps:
// the product rounded, then to the nearest integer by the shift trick), its
// int8 codes stored; the codes as int32 lanes in *lo and *hi.
inline void quantize_block(const float* x, __m512 id, int8_t* q, __m512i* lo, __m512i* hi) {
  const __m512 round = _mm512_set1_ps(12582912.0f);
  __m512 plo = _mm512_mul_ps(_mm512_loadu_ps(x), id), phi = _mm512_mul_ps(_mm512_loadu_ps(x + 16), id);
  // Opaque, so the compiler does not fuse the products into the adds (one
  // rounding where the reference has two: other bits near halves).
  asm("" : "+v"(plo), "+v"(phi));
  *lo = _mm512_cvtps_epi32(_mm512_sub_ps(_mm512_add_ps(plo, round), round));
  *hi = _mm512_cvtps_epi32(_mm512_sub_ps(_mm512_add_ps(phi, round), round));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(*lo));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(*hi));
}

// The quantizer (FastQuantizeFn): the same float steps as the scalar
// reference, sixteen blocks at a time, their maxima and code sums one block a
// lane (lanes_of_16's trees: a maximum, and an integer sum, are exact in any
// order), so d, 1 / d and the sums' products run once per 16 blocks.
void fast_quantize_vec(const float* x, int64_t n_blocks, int8_t* q, float* d_out, float* dsum32, float* dsum16,
                       int32_t* bsum16) {
  using detail::lanes_of_16;
  int64_t b = 0;
  for (; b + 16 <= n_blocks; b += 16, x += 16 * 32, q += 16 * 32) {
    const __m512 amax = lanes_of_16(
        [x](int k) {
          return _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * k)), _mm512_abs_ps(_mm512_loadu_ps(x + 32 * k + 16)));
        },
        detail::MaxLanes{});
    const __m512 d = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
    const __mmask16 positive = _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_GT_OQ);
    alignas(64) float ids[16];
    _mm512_store_ps(ids, _mm512_maskz_div_ps(positive, _mm512_set1_ps(1.0f), d));
    __m512i lo[16], hi[16];
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) quantize_block(x + 32 * k, _mm512_set1_ps(ids[k]), q + 32 * k, &lo[k], &hi[k]);
    const __m512i s0 = _mm512_castps_si512(
        lanes_of_16([&lo](int k) { return _mm512_castsi512_ps(lo[k]); }, detail::AddIntLanes{}));
    const __m512i s1 = _mm512_castps_si512(
        lanes_of_16([&hi](int k) { return _mm512_castsi512_ps(hi[k]); }, detail::AddIntLanes{}));
    _mm512_storeu_ps(d_out + b, d);
    _mm512_storeu_ps(dsum32 + b, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1))));
    // dsum16 is the two halves' products, interleaved block by block.
    const __m512 half0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(s0)), half1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(s1));
    const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
    _mm512_storeu_ps(dsum16 + 2 * b, _mm512_permutex2var_ps(half0, first, half1));
    _mm512_storeu_ps(dsum16 + 2 * b + 16, _mm512_permutex2var_ps(half0, second, half1));
    _mm512_storeu_si512(bsum16 + 2 * b, _mm512_permutex2var_epi32(s0, first, s1));
    _mm512_storeu_si512(bsum16 + 2 * b + 16, _mm512_permutex2var_epi32(s0, second, s1));
  }
  for (; b < n_blocks; ++b, x += 32, q += 32) {
    const float amax = _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x)), _mm512_abs_ps(_mm512_loadu_ps(x + 16))));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    __m512i lo, hi;
    quantize_block(x, _mm512_set1_ps(id), q, &lo, &hi);
    const int s0 = _mm512_reduce_add_epi32(lo), s1 = _mm512_reduce_add_epi32(hi);
    d_out[b] = d;
    dsum32[b] = d * static_cast<float>(s0 + s1);
    dsum16[2 * b] = d * static_cast<float>(s0);
    dsum16[2 * b + 1] = d * static_cast<float>(s1);
    bsum16[2 * b] = s0, bsum16[2 * b + 1] = s1;
  }
}

}  // namespace

FastQuantizeFn fast_quantize_avx512() { return fast_quantize_vec; }
FastGroupsFn fast_groups_avx512() { return fast_groups_vnni; }
FastGroupsFn fast_groups_amx() { return fast_groups_amx_impl; }

}  // namespace inferd::kernels
