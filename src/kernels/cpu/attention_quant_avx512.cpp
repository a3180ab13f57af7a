// The quantized-KV attention kernel with AVX-512 (attention_quant.h): a
// block's 32 quants widened to two 16-lane float vectors in registers, its
// scale applied once per block to the 16-lane partial products.
#include <immintrin.h>

#include <limits>

#include "kernels/cpu/attention_quant.h"
#include "kernels/cpu/attention_quant_impl.h"
#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/fp8.h"

namespace inferd::kernels::detail {
namespace {

struct Avx512Level {
  // Block b's quants as floats, elements 0-15 in lo and 16-31 in hi; returns d.
  template <DType kType>
  [[gnu::always_inline]] static inline float load_block(const uint8_t* row, int64_t b, __m512& lo, __m512& hi) {
    if constexpr (kType == DType::Q8_0) {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
      lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs))));
      hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs + 16))));
      return _cvtsh_ss(blk->d);
    } else if constexpr (kType == DType::BF16) {
      // A bf16 is the top half of an f32: widen and shift.
      const auto* e = reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(row) + b * kQK);
      lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(e)), 16));
      hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(e + 1)), 16));
      return 1.0f;
    } else if constexpr (kType == DType::F8_E4M3) {
      // Each code's value from the 256-entry table (fp8.h): exact, NaN included.
      const float* values = fp8_e4m3_values();
      const auto* e = reinterpret_cast<const __m128i*>(row + b * kQK);
      lo = _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(e)), values, 4);
      hi = _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(e + 1)), values, 4);
      return 1.0f;
    } else {
      const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs));
      const __m128i mask = _mm_set1_epi8(0x0F);
      const __m512i eight = _mm512_set1_epi32(8);
      lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(bytes, mask)), eight));
      hi = _mm512_cvtepi32_ps(
          _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask)), eight));
      return _cvtsh_ss(blk->d);
    }
  }

  template <DType kType, int64_t kHeads>
  static void scores(const float* q, int64_t D, const uint8_t* row, float scale, float* w, int64_t stride) {
    __m512 acc[kHeads];
    for (int64_t h = 0; h < kHeads; ++h) acc[h] = _mm512_setzero_ps();
    for (int64_t b = 0; b < D / kQK; ++b) {
      __m512 lo, hi;
      const __m512 d = _mm512_set1_ps(load_block<kType>(row, b, lo, hi));
      for (int64_t h = 0; h < kHeads; ++h) {
        const float* qb = q + h * D + b * kQK;
        const __m512 dot = _mm512_fmadd_ps(_mm512_loadu_ps(qb + 16), hi, _mm512_mul_ps(_mm512_loadu_ps(qb), lo));
        acc[h] = _mm512_fmadd_ps(d, dot, acc[h]);
      }
    }
    for (int64_t h = 0; h < kHeads; ++h) w[h * stride] = _mm512_reduce_add_ps(acc[h]) * scale;
  }

  // Lanes by position from the first, the tail masked: the maximum and sum
  // depend on n alone.
  static float softmax(float* w, int64_t n, const float* sink) {
    __m512 vmax = _mm512_set1_ps(sink ? *sink : -std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
      vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, w + i));
    }
    const float max = _mm512_reduce_max_ps(vmax);
    const __m512 vm = _mm512_set1_ps(max);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
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
  // (this is the decode hot loop at long context).
  template <DType kType, int64_t kHeads>
  static void values(const float* w, int64_t stride, int64_t D, const uint8_t* const* rows, int64_t n_rows,
                     float* out) {
    for (int64_t b = 0; b < D / kQK; ++b) {
      __m512 acc_lo[kHeads], acc_hi[kHeads];
      for (int64_t h = 0; h < kHeads; ++h) acc_lo[h] = acc_hi[h] = _mm512_setzero_ps();
      for (int64_t r = 0; r < n_rows; ++r) {
        __m512 lo, hi;
        const float d = load_block<kType>(rows[r], b, lo, hi);
        for (int64_t h = 0; h < kHeads; ++h) {
          const __m512 c = _mm512_set1_ps(w[h * stride + r] * d);
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
