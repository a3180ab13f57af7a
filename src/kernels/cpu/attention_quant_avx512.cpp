// The quantized-KV attention kernel with AVX-512 (attention_quant.h), a
// chunk of 16 positions at a time. Q8_0 and Q4_0 keys are dotted with the
// Q8_0 query in 8-bit integers (VPDPBUSD on the chunk's keys transposed, a
// lane per position); BF16 and F8_E4M3 keys (and heads that are not whole
// 64-element tiles) in f32, a block's 32 elements widened to two 16-lane
// vectors and each position's lanes summed with the chunk's others at the
// end. Values in f32: a block widened once per position and added into every
// head's sum with that head's weight times the block's scale.
// GCC 12 reports its own _mm512_undefined_* placeholders as maybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cstring>
#include <limits>

#include "kernels/cpu/attention_quant.h"
#include "kernels/cpu/attention_quant_impl.h"
#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/lanes_avx512.h"

namespace inferd::kernels::detail {
namespace {

struct Avx512Level {
  // Block b's quants as floats, elements 0-15 in lo and 16-31 in hi (before
  // the block's scale d: block_d).
  template <DType kType>
  [[gnu::always_inline]] static inline void load_block(const uint8_t* row, int64_t b, __m512& lo, __m512& hi) {
    if constexpr (kType == DType::Q8_0) {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
      lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs))));
      hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs + 16))));
    } else if constexpr (kType == DType::BF16) {
      // A bf16 is the top half of an f32: widen and shift.
      const auto* e = reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(row) + b * kQK);
      lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(e)), 16));
      hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(e + 1)), 16));
    } else if constexpr (kType == DType::F8_E4M3) {
      // Each code's value from the 256-entry table (fp8.h): exact, NaN included.
      const float* values = fp8_e4m3_values();
      const auto* e = reinterpret_cast<const __m128i*>(row + b * kQK);
      lo = _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(e)), values, 4);
      hi = _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(e + 1)), values, 4);
    } else {
      const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs));
      const __m128i mask = _mm_set1_epi8(0x0F);
      const __m512i eight = _mm512_set1_epi32(8);
      lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(bytes, mask)), eight));
      hi = _mm512_cvtepi32_ps(
          _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask)), eight));
    }
  }

  // Block b's f16 scale d (a Q8_0 and a Q4_0 block both begin with it).
  template <DType kType>
  [[gnu::always_inline]] static inline uint16_t block_d(const uint8_t* row, int64_t b) {
    uint16_t d;
    std::memcpy(&d, row + b * kQuantKVBlockBytes<kType>, sizeof d);
    return d;
  }

  // Row by row: each key block widened once, scaled by its d once, and
  // dotted with every head's query into that head's 16 lanes (blocks in
  // order); the chunk's rows' lanes are summed together at the end
  // (sum_lanes_of_16, lanes_avx512.h), not one horizontal reduction per row
  // and head.
  // Q8_0 and Q4_0 keys of whole 64-element tiles: in 8-bit integers
  // (scores_int8); others in f32, with kBlocks D / kQK when the compiler
  // should know it (the common heads, whose block loop it then unrolls), 0
  // for any other D.
  static constexpr bool kTakesChunks = true;
  template <DType kType, int64_t kHeads>
  static void scores_chunk(const QuantQuery& q, int64_t D, const QuantChunk& chunk, float scale, float* w,
                           int64_t stride) {
    if constexpr (kScaledBlocks<kType>) {
      if (D % 64 == 0 && D <= kInt8MaxD) return scores_int8<kType, kHeads>(q, D, chunk, scale, w, stride);
    }
    switch (D) {
      case 64: return scores_rows<kType, kHeads, 2>(q, D, chunk, scale, w, stride);
      case 128: return scores_rows<kType, kHeads, 4>(q, D, chunk, scale, w, stride);
      case 256: return scores_rows<kType, kHeads, 8>(q, D, chunk, scale, w, stride);
      default: return scores_rows<kType, kHeads, 0>(q, D, chunk, scale, w, stride);
    }
  }
  template <DType kType, int64_t kHeads, int64_t kBlocks>
  static void scores_rows(const QuantQuery& query, int64_t D, const QuantChunk& chunk, float scale, float* w,
                          int64_t stride) {
    const float* q = query.floats;
    const int64_t n_blocks = kBlocks > 0 ? kBlocks : D / kQK;
    const int64_t n_rows = chunk.n_rows;
    alignas(64) float lanes[kHeads][kQuantKVChunk][16];
    for (int64_t r = 0; r < kQuantKVChunk; ++r) {
      if (r >= n_rows) {  // the last chunk's missing rows: zeros, masked off below
        for (int64_t h = 0; h < kHeads; ++h) _mm512_store_ps(lanes[h][r], _mm512_setzero_ps());
        continue;
      }
      chunk.prefetch(r);
      const uint8_t* row = chunk.rows[r];
      __m512 acc[kHeads];
      for (int64_t b = 0; b < n_blocks; ++b) {
        __m512 lo, hi;
        load_block<kType>(row, b, lo, hi);
        if constexpr (kScaledBlocks<kType>) {
          const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(block_d<kType>(row, b))));
          lo = _mm512_mul_ps(lo, d);
          hi = _mm512_mul_ps(hi, d);
        }
        for (int64_t h = 0; h < kHeads; ++h) {
          const float* qb = q + h * D + b * kQK;
          acc[h] = b == 0 ? _mm512_mul_ps(lo, _mm512_loadu_ps(qb)) : _mm512_fmadd_ps(lo, _mm512_loadu_ps(qb), acc[h]);
          acc[h] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(qb + 16), acc[h]);
        }
      }
      for (int64_t h = 0; h < kHeads; ++h) _mm512_store_ps(lanes[h][r], acc[h]);
    }
    const __mmask16 m = first_lanes(n_rows);
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t h = 0; h < kHeads; ++h)
      _mm512_mask_storeu_ps(w + h * stride, m, _mm512_mul_ps(sum_lanes_of_16(lanes[h]), vs));
  }

  // The widest head scores_int8 takes (DeepSeek's latent + RoPE key is 576).
  static constexpr int64_t kInt8MaxD = 1024;

  // Row r's 64 elements from element 64 t on, as unsigned bytes k + kBias
  // (Q8_0: k + 128, by flipping the sign bit; Q4_0: the nibble itself, k + 8).
  template <DType kType>
  [[gnu::always_inline]] static inline __m512i load_tile_u8(const uint8_t* row, int64_t t) {
    if constexpr (kType == DType::Q8_0) {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + 2 * t;
      const __m512i x = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[0].qs))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[1].qs)), 1);
      return _mm512_xor_si512(x, _mm512_set1_epi8(static_cast<char>(0x80)));
    } else {
      // Byte j of a Q4_0 block holds element j (low nibble) and j + 16
      // (high): each block's 16 bytes twice, the second copy shifted down.
      const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + 2 * t;
      const __m512i x = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[0].qs)))),
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[1].qs))), 1);
      const __m512i shifts = _mm512_setr_epi64(0, 0, 0x0004000400040004, 0x0004000400040004, 0, 0,
                                               0x0004000400040004, 0x0004000400040004);
      return _mm512_and_si512(_mm512_srlv_epi16(x, shifts), _mm512_set1_epi8(0x0F));
    }
  }

  // 16 rows of 16 dwords (x[r]) to 16 vectors of one dword (a group of four
  // elements) from each row: out[g] lane r = x[r] dword g.
  [[gnu::always_inline]] static inline void transpose_16x16(const __m512i* x, __m512i* out) {
    __m512i a[16], b[16];
    for (int i = 0; i < 8; ++i) {
      a[2 * i] = _mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]);
      a[2 * i + 1] = _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
    }
    // b[4 i + j], 128-bit lane L: dword 4 L + j of rows 4 i .. 4 i + 3.
    for (int i = 0; i < 4; ++i) {
      b[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
      b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
      b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
      b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    // The 128-bit lanes transposed among b[j], b[4 + j], b[8 + j], b[12 + j].
    for (int j = 0; j < 4; ++j) {
      const __m512i c0 = _mm512_shuffle_i32x4(b[j], b[4 + j], _MM_SHUFFLE(1, 0, 1, 0));
      const __m512i c1 = _mm512_shuffle_i32x4(b[j], b[4 + j], _MM_SHUFFLE(3, 2, 3, 2));
      const __m512i c2 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], _MM_SHUFFLE(1, 0, 1, 0));
      const __m512i c3 = _mm512_shuffle_i32x4(b[8 + j], b[12 + j], _MM_SHUFFLE(3, 2, 3, 2));
      out[j] = _mm512_shuffle_i32x4(c0, c2, _MM_SHUFFLE(2, 0, 2, 0));
      out[4 + j] = _mm512_shuffle_i32x4(c0, c2, _MM_SHUFFLE(3, 1, 3, 1));
      out[8 + j] = _mm512_shuffle_i32x4(c1, c3, _MM_SHUFFLE(2, 0, 2, 0));
      out[12 + j] = _mm512_shuffle_i32x4(c1, c3, _MM_SHUFFLE(3, 1, 3, 1));
    }
  }

  // Scores of a chunk with the keys and the (Q8_0) query in 8-bit integers,
  // llama.cpp's arithmetic for these caches: per block, the exact integer
  // dot, less the unsigned keys' bias (kBias times the query block's sum),
  // times d_key * d_query; blocks added in order in f32, then the scale.
  // The chunk's keys are transposed first (a lane per row, a vector per four
  // elements), so each head's dot is one VPDPBUSD per four elements for 16
  // rows at once, its query's four bytes broadcast: no lanes to sum per row.
  // A row's score is the same wherever it sits in a chunk (its lane's
  // arithmetic is the same in every lane).
  template <DType kType, int64_t kHeads>
  static void scores_int8(const QuantQuery& q, int64_t D, const QuantChunk& chunk, float scale, float* w,
                          int64_t stride) {
    constexpr int32_t kBias = kType == DType::Q8_0 ? 128 : 8;
    const int64_t n_rows = chunk.n_rows, n_blocks = D / kQK;
    alignas(64) int32_t groups[kInt8MaxD / 4][16];  // [dword of the row][row]
    alignas(64) float key_scales[kInt8MaxD / kQK][16];
    for (int64_t t = 0; t < D / 64; ++t) {
      __m512i x[16];
      for (int64_t r = 0; r < kQuantKVChunk; ++r) {
        x[r] = r < n_rows ? load_tile_u8<kType>(chunk.rows[r], t) : _mm512_setzero_si512();
      }
      __m512i g[16];
      transpose_16x16(x, g);
      for (int j = 0; j < 16; ++j) _mm512_store_si512(groups[16 * t + j], g[j]);
    }
    for (int64_t b = 0; b < n_blocks; ++b) {
      alignas(32) uint16_t ds[kQuantKVChunk] = {};
      for (int64_t r = 0; r < n_rows; ++r) ds[r] = block_d<kType>(chunk.rows[r], b);
      _mm512_store_ps(key_scales[b], _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(ds))));
    }
    __m512 score[kHeads];
    for (int64_t h = 0; h < kHeads; ++h) score[h] = _mm512_setzero_ps();
    for (int64_t b = 0, r_ahead = 0; b < n_blocks; ++b) {
      // The chunk's prefetches spread over the blocks' arithmetic: all at
      // once (68 lines at a 256-wide head) would stall on misses in flight.
      for (const int64_t r_end = (b + 1) * kQuantKVChunk / n_blocks; r_ahead < r_end; ++r_ahead)
        chunk.prefetch(r_ahead);
      __m512i k[8];
      for (int j = 0; j < 8; ++j) k[j] = _mm512_load_si512(groups[8 * b + j]);
      const __m512 dk = _mm512_load_ps(key_scales[b]);
      // Every head unrolled, and each head's eight dot products in two
      // chains (integer sums: the order changes no bit), so the VPDPBUSDs'
      // latency overlaps.
#pragma GCC unroll 8
      for (int64_t h = 0; h < kHeads; ++h) {
        const BlockQ8_0& qb = q.blocks[h * n_blocks + b];
        __m512i acc[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          int32_t four;
          std::memcpy(&four, qb.qs + 4 * j, 4);
          acc[j % 2] = _mm512_dpbusd_epi32(acc[j % 2], k[j], _mm512_set1_epi32(four));
        }
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_add_epi32(acc[0], acc[1]),
                                                               _mm512_set1_epi32(kBias * q.sums[h * n_blocks + b])));
        const __m512 d = _mm512_mul_ps(dk, _mm512_set1_ps(_cvtsh_ss(qb.d)));
        score[h] = _mm512_fmadd_ps(dot, d, score[h]);  // from zero: block 0's product, rounded once
      }
    }
    const __mmask16 m = first_lanes(n_rows);
    const __m512 vs = _mm512_set1_ps(scale);
    for (int64_t h = 0; h < kHeads; ++h) _mm512_mask_storeu_ps(w + h * stride, m, _mm512_mul_ps(score[h], vs));
  }

  // Lanes by position from the first, the tail masked: the maximum and sum
  // depend on n alone.
  static float softmax(float* w, int64_t n, const float* sink) {
    __m512 vmax = _mm512_set1_ps(sink ? *sink : -std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = first_lanes(n - i);
      vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, w + i));
    }
    const float max = _mm512_reduce_max_ps(vmax);
    const __m512 vm = _mm512_set1_ps(max);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = first_lanes(n - i);
      const __m512 e = expf_poly16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, w + i), vm));
      _mm512_mask_storeu_ps(w + i, m, e);
      sum = _mm512_mask_add_ps(sum, m, sum, e);
    }
    float s = _mm512_reduce_add_ps(sum);
    if (sink) s += expf_poly(*sink - max);
    return 1.0f / s;
  }

  // Block by block, the chunk's positions summed in registers (two vectors
  // per head: at most 16 live) and added to out once: the chunk's rows stay
  // in L1 between blocks, and out is stored once per chunk, not per position
  // (this is the decode hot loop at long context). Each weight times its
  // row's d, w_p * d_b, is made 16 rows at a time beforehand, so the loop
  // over rows is only the widening and one FMA per head and vector, its
  // multiplier broadcast from memory.
  template <DType kType, int64_t kHeads>
  static void values_chunk(const float* w, int64_t stride, int64_t D, const QuantChunk& chunk, float* out) {
    switch (D) {
      case 64: return values_rows<kType, kHeads, 2>(w, stride, D, chunk, out);
      case 128: return values_rows<kType, kHeads, 4>(w, stride, D, chunk, out);
      case 256: return values_rows<kType, kHeads, 8>(w, stride, D, chunk, out);
      default: return values_rows<kType, kHeads, 0>(w, stride, D, chunk, out);
    }
  }
  template <DType kType, int64_t kHeads, int64_t kBlocks>
  static void values_rows(const float* w, int64_t stride, int64_t D, const QuantChunk& chunk, float* out) {
    const int64_t n_blocks = kBlocks > 0 ? kBlocks : D / kQK;
    const uint8_t* const* rows = chunk.rows;
    const int64_t n_rows = chunk.n_rows;
    const __mmask16 m = first_lanes(n_rows);
    for (int64_t b = 0; b < n_blocks; ++b) {
      alignas(64) float wd[kHeads][kQuantKVChunk];
      __m512 d = _mm512_set1_ps(1.0f);
      if constexpr (kScaledBlocks<kType>) {
        alignas(32) uint16_t ds[kQuantKVChunk] = {};
        for (int64_t r = 0; r < n_rows; ++r) ds[r] = block_d<kType>(rows[r], b);
        d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(ds)));
      }
      for (int64_t h = 0; h < kHeads; ++h)
        _mm512_store_ps(wd[h], _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + h * stride), d));
      __m512 acc_lo[kHeads], acc_hi[kHeads];
      for (int64_t h = 0; h < kHeads; ++h) acc_lo[h] = acc_hi[h] = _mm512_setzero_ps();
      for (int64_t r = 0; r < n_rows; ++r) {
        if (b == 0) chunk.prefetch(r);
        __m512 lo, hi;
        load_block<kType>(rows[r], b, lo, hi);
        for (int64_t h = 0; h < kHeads; ++h) {
          const __m512 c = _mm512_set1_ps(wd[h][r]);
          acc_lo[h] = _mm512_fmadd_ps(c, lo, acc_lo[h]);
          acc_hi[h] = _mm512_fmadd_ps(c, hi, acc_hi[h]);
        }
      }
      for (int64_t h = 0; h < kHeads; ++h) {
        float* o = out + h * D + b * kQK;
        _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), acc_lo[h]));
        _mm512_storeu_ps(o + 16, _mm512_add_ps(_mm512_loadu_ps(o + 16), acc_hi[h]));
      }
    }
  }

  static void scale(float* out, int64_t D, float f) {
    const __m512 v = _mm512_set1_ps(f);
    for (int64_t i = 0; i < D; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(out + i), v));
  }
};

}  // namespace

void attend_heads_quant_avx512(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                               int64_t pos_begin, int64_t pos_end, float scale, AttentionPass, float* out,
                               const float* sinks) {
  attend_heads_quant_by_dtype<Avx512Level>(q, n_heads, kv, head_offset, D, pos_begin, pos_end, scale, out, sinks);
}

void attend_latent_heads_quant_avx512(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                                      int64_t pos_begin, int64_t pos_end, float scale, AttentionPass, float* out) {
  attend_latent_quant_by_dtype<Avx512Level>(q, n_heads, kv, Dk, Dv, pos_begin, pos_end, scale, out);
}

}  // namespace inferd::kernels::detail
