#include "kernels/cpu/attention_quant.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "kernels/cpu/attention_quant_impl.h"
#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels {

namespace detail {
namespace {

// The portable level: one element at a time, each block's dot product summed
// in element order, then scaled by the block's d (1 for BF16 and F8_E4M3).
struct ScalarLevel {
  // Block b's 32 quants as floats (the integers, before d).
  template <DType kType>
  static float load_block(const uint8_t* row, int64_t b, float* x) {
    if constexpr (kType == DType::Q8_0) {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
      for (int i = 0; i < kQK; ++i) x[i] = static_cast<float>(blk->qs[i]);
      return f16_to_f32(blk->d);
    } else if constexpr (kType == DType::BF16) {
      const auto* e = reinterpret_cast<const uint16_t*>(row) + b * kQK;
      for (int i = 0; i < kQK; ++i) {
        const uint32_t bits = uint32_t{e[i]} << 16;
        std::memcpy(&x[i], &bits, 4);
      }
      return 1.0f;
    } else if constexpr (kType == DType::F8_E4M3) {
      const float* values = fp8_e4m3_values();
      for (int i = 0; i < kQK; ++i) x[i] = values[row[b * kQK + i]];
      return 1.0f;  // per-tensor scale 1 (fp8.h)
    } else {
      const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
      for (int i = 0; i < kQK / 2; ++i) {
        x[i] = static_cast<float>((blk->qs[i] & 0x0F) - 8);
        x[i + kQK / 2] = static_cast<float>((blk->qs[i] >> 4) - 8);
      }
      return f16_to_f32(blk->d);
    }
  }

  template <DType kType, int64_t kHeads>
  static void scores(const float* q, int64_t D, const uint8_t* row, float scale, float* w, int64_t stride) {
    float acc[kHeads] = {};
    float x[kQK];
    for (int64_t b = 0; b < D / kQK; ++b) {
      const float d = load_block<kType>(row, b, x);
      for (int64_t h = 0; h < kHeads; ++h) {
        const float* qb = q + h * D + b * kQK;
        float dot = 0.0f;
        for (int i = 0; i < kQK; ++i) dot += qb[i] * x[i];
        acc[h] += d * dot;
      }
    }
    for (int64_t h = 0; h < kHeads; ++h) w[h * stride] = acc[h] * scale;
  }

  static float softmax(float* w, int64_t n, const float* sink) {
    float max = sink ? *sink : -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i) max = std::max(max, w[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += w[i] = expf_poly(w[i] - max);
    if (sink) sum += expf_poly(*sink - max);
    return 1.0f / sum;
  }

  // Straight into out, position by position.
  template <DType kType, int64_t kHeads>
  static void values(const float* w, int64_t stride, int64_t D, const uint8_t* const* rows, int64_t n_rows,
                     float* out) {
    float x[kQK];
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t b = 0; b < D / kQK; ++b) {
        const float d = load_block<kType>(rows[r], b, x);
        for (int64_t h = 0; h < kHeads; ++h) {
          const float c = w[h * stride + r] * d;
          float* o = out + h * D + b * kQK;
          for (int i = 0; i < kQK; ++i) o[i] += c * x[i];
        }
      }
  }

  static void scale(float* out, int64_t D, float f) {
    for (int64_t i = 0; i < D; ++i) out[i] *= f;
  }
};

}  // namespace

void attend_heads_quant_scalar(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                               int64_t pos_begin, int64_t pos_end, float scale, AttentionPass, float* out,
                               const float* sinks) {
  attend_heads_quant_by_dtype<ScalarLevel>(q, n_heads, kv, head_offset, D, pos_begin, pos_end, scale, out, sinks);
}

void attend_latent_heads_quant_scalar(const float* q, int64_t n_heads, const PagedKV& kv, int64_t Dk, int64_t Dv,
                                      int64_t pos_begin, int64_t pos_end, float scale, AttentionPass, float* out) {
  attend_latent_quant_by_dtype<ScalarLevel>(q, n_heads, kv, Dk, Dv, pos_begin, pos_end, scale, out);
}

}  // namespace detail

void fill_attention_quant_kernels(FloatKernels& ops, SimdLevel level) {
  ops.attend_heads_quant = level >= SimdLevel::kAvx512 ? detail::attend_heads_quant_avx512
                           : level == SimdLevel::kAvx2 ? detail::attend_heads_quant_avx2
                                                       : detail::attend_heads_quant_scalar;
  ops.attend_latent_quant = level >= SimdLevel::kAvx512 ? detail::attend_latent_heads_quant_avx512
                            : level == SimdLevel::kAvx2 ? detail::attend_latent_heads_quant_avx2
                                                        : detail::attend_latent_heads_quant_scalar;
}

}  // namespace inferd::kernels
