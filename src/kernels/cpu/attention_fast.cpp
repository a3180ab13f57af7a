#include "kernels/cpu/attention_fast.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

#include "kernels/cpu/attention_fast_impl.h"
#include "kernels/cpu/expf_poly.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels {

namespace detail {

// The reference: attention_fast.h's arithmetic row by row, element by element
// (a prompt tile's integer products; a decode step's parts, the f32 ones).
void attend_heads_tile_fast_scalar(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv,
                                   int64_t head_offset, int64_t D, float scale, const float* sinks,
                                   const FastAttentionState* parts) {
  assert(!(parts && (sinks || tile.n_tokens != 1)) && "parts: one token, no sinks (they join with the parts)");
  constexpr int64_t C = kFastAttentionChunk;
  const bool ints = parts == nullptr;
  const int32_t KQ = fast_attention_key_max(D);
  std::vector<float> o(static_cast<size_t>(D)), x(static_cast<size_t>(D));
  std::vector<int32_t> qc(static_cast<size_t>(D)), kc(static_cast<size_t>(D));
  std::vector<int32_t> vc(static_cast<size_t>(kFastAttentionChunk * D));  // a chunk's value codes, row j at j D
  std::vector<int64_t> acc(static_cast<size_t>(D));
  // A row of n f32 values coded up to cmax: its codes and step.
  auto code_row = [](const float* v, int64_t n, int32_t cmax, int32_t* codes) {
    float amax = 0.0f;
    for (int64_t d = 0; d < n; ++d) amax = std::max(amax, std::fabs(v[d]));
    const float step = code_step(amax, cmax), id = code_inverse(step);
    for (int64_t d = 0; d < n; ++d) codes[d] = code_of(v[d], id, -cmax, cmax);
    return step;
  };
  for (int64_t i = 0; i < tile.n_tokens; ++i) {
    const int64_t b = tile.pos_begin[i], e = tile.pos_end[i];
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* q = tile.q + i * tile.q_stride + h * D;
      const float qf = ints ? code_row(q, D, KQ, qc.data()) * scale : 0.0f;
      float m = sinks ? sinks[h] : -INFINITY;
      float lanes[8] = {sinks ? 1.0f : 0.0f, 0, 0, 0, 0, 0, 0, 0};
      std::fill(o.begin(), o.end(), 0.0f);
      int64_t part = 0;
      // Part `part`'s state (head h's row) out, and the next part's from the start.
      auto flush = [&] {
        const int64_t r = part++ * n_heads + h;
        parts->m[r] = m;
        std::copy(lanes, lanes + 8, parts->lanes + 8 * r);
        std::copy(o.begin(), o.end(), parts->o + r * D);
        m = -INFINITY;
        std::fill(lanes, lanes + 8, 0.0f);
        std::fill(o.begin(), o.end(), 0.0f);
      };
      // Position pos's key (which = k) or value as f32 in x.
      auto row = [&](const uint16_t* base, int64_t pos) {
        const uint16_t* r = base + kv.f16_slot(pos) + head_offset;
        for (int64_t d = 0; d < D; ++d) x[d] = f16_to_f32(r[d]);
      };
      for (int64_t c0 = b / C * C; c0 < e; c0 += C) {
        if (parts && c0 > b / C * C && c0 % kFastDecodeSplit == 0) flush();
        float s[C], p[C];
        float max_s = -INFINITY;
        for (int64_t j = 0; j < C; ++j) {
          const int64_t pos = c0 + j;
          if (pos < b || pos >= e) continue;
          row(kv.k_f16(), pos);
          if (ints) {
            const float ks = code_row(x.data(), D, KQ, kc.data());
            int64_t dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += int64_t{qc[d]} * kc[d];
            s[j] = static_cast<float>(static_cast<int32_t>(dot)) * (ks * qf);
          } else {
            float a = 0.0f;
            for (int64_t d = 0; d < D; ++d) a = std::fma(q[d], x[d], a);
            s[j] = a * scale;
          }
          max_s = std::max(max_s, s[j]);
        }
        const float m_new = std::max(m, max_s);
        const float alpha = m == -INFINITY ? 0.0f : expf_poly(m - m_new);
        for (int64_t j = 0; j < C; ++j) {
          const int64_t pos = c0 + j;
          p[j] = pos < b || pos >= e ? 0.0f : expf_poly(std::max(s[j] - m_new, kFastAttentionExpFloor));
        }
        for (int l = 0; l < 8; ++l) lanes[l] = std::fma(lanes[l], alpha, (p[l] + p[l + 8]) + (p[l + 16] + p[l + 24]));
        if (ints) {
          // The weights times their values' steps, coded over the chunk; the
          // integer sums of the codes' products, then one fma each.
          float w[C] = {};
          int32_t pc[C];
          std::fill(acc.begin(), acc.end(), 0);
          std::fill(vc.begin(), vc.end(), 0);  // positions the row does not read: zero codes
          for (int64_t j = 0; j < C; ++j) {
            const int64_t pos = c0 + j;
            if (pos < b || pos >= e) continue;
            row(kv.v_f16(), pos);
            w[j] = p[j] * code_row(x.data(), D, kFastAttentionValueMax, vc.data() + j * D);
          }
          float wmax = 0.0f;
          for (int64_t j = 0; j < C; ++j) wmax = std::max(wmax, w[j]);
          const float ps = code_step(wmax, kFastAttentionWeightMax), pid = code_inverse(ps);
          for (int64_t j = 0; j < C; ++j) pc[j] = code_of(w[j], pid, 0, kFastAttentionWeightMax);
          for (int64_t j = 0; j < C; ++j)
            for (int64_t d = 0; d < D; ++d) acc[d] += int64_t{pc[j]} * vc[j * D + d];
          for (int64_t d = 0; d < D; ++d)
            o[d] = std::fma(static_cast<float>(static_cast<int32_t>(acc[d])), ps, o[d] * alpha);
        } else {
          for (int64_t d = 0; d < D; ++d) o[d] *= alpha;
          for (int64_t j = 0; j < C; ++j) {
            const int64_t pos = c0 + j;
            if (pos < b || pos >= e) continue;
            row(kv.v_f16(), pos);
            for (int64_t d = 0; d < D; ++d) o[d] = std::fma(p[j], x[d], o[d]);
          }
        }
        m = m_new;
      }
      if (parts) {
        flush();
        continue;
      }
      const float inv = 1.0f / lane_sum(lanes);
      float* out = tile.out + i * tile.out_stride + h * D;
      for (int64_t d = 0; d < D; ++d) out[d] = o[d] * inv;
    }
  }
}

