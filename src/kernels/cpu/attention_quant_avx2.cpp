// The quantized-KV attention kernel with AVX2, FMA and F16C
// (attention_quant.h): a block's 32 quants widened to four 8-lane float
// vectors in registers, its scale applied once per block to the 8-lane
// partial products.
#include <immintrin.h>

#include <limits>

#include "kernels/cpu/attention_quant.h"
#include "kernels/cpu/attention_quant_impl.h"
#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/lanes_avx2.h"

namespace inferd::kernels::detail {
namespace {

// Lanes [0, n) of eight set (n < 8).
inline __m256i tail_mask8(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

struct Avx2Level {
  // Block b's quants as floats, elements 8j to 8j+7 in x[j]; returns d.
  template <DType kType>
  [[gnu::always_inline]] static inline float load_block(const uint8_t* row, int64_t b, __m256 x[4]) {
    if constexpr (kType == DType::Q8_0) {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
      for (int j = 0; j < 4; ++j)
        x[j] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk->qs + 8 * j))));
      return _cvtsh_ss(blk->d);
    } else if constexpr (kType == DType::BF16) {
      // A bf16 is the top half of an f32: widen and shift.
      const auto* e = reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row) + b * kQK);
      for (int j = 0; j < 4; ++j)
        x[j] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(e + j)), 16));
      return 1.0f;
    } else if constexpr (kType == DType::F8_E4M3) {
      // Each code's value from the 256-entry table (fp8.h): exact, NaN included.
      const float* values = fp8_e4m3_values();
      for (int j = 0; j < 4; ++j)
        x[j] = _mm256_i32gather_ps(values,
                                   _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                       reinterpret_cast<const __m128i*>(row + b * kQK + 8 * j))),
                                   4);
      return 1.0f;
    } else {
      const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs));
      const __m128i mask = _mm_set1_epi8(0x0F);
      const __m128i lo = _mm_and_si128(bytes, mask), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
      const __m256i eight = _mm256_set1_epi32(8);
      auto widen = [&](__m128i v) { return _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(v), eight)); };
      x[0] = widen(lo);
      x[1] = widen(_mm_srli_si128(lo, 8));
      x[2] = widen(hi);
      x[3] = widen(_mm_srli_si128(hi, 8));
      return _cvtsh_ss(blk->d);
    }
  }

  template <DType kType, int64_t kHeads>
  static void scores(const float* q, int64_t D, const uint8_t* row, float scale, float* w, int64_t stride) {
    __m256 acc[kHeads];
    for (int64_t h = 0; h < kHeads; ++h) acc[h] = _mm256_setzero_ps();
    for (int64_t b = 0; b < D / kQK; ++b) {
      __m256 x[4];
      const __m256 d = _mm256_set1_ps(load_block<kType>(row, b, x));
      for (int64_t h = 0; h < kHeads; ++h) {
        const float* qb = q + h * D + b * kQK;
        __m256 dot = _mm256_mul_ps(_mm256_loadu_ps(qb), x[0]);
        for (int j = 1; j < 4; ++j) dot = _mm256_fmadd_ps(_mm256_loadu_ps(qb + 8 * j), x[j], dot);
        acc[h] = _mm256_fmadd_ps(d, dot, acc[h]);
      }
    }
    for (int64_t h = 0; h < kHeads; ++h) w[h * stride] = hsum8(acc[h]) * scale;
  }

  static float softmax(float* w, int64_t n, const float* sink) {
    const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    __m256 vmax = sink ? _mm256_set1_ps(*sink) : ninf;
    for (int64_t i = 0; i < n; i += 8) {
      const __m256 x = n - i >= 8 ? _mm256_loadu_ps(w + i)
                                  : _mm256_blendv_ps(ninf, _mm256_maskload_ps(w + i, tail_mask8(n - i)),
                                                     _mm256_castsi256_ps(tail_mask8(n - i)));
      vmax = _mm256_max_ps(vmax, x);
    }
    const float max = hmax8(vmax);
    const __m256 vm = _mm256_set1_ps(max);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
      if (n - i >= 8) {
        const __m256 e = expf_poly_x8(_mm256_sub_ps(_mm256_loadu_ps(w + i), vm));
        _mm256_storeu_ps(w + i, e);
        sum = _mm256_add_ps(sum, e);
      } else {
        const __m256i m = tail_mask8(n - i);
        const __m256 e = _mm256_and_ps(expf_poly_x8(_mm256_sub_ps(_mm256_maskload_ps(w + i, m), vm)),
                                       _mm256_castsi256_ps(m));
        _mm256_maskstore_ps(w + i, m, e);
        sum = _mm256_add_ps(sum, e);
      }
    }
    float s = hsum8(sum);
    if (sink) s += expf_poly(*sink - max);
    return 1.0f / s;
  }

  // Straight into out, position by position.
  template <DType kType, int64_t kHeads>
  static void values(const float* w, int64_t stride, int64_t D, const uint8_t* const* rows, int64_t n_rows,
                     float* out) {
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t b = 0; b < D / kQK; ++b) {
        __m256 x[4];
        const float d = load_block<kType>(rows[r], b, x);
        for (int64_t h = 0; h < kHeads; ++h) {
          const __m256 c = _mm256_set1_ps(w[h * stride + r] * d);
          float* o = out + h * D + b * kQK;
          for (int j = 0; j < 4; ++j)
            _mm256_storeu_ps(o + 8 * j, _mm256_fmadd_ps(c, x[j], _mm256_loadu_ps(o + 8 * j)));
        }
      }
  }

  static void scale(float* out, int64_t D, float f) {
    const __m256 v = _mm256_set1_ps(f);
    for (int64_t i = 0; i < D; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(out + i), v));
  }
};

}  // namespace

void attend_heads_quant_avx2(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                             int64_t pos_begin, int64_t pos_end, float scale, AttentionPass, float* out,
                             const float* sinks) {
  attend_heads_quant_by_dtype<Avx2Level>(q, n_heads, kv, head_offset, D, pos_begin, pos_end, scale, out, sinks);
}

void attend_latent_heads_quant_avx2(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                                    int64_t pos_begin, int64_t pos_end, float scale, AttentionPass, float* out) {
  attend_latent_quant_by_dtype<Avx2Level>(q, n_heads, kv, Dk, Dv, pos_begin, pos_end, scale, out);
}

}  // namespace inferd::kernels::detail