void join_fast_attention_states_scalar(const FastAttentionState& parts, int64_t n_parts, int64_t n_heads, int64_t D,
                                       const float* sinks, float* out) {
  join_states(
      parts, n_parts, n_heads, D, sinks, out,
      [D](float w, const float* part_o, float* o) {
        for (int64_t d = 0; d < D; ++d) o[d] = std::fma(w, part_o[d], o[d]);
      },
      [D](float inv, float* o) {
        for (int64_t d = 0; d < D; ++d) o[d] *= inv;
      });
}

}  // namespace detail

void fill_fast_attention_kernels(FloatKernels& ops, SimdLevel level) {
  const bool avx2 = level >= SimdLevel::kAvx2;
  ops.attend_tile_fast = level >= SimdLevel::kAvx512 ? detail::attend_heads_tile_fast_avx512
                         : avx2                        ? detail::attend_heads_tile_fast_avx2
                                                       : detail::attend_heads_tile_fast_scalar;
  ops.join_fast_states = avx2 ? detail::join_fast_attention_states_avx2 : detail::join_fast_attention_states_scalar;
}

void attend_heads_tile_fast(const AttentionTile& tile, int64_t n_heads, const PagedKV& kv, int64_t head_offset,
                            int64_t D, float scale, const float* sinks) {
  assert(fast_attention_reads(kv.dtype, D));
  kernel_table().ops.attend_tile_fast(tile, n_heads, kv, head_offset, D, scale, sinks, nullptr);
}

void attend_heads_fast_parts(const float* q, int64_t n_heads, const PagedKV& kv, int64_t head_offset, int64_t D,
                             int64_t pos_begin, int64_t pos_end, float scale, const FastAttentionState& parts) {
  assert(fast_attention_reads(kv.dtype, D));
  const AttentionTile tile{q, n_heads * D, nullptr, 0, 1, &pos_begin, &pos_end};
  kernel_table().ops.attend_tile_fast(tile, n_heads, kv, head_offset, D, scale, nullptr, &parts);
}

void join_fast_attention_states(const FastAttentionState& parts, int64_t n_parts, int64_t n_heads, int64_t D,
                                const float* sinks, float* out) {
  kernel_table().ops.join_fast_states(parts, n_parts, n_heads, D, sinks, out);
}

}  // namespace inferd::kernels
