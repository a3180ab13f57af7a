// x86 kernels for packed (row-interleaved) weights, shared by quants_avx2.cpp
// and quants_avx512.cpp like quants_x86_impl.h (included after it, inside the
// same anonymous namespace). The arithmetic per (row, token) is exactly
// packed_ref.cpp's; see packed_layout.h for the layout.
//
// AVX-512: one zmm lane per row of the group. Per block and token, a dpbusd
// per 64 bytes of quants adds four products into each of the 16 rows (the
// activation's four bytes broadcast from memory), then one FMA applies the
// block's scales. Weights are unpacked once per block for every token of the
// tile. AVX2 runs the same thing on the group's two halves of 8 rows, with
// maddubs+madd in place of dpbusd.

#ifndef INFERD_X86_AVX512
#error "define INFERD_X86_AVX512 before including packed_x86_impl.h"
#endif

struct PackedAct {
  const int8_t* qs;
  const float* d;
  const float* s;
  const int32_t* sum;
};

inline PackedAct packed_act(const uint8_t* base, int64_t cols) {
  const int64_t nb = cols / 32;
  PackedAct a;
  a.qs = reinterpret_cast<const int8_t*>(base);
  a.d = reinterpret_cast<const float*>(base + cols);
  a.s = a.d + nb;
  a.sum = reinterpret_cast<const int32_t*>(a.s + nb);
  return a;
}

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

template <DType kType>
struct PackedFormat {
  static constexpr bool kQ4 = kType != DType::Q8_0;
  static constexpr bool kHasMin = kType == DType::Q4_1;
  static constexpr size_t kBlockBytes = kType == DType::Q4_0   ? kPackedQ4_0BlockBytes
                                        : kType == DType::Q4_1 ? kPackedQ4_1BlockBytes
                                                               : kPackedQ8_0BlockBytes;
  static constexpr size_t kQuantOffset = kHasMin ? 64 : 32;
};

// Q4_1 and Q8_0 in GGML's lane order (packed_ref.cpp), rows 8h..8h+7: one
// float accumulator per lane j = elements 4j..4j+3 of each block, summed at the
// end like hsum_float_8. Plain AVX2, so the AVX-512 level runs it too for Q8_0
// (Q4_0 of rows % 8 != 0 has a kernel of its own below, in the same order).
template <DType kType, int NT>
void packed_half_lanes_avx2(const uint8_t* group, int h, int64_t cols, const uint8_t* act, size_t as, float* out,
                            size_t os) {
  static_assert(kType == DType::Q4_1 || kType == DType::Q8_0);
  using F = PackedFormat<kType>;
  const int64_t nb = cols / 32;
  PackedAct y[NT];
  __m256 acc[NT][8], accm[NT];
  for (int t = 0; t < NT; ++t) {
    y[t] = packed_act(act + t * as, cols);
    for (int j = 0; j < 8; ++j) acc[t][j] = _mm256_setzero_ps();
    accm[t] = _mm256_setzero_ps();
  }
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + b * F::kBlockBytes;
    const uint8_t* q = p + F::kQuantOffset + 32 * h;
    if (h == 0) prefetch_weights_ahead(p, F::kBlockBytes, NT == 1);  // the second half reads the same lines
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
    __m256 m = _mm256_setzero_ps();
    if constexpr (F::kHasMin) m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 16 * h)));
    __m256i w[8];
    if constexpr (F::kQ4) {
      for (int j = 0; j < 4; ++j) {
        const __m256i v = load256(q + 64 * j);
        w[j] = _mm256_and_si256(v, m4);
        w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      }
    } else {
      for (int j = 0; j < 8; ++j) w[j] = load256(q + 64 * j);  // signed
    }
    for (int t = 0; t < NT; ++t) {
      const int8_t* yq = y[t].qs + 32 * b;
      const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(y[t].d[b]));
      for (int j = 0; j < 8; ++j) {
        const __m256i yv = _mm256_set1_epi32(load_i32(yq + 4 * j));
        __m256i pairs;
        if constexpr (F::kQ4) {
          pairs = _mm256_maddubs_epi16(w[j], yv);
        } else {  // signed x signed: |w| times y carrying w's sign
          pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w[j], w[j]), _mm256_sign_epi8(yv, w[j]));
        }
        const __m256i isum = _mm256_madd_epi16(pairs, ones);
        acc[t][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[t][j]);
      }
      if constexpr (F::kHasMin) accm[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(y[t].s[b]), accm[t]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    const __m256* a = acc[t];
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                                     _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
    _mm256_storeu_ps(out + t * os + 8 * h, F::kHasMin ? _mm256_add_ps(sum, accm[t]) : sum);
  }
}

#if INFERD_X86_AVX512

template <DType kType, int NT>
void packed_tile_avx512(const uint8_t* group, int64_t cols, const uint8_t* act, size_t as, float* out, size_t os) {
  static_assert(kType != DType::Q4_1, "Q4_1 has its own kernel, in GGML's lane order");
  using F = PackedFormat<kType>;
  const int64_t nb = cols / 32;
  PackedAct y[NT];
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) {
    y[t] = packed_act(act + t * as, cols);
    acc[t] = _mm512_setzero_ps();
  }
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + b * F::kBlockBytes;
    const uint8_t* q = p + F::kQuantOffset;
    prefetch_weights_ahead(p, F::kBlockBytes, NT == 1);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    // w[j]: unsigned quants for activation quad j (Q4: j < 4 low nibbles, j >= 4 high).
    __m512i w[8];
    if constexpr (F::kQ4) {
      for (int j = 0; j < 4; ++j) {
        const __m512i v = _mm512_loadu_si512(q + 64 * j);
        w[j] = _mm512_and_si512(v, m4);
        w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      }
    } else {
      for (int j = 0; j < 8; ++j) w[j] = _mm512_xor_si512(_mm512_loadu_si512(q + 64 * j), flip);  // q + 128
    }
    for (int t = 0; t < NT; ++t) {
      const int8_t* yq = y[t].qs + 32 * b;
      // Unsigned-bias correction: Q4_0 stores q + 8, Q8_0 is read as q + 128.
      const int bias = kType == DType::Q4_0 ? 8 : 128;
      __m512i s0 = _mm512_set1_epi32(-bias * y[t].sum[b]);
      __m512i s1 = _mm512_setzero_si512();
      for (int j = 0; j < 8; j += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[j], _mm512_set1_epi32(load_i32(yq + 4 * j)));
        s1 = _mm512_dpbusd_epi32(s1, w[j + 1], _mm512_set1_epi32(load_i32(yq + 4 * j + 4)));
      }
      const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(y[t].d[b]));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), scale, acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(out + t * os, acc[t]);
}

// GGML's order of the Q4_1 product (packed_ref.cpp): one float accumulator per
// lane j = one dpbusd's four elements, summed at the end like hsum_float_8.
template <int NT>
void packed_tile_q4_1_avx512(const uint8_t* group, int64_t cols, const uint8_t* act, size_t as, float* out,
                             size_t os) {
  using F = PackedFormat<DType::Q4_1>;
  const int64_t nb = cols / 32;
  PackedAct y[NT];
  __m512 acc[NT][8], accm[NT];
  for (int t = 0; t < NT; ++t) {
    y[t] = packed_act(act + t * as, cols);
    for (int j = 0; j < 8; ++j) acc[t][j] = _mm512_setzero_ps();
    accm[t] = _mm512_setzero_ps();
  }
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + b * F::kBlockBytes;
    const uint8_t* q = p + F::kQuantOffset;
    prefetch_weights_ahead(p, F::kBlockBytes, NT == 1);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
    __m512i w[8];
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(q + 64 * j);
      w[j] = _mm512_and_si512(v, m4);
      w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    for (int t = 0; t < NT; ++t) {
      const int8_t* yq = y[t].qs + 32 * b;
      const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(y[t].d[b]));
      for (int j = 0; j < 8; ++j) {
        const __m512i isum =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[j], _mm512_set1_epi32(load_i32(yq + 4 * j)));
        acc[t][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[t][j]);
      }
      accm[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(y[t].s[b]), accm[t]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    const __m512* a = acc[t];
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                                     _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
    _mm512_storeu_ps(out + t * os, _mm512_add_ps(sum, accm[t]));
  }
}

template <DType kType>
void packed_tile(const uint8_t* group, int64_t cols, const uint8_t* act, size_t as, const int32_t* /*lane_bias*/,
                 int nt, float* out, size_t os) {
  if constexpr (kType == DType::Q4_1) {
    for (int t = 0; t < nt; t += 2) {
      if (nt - t == 1) {
        packed_tile_q4_1_avx512<1>(group, cols, act + t * as, as, out + t * os, os);
      } else {
        packed_tile_q4_1_avx512<2>(group, cols, act + t * as, as, out + t * os, os);
      }
    }
  } else if constexpr (kType == DType::Q8_0) {
    for (int t = 0; t < nt; ++t) {  // GGML's lane order, by the AVX2 kernel
      packed_half_lanes_avx2<kType, 1>(group, 0, cols, act + t * as, as, out + t * os, os);
      packed_half_lanes_avx2<kType, 1>(group, 1, cols, act + t * as, as, out + t * os, os);
    }
  } else {
    switch (nt) {
      case 8: packed_tile_avx512<kType, 8>(group, cols, act, as, out, os); break;
      case 7: packed_tile_avx512<kType, 7>(group, cols, act, as, out, os); break;
      case 6: packed_tile_avx512<kType, 6>(group, cols, act, as, out, os); break;
      case 5: packed_tile_avx512<kType, 5>(group, cols, act, as, out, os); break;
      case 4: packed_tile_avx512<kType, 4>(group, cols, act, as, out, os); break;
      case 3: packed_tile_avx512<kType, 3>(group, cols, act, as, out, os); break;
      case 2: packed_tile_avx512<kType, 2>(group, cols, act, as, out, os); break;
      default: packed_tile_avx512<kType, 1>(group, cols, act, as, out, os); break;
    }
  }
}

#else  // AVX2

// Rows 8h..8h+7 of the group: the same arithmetic on 8 lanes.
template <DType kType, int NT>
void packed_half_avx2(const uint8_t* group, int h, int64_t cols, const uint8_t* act, size_t as, float* out,
                      size_t os) {
  static_assert(kType == DType::Q4_0, "Q4_1 and Q8_0 have their own kernel, in GGML's lane order");
  using F = PackedFormat<kType>;
  const int64_t nb = cols / 32;
  PackedAct y[NT];
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) {
    y[t] = packed_act(act + t * as, cols);
    acc[t] = _mm256_setzero_ps();
  }
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + b * F::kBlockBytes;
    const uint8_t* q = p + F::kQuantOffset + 32 * h;
    if (h == 0) prefetch_weights_ahead(p, F::kBlockBytes, NT == 1);  // the second half reads the same lines
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
    __m256i w[8];
    if constexpr (F::kQ4) {
      for (int j = 0; j < 4; ++j) {
        const __m256i v = load256(q + 64 * j);
        w[j] = _mm256_and_si256(v, m4);
        w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      }
    } else {
      for (int j = 0; j < 8; ++j) w[j] = load256(q + 64 * j);  // signed
    }
    for (int t = 0; t < NT; ++t) {
      const int8_t* yq = y[t].qs + 32 * b;
      const int bias = kType == DType::Q4_0 ? 8 : 0;
      __m256i s0 = _mm256_set1_epi32(-bias * y[t].sum[b]);
      __m256i s1 = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        const __m256i yv = _mm256_set1_epi32(load_i32(yq + 4 * j));
        __m256i pairs;
        if constexpr (F::kQ4) {
          pairs = _mm256_maddubs_epi16(w[j], yv);  // at most 2 * 15 * 127: no saturation
        } else {  // signed x signed: |w| times y carrying w's sign
          pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w[j], w[j]), _mm256_sign_epi8(yv, w[j]));
        }
        if (j % 2 == 0) {
          s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(pairs, ones));
        } else {
          s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(pairs, ones));
        }
      }
      const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(y[t].d[b]));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), scale, acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm256_storeu_ps(out + t * os + 8 * h, acc[t]);
}

template <DType kType, int NT>
void packed_tile_avx2(const uint8_t* group, int64_t cols, const uint8_t* act, size_t as, float* out, size_t os) {
  if constexpr (kType == DType::Q4_1 || kType == DType::Q8_0) {
    for (int t = 0; t < NT; ++t) {  // one token at a time: eight accumulators per token fill the registers
      packed_half_lanes_avx2<kType, 1>(group, 0, cols, act + t * as, as, out + t * os, os);
      packed_half_lanes_avx2<kType, 1>(group, 1, cols, act + t * as, as, out + t * os, os);
    }
  } else {
    packed_half_avx2<kType, NT>(group, 0, cols, act, as, out, os);
    packed_half_avx2<kType, NT>(group, 1, cols, act, as, out, os);
  }
}

template <DType kType>
void packed_tile(const uint8_t* group, int64_t cols, const uint8_t* act, size_t as, const int32_t* /*lane_bias*/,
                 int nt, float* out, size_t os) {
  for (int t = 0; t < nt; t += 4) {
    const uint8_t* a = act + t * as;
    float* o = out + t * os;
    switch (nt - t) {
      case 1: packed_tile_avx2<kType, 1>(group, cols, a, as, o, os); break;
      case 2: packed_tile_avx2<kType, 2>(group, cols, a, as, o, os); break;
      case 3: packed_tile_avx2<kType, 3>(group, cols, a, as, o, os); break;
      default: packed_tile_avx2<kType, 4>(group, cols, a, as, o, os); break;
    }
  }
}

#endif

// Q4_0 of rows GGML does not repack, and Q5_0, in GGML's vec_dot lane order
// (packed_ref.cpp), rows 8h..8h+7 against one token: the quants go through
// maddubs unsigned, as u = q + kBias (at most 2 * 31 * 127 per pair: no
// saturation), and lane j's int32 sum gets bias[j] = -kBias * (the token's four
// quants of lane j) added, so each lane holds the reference's exact isum_j
// without moving signs. Eight accumulators per token fill the registers: a
// token at a time. A source type gives a block's u for lanes j and j + 4 (its
// scales are at 16h, f16, in every layout).
struct LanesQ4_0 {
  static constexpr size_t kBlockBytes = kPackedQ4_0BlockBytes;
  static constexpr int kBiasShift = 3;      // u = q + 8
  static constexpr bool kStreamed = true;  // read once, from memory: prefetched ahead
  static void lanes(const uint8_t* p, int h, int j, __m256i u[2]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i v = load256(p + 32 + 32 * h + 64 * j);
    u[0] = _mm256_and_si256(v, m4);
    u[1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
  }
};
// Q5_0: Q4_0's nibbles, and each row's high bits rearranged (packed_layout.h)
// so that one shift and one AND per lane put them at bit 4 of the lane's bytes.
struct LanesQ5_0 {
  static constexpr size_t kBlockBytes = kPackedQ5_0BlockBytes;
  static constexpr int kBiasShift = 4;  // u = q + 16
  static constexpr bool kStreamed = true;
  static void lanes(const uint8_t* p, int h, int j, __m256i u[2]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10);
    const __m256i v = load256(p + 96 + 32 * h + 64 * j);
    const __m256i qh = load256(p + 32 + 32 * h);
    u[0] = _mm256_or_si256(_mm256_and_si256(v, m4),
                           _mm256_and_si256(_mm256_sllv_epi32(qh, _mm256_set1_epi32(4 - j)), m10));
    u[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                           _mm256_and_si256(_mm256_srlv_epi32(qh, _mm256_set1_epi32(j)), m10));
  }
};
// Q5_0 blocks of one half expanded by packed_q5_0_tile: the 8 rows' d at 0,
// lane j's u (8 rows x 4 bytes) at 32 + 32j.
struct LanesExpanded {
  static constexpr size_t kBlockBytes = 32 + 256;
  static constexpr int kBiasShift = 4;
  static constexpr bool kStreamed = false;  // just written: in L1
  static void lanes(const uint8_t* p, int, int j, __m256i u[2]) {
    u[0] = load256(p + 32 + 32 * j);
    u[1] = load256(p + 32 + 32 * (j + 4));
  }
};

template <class Src>
void packed_lanes_half(const uint8_t* group, int h, int64_t cols, const PackedAct& y, const int32_t* bias,
                       float* out) {
  const int64_t nb = cols / 32;
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + b * Src::kBlockBytes;
    if (Src::kStreamed && h == 0) prefetch_weights_ahead(p, Src::kBlockBytes);  // the second half reads the same lines
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
    const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(y.d[b]));
    const int8_t* yq = y.qs + 32 * b;
    const int32_t* bj = bias + 8 * b;
    for (int j = 0; j < 4; ++j) {
      __m256i u[2];
      Src::lanes(p, h, j, u);
      for (int k = 0; k < 2; ++k) {  // lane j (low nibbles), lane j + 4 (high)
        const int lane = j + 4 * k;
        const __m256i pairs = _mm256_maddubs_epi16(u[k], _mm256_set1_epi32(load_i32(yq + 4 * lane)));
        const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(pairs, ones), _mm256_set1_epi32(bj[lane]));
        acc[lane] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[lane]);
      }
    }
  }
  const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6])),
                                   _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7])));
  _mm256_storeu_ps(out, sum);
}

// PackedLaneBiasFn: the lane biases of nt tokens (-(1 << kShift) times the
// sum of each four quants, eight per block), token t's at 8 * nb * t.
template <int kShift>
void packed_lane_biases(const uint8_t* act, size_t as, int nt, int64_t cols, int32_t* bias) {
  const int64_t nb = cols / 32;
  const __m256i ones8 = _mm256_set1_epi8(1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int t = 0; t < nt; ++t) {
    const PackedAct y = packed_act(act + t * as, cols);
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i quads = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, load256(y.qs + 32 * b)), ones16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bias + 8 * (nb * t + b)),
                          _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(quads, kShift)));
    }
  }
}

// PackedTileFn (lane biases by packed_lane_biases<Src::kBiasShift>): each
// token on both halves.
template <class Src>
void packed_lanes_tile(const uint8_t* group, int64_t cols, const uint8_t* act, size_t as, const int32_t* bias, int nt,
                       float* out, size_t os) {
  const int64_t nb = cols / 32;
  for (int t = 0; t < nt; ++t) {
    const PackedAct y = packed_act(act + t * as, cols);
    for (int h = 0; h < 2; ++h) packed_lanes_half<Src>(group, h, cols, y, bias + 8 * nb * t, out + t * os + 8 * h);
  }
}

// PackedTileFn for Q5_0: one token straight from the packed blocks; several
// from each half's blocks expanded once into u bytes (LanesExpanded), which
// then cost every token what Q8_0's do.
void packed_q5_0_tile(const uint8_t* group, int64_t cols, const uint8_t* act, size_t as, const int32_t* bias, int nt,
                      float* out, size_t os) {
  if (nt == 1) {
    packed_lanes_tile<LanesQ5_0>(group, cols, act, as, bias, nt, out, os);
    return;
  }
  const int64_t nb = cols / 32;
  thread_local std::vector<Vec256> expanded;
  constexpr size_t kVecs = LanesExpanded::kBlockBytes / 32;
  if (expanded.size() < kVecs * nb) expanded.resize(kVecs * nb);
  uint8_t* e = reinterpret_cast<uint8_t*>(expanded.data());
  for (int h = 0; h < 2; ++h) {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* p = group + b * LanesQ5_0::kBlockBytes;
      uint8_t* eb = e + b * LanesExpanded::kBlockBytes;
      if (h == 0) prefetch_weights_ahead(p, LanesQ5_0::kBlockBytes, false);  // nt > 1 here
      std::memcpy(eb, p + 16 * h, 16);
      for (int j = 0; j < 4; ++j) {
        __m256i u[2];
        LanesQ5_0::lanes(p, h, j, u);
        _mm256_store_si256(reinterpret_cast<__m256i*>(eb + 32 + 32 * j), u[0]);
        _mm256_store_si256(reinterpret_cast<__m256i*>(eb + 32 + 32 * (j + 4)), u[1]);
      }
    }
    for (int t = 0; t < nt; ++t) {
      packed_lanes_half<LanesExpanded>(e, 0, cols, packed_act(act + t * as, cols), bias + 8 * nb * t,
                                       out + t * os + 8 * h);
    }
  }
}

#if INFERD_X86_AVX512

// The same vec_dot lane order as packed_lanes_half, on all 16 rows of a group
// at once: lane j's sixteen rows are one zmm, a dpbusd (the lane's bias as its
// accumulator, the token's four quants broadcast from memory) gives each row's
// exact isum_j, and one FMA per lane and token applies the scales. A source
// gives a block's u for lanes j and j + 4 of all 16 rows (64 bytes each, row r
// at 4r); per block the unpacking is shared by the NT tokens of a pass.
struct Lanes512Q4_0 {
  static constexpr size_t kBlockBytes = kPackedQ4_0BlockBytes;
  static constexpr int kBiasShift = 3;
  static constexpr bool kStreamed = true;
  static void lanes(const uint8_t* p, int j, __m512i u[2]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i v = _mm512_loadu_si512(p + 32 + 64 * j);
    u[0] = _mm512_and_si512(v, m4);
    u[1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
  }
};
struct Lanes512Q5_0 {
  static constexpr size_t kBlockBytes = kPackedQ5_0BlockBytes;
  static constexpr int kBiasShift = 4;
  static constexpr bool kStreamed = true;
  static void lanes(const uint8_t* p, int j, __m512i u[2]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
    const __m512i v = _mm512_loadu_si512(p + 96 + 64 * j);
    const __m512i qh = _mm512_loadu_si512(p + 32);
    u[0] = _mm512_or_si512(_mm512_and_si512(v, m4),
                           _mm512_and_si512(_mm512_sllv_epi32(qh, _mm512_set1_epi32(4 - j)), m10));
    u[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4),
                           _mm512_and_si512(_mm512_srlv_epi32(qh, _mm512_set1_epi32(j)), m10));
  }
};
// Q8_0 read unsigned, as u = q + 128.
struct Lanes512Q8_0 {
  static constexpr size_t kBlockBytes = kPackedQ8_0BlockBytes;
  static constexpr int kBiasShift = 7;
  static constexpr bool kStreamed = true;
  static void lanes(const uint8_t* p, int j, __m512i u[2]) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    u[0] = _mm512_xor_si512(_mm512_loadu_si512(p + 32 + 64 * j), flip);
    u[1] = _mm512_xor_si512(_mm512_loadu_si512(p + 32 + 64 * (j + 4)), flip);
  }
};
// A group's blocks with their u bytes written out once per call (expand512):
// the 16 rows' d at 0, lane j's u at 64 + 64j. For Q5_0, whose unpacking costs
// more than a token's products, so that each further pass only loads.
struct Lanes512Expanded {
  static constexpr size_t kBlockBytes = 64 + 512;
  static constexpr bool kStreamed = false;  // just written: in L1 or L2
  static void lanes(const uint8_t* p, int j, __m512i u[2]) {
    u[0] = _mm512_load_si512(p + 64 + 64 * j);
    u[1] = _mm512_load_si512(p + 64 + 64 * (j + 4));
  }
};

// NT tokens (token t's activations at act + t * as, lane biases at bias + t *
// bias_stride) against a group's nb blocks from Src.
template <class Src, int NT>
void lanes512_pass(const uint8_t* group, int64_t nb, const uint8_t* act, size_t as, const int32_t* bias,
                   int64_t bias_stride, float* out, size_t os) {
  PackedAct y[NT];
  __m512 acc[NT][8];
  for (int t = 0; t < NT; ++t) {
    y[t] = packed_act(act + t * as, nb * 32);
    for (int j = 0; j < 8; ++j) acc[t][j] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + b * Src::kBlockBytes;
    if constexpr (Src::kStreamed) prefetch_weights_ahead(p, Src::kBlockBytes, NT == 1);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    __m512 scale[NT];
    for (int t = 0; t < NT; ++t) scale[t] = _mm512_mul_ps(d, _mm512_set1_ps(y[t].d[b]));
    for (int j = 0; j < 4; ++j) {
      __m512i u[2];
      Src::lanes(p, j, u);
      for (int k = 0; k < 2; ++k) {
        const int lane = j + 4 * k;
        for (int t = 0; t < NT; ++t) {
          const __m512i isum = _mm512_dpbusd_epi32(_mm512_set1_epi32(bias[t * bias_stride + 8 * b + lane]), u[k],
                                                   _mm512_set1_epi32(load_i32(y[t].qs + 32 * b + 4 * lane)));
          acc[t][lane] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale[t], acc[t][lane]);
        }
      }
    }
  }
  for (int t = 0; t < NT; ++t) {  // hsum_float_8's order, per row
    const __m512* a = acc[t];
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                                     _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
    _mm512_storeu_ps(out + t * os, sum);
  }
}

template <class Src>
void lanes512_passes(const uint8_t* group, int64_t nb, const uint8_t* act, size_t as, int nt, const int32_t* bias,
                     float* out, size_t os) {
  for (int t = 0; t < nt; t += 2) {
    if (nt - t == 1) {
      lanes512_pass<Src, 1>(group, nb, act + t * as, as, bias + 8 * nb * t, 8 * nb, out + t * os, os);
    } else {
      lanes512_pass<Src, 2>(group, nb, act + t * as, as, bias + 8 * nb * t, 8 * nb, out + t * os, os);
    }
  }
}

// PackedTileFn (lane biases by packed_lane_biases<Src::kBiasShift>): straight
// from the packed blocks.
template <class Src>
void packed_lanes512_tile(const uint8_t* group, int64_t cols, const uint8_t* act, size_t as, const int32_t* bias,
                          int nt, float* out, size_t os) {
  lanes512_passes<Src>(group, cols / 32, act, as, nt, bias, out, os);
}

// PackedTileFn for Q5_0: one or two tokens straight from the packed blocks,
// more from the group's blocks expanded once.
void packed_q5_0_tile512(const uint8_t* group, int64_t cols, const uint8_t* act, size_t as, const int32_t* bias,
                         int nt, float* out, size_t os) {
  if (nt <= 2) {
    packed_lanes512_tile<Lanes512Q5_0>(group, cols, act, as, bias, nt, out, os);
    return;
  }
  const int64_t nb = cols / 32;
  struct alignas(64) Vec512 {
    uint8_t bytes[64];
  };
  thread_local std::vector<Vec512> expanded;
  constexpr size_t kVecs = Lanes512Expanded::kBlockBytes / 64;
  if (expanded.size() < kVecs * nb) expanded.resize(kVecs * nb);
  uint8_t* e = reinterpret_cast<uint8_t*>(expanded.data());
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + b * Lanes512Q5_0::kBlockBytes;
    uint8_t* eb = e + b * Lanes512Expanded::kBlockBytes;
    prefetch_weights_ahead(p, Lanes512Q5_0::kBlockBytes, nt == 1);
    std::memcpy(eb, p, 32);
    for (int j = 0; j < 4; ++j) {
      __m512i u[2];
      Lanes512Q5_0::lanes(p, j, u);
      _mm512_store_si512(eb + 64 + 64 * j, u[0]);
      _mm512_store_si512(eb + 64 + 64 * (j + 4), u[1]);
    }
  }
  lanes512_passes<Lanes512Expanded>(e, nb, act, as, nt, bias, out, os);
}

#endif

// ---- MXFP4 ------------------------------------------------------------------
// Blocks of 16 E8M0 exponents and Q4_0's nibble layout (packed_layout.h). A
// nibble becomes u = kMxfp4Values[nibble] + 12 (0..24) by one byte shuffle, so
// the products stay unsigned x signed (maddubs: at most 2 * 24 * 127, no
// saturation; dpbusd), and -12 times the activation quants' sum is added back.
// The scales are exact powers of two, made from the exponents by integer ops
// as GGML's ggml_e8m0_to_fp32_half makes them (e < 2: subnormal).
constexpr int kMxfp4Bias = 12;
alignas(16) constexpr uint8_t kMxfp4Unsigned[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

inline __m256i mxfp4_lut256() {
  return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Unsigned)));
}
// 2^(e - 128) for eight exponents.
inline __m256 e8m0_half_x8(const uint8_t* e) {
  const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(e)));
  const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(v, _mm256_set1_epi32(1)), 23);
  const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), v);  // e = 0, 1
  return _mm256_castsi256_ps(_mm256_blendv_epi8(sub, normal, _mm256_cmpgt_epi32(v, _mm256_set1_epi32(1))));
}

// GGML's repacked order, rows 8h..8h+7 of a group against NT tokens.
template <int NT>
void packed_half_mxfp4_avx2(const uint8_t* group, int h, int64_t cols, const uint8_t* act, size_t as, float* out,
                            size_t os) {
  const int64_t nb = cols / 32;
  PackedAct y[NT];
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) {
    y[t] = packed_act(act + t * as, cols);
    acc[t] = _mm256_setzero_ps();
  }
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i lut = mxfp4_lut256();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + b * kPackedMXFP4BlockBytes;
    const uint8_t* q = p + 16 + 32 * h;
    if (h == 0) prefetch_weights_ahead(p, kPackedMXFP4BlockBytes, NT == 1);  // the second half reads the same lines
    const __m256 d = e8m0_half_x8(p + 8 * h);
    __m256i w[8];
    for (int j = 0; j < 4; ++j) {
      const __m256i v = load256(q + 64 * j);
      w[j] = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
      w[j + 4] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    }
    for (int t = 0; t < NT; ++t) {
      const int8_t* yq = y[t].qs + 32 * b;
      // Four maddubs pairs per int16 lane before widening: at most 4 * 2 * 24 * 127 = 24384.
      __m256i p16[2];
      for (int k = 0; k < 2; ++k) {
        const __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(w[4 * k], _mm256_set1_epi32(load_i32(yq + 16 * k))),
                                           _mm256_maddubs_epi16(w[4 * k + 1], _mm256_set1_epi32(load_i32(yq + 16 * k + 4))));
        const __m256i c = _mm256_add_epi16(_mm256_maddubs_epi16(w[4 * k + 2], _mm256_set1_epi32(load_i32(yq + 16 * k + 8))),
                                           _mm256_maddubs_epi16(w[4 * k + 3], _mm256_set1_epi32(load_i32(yq + 16 * k + 12))));
        p16[k] = _mm256_add_epi16(a, c);
      }
      const __m256i s0 = _mm256_add_epi32(_mm256_set1_epi32(-kMxfp4Bias * y[t].sum[b]), _mm256_madd_epi16(p16[0], ones));
      const __m256i s1 = _mm256_madd_epi16(p16[1], ones);
      const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(y[t].d[b]));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), scale, acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm256_storeu_ps(out + t * os + 8 * h, acc[t]);
}

#if INFERD_X86_AVX512
// 2^(e - 128) for sixteen exponents.
inline __m512 e8m0_half_x16(const uint8_t* e) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e)));
  const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(v, _mm512_set1_epi32(1)), 23);
  const __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), v);
  return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmpgt_epu32_mask(v, _mm512_set1_epi32(1)), sub, normal));
}

// GGML's repacked order on all 16 rows: one dpbusd per 64 bytes of quants.
template <int NT>
void packed_mxfp4_avx512(const uint8_t* group, int64_t cols, const uint8_t* act, size_t as, float* out, size_t os) {
  const int64_t nb = cols / 32;
  PackedAct y[NT];
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) {
    y[t] = packed_act(act + t * as, cols);
    acc[t] = _mm512_setzero_ps();
  }
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i lut = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Unsigned)));
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = group + b * kPackedMXFP4BlockBytes;
    const uint8_t* q = p + 16;
    prefetch_weights_ahead(p, kPackedMXFP4BlockBytes, NT == 1);
    const __m512 d = e8m0_half_x16(p);
    __m512i w[8];
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(q + 64 * j);
      w[j] = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, m4));
      w[j + 4] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
    }
    for (int t = 0; t < NT; ++t) {
      const int8_t* yq = y[t].qs + 32 * b;
      __m512i s0 = _mm512_set1_epi32(-kMxfp4Bias * y[t].sum[b]);
      __m512i s1 = _mm512_setzero_si512();
      for (int j = 0; j < 8; j += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[j], _mm512_set1_epi32(load_i32(yq + 4 * j)));
        s1 = _mm512_dpbusd_epi32(s1, w[j + 1], _mm512_set1_epi32(load_i32(yq + 4 * j + 4)));
      }
      const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(y[t].d[b]));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), scale, acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_storeu_ps(out + t * os, acc[t]);
}
#endif

// PackedTileFn in GGML's repacked order (rows % 8 == 0).
void packed_mxfp4_tile(const uint8_t* group, int64_t cols, const uint8_t* act, size_t as, const int32_t* /*bias*/,
                       int nt, float* out, size_t os) {
  for (int t = 0; t < nt; t += 4) {
    const uint8_t* a = act + t * as;
    float* o = out + t * os;
#if INFERD_X86_AVX512
    switch (nt - t) {
      case 1: packed_mxfp4_avx512<1>(group, cols, a, as, o, os); break;
      case 2: packed_mxfp4_avx512<2>(group, cols, a, as, o, os); break;
      case 3: packed_mxfp4_avx512<3>(group, cols, a, as, o, os); break;
      default: packed_mxfp4_avx512<4>(group, cols, a, as, o, os); break;
    }
#else
    for (int h = 0; h < 2; ++h) {
      switch (nt - t) {
        case 1: packed_half_mxfp4_avx2<1>(group, h, cols, a, as, o, os); break;
        case 2: packed_half_mxfp4_avx2<2>(group, h, cols, a, as, o, os); break;
        case 3: packed_half_mxfp4_avx2<3>(group, h, cols, a, as, o, os); break;
        default: packed_half_mxfp4_avx2<4>(group, h, cols, a, as, o, os); break;
      }
    }
#endif
  }
}

// GGML's vec_dot order (rows % 8 != 0; packed_ref.cpp), rows 8h..8h+7 against
// one token: lane j's exact isum as maddubs of u plus its lane bias; the even
// blocks of each whole pair into one set of eight accumulators, the odd ones
// into another, the sets added and summed as hsum_float_8; an odd last block
// then by one fma (the AVX-512 level: packed_lanes512_mxfp4, 16 rows at once).
void packed_lanes_half_mxfp4(const uint8_t* group, int h, int64_t cols, const PackedAct& y, const int32_t* bias,
                             float* out) {
  const int64_t nb = cols / 32;
  __m256 acc[2][8];
  for (int k = 0; k < 2; ++k)
    for (int j = 0; j < 8; ++j) acc[k][j] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i lut = mxfp4_lut256();
  const int64_t pairs_end = nb - nb % 2;
  auto lane_isums = [&](int64_t b, __m256i isum[8]) {
    const uint8_t* p = group + b * kPackedMXFP4BlockBytes;
    if (h == 0) prefetch_weights_ahead(p, kPackedMXFP4BlockBytes);  // the second half reads the same lines
    const int8_t* yq = y.qs + 32 * b;
    const int32_t* bj = bias + 8 * b;
    for (int j = 0; j < 4; ++j) {
      const __m256i v = load256(p + 16 + 32 * h + 64 * j);
      const __m256i u[2] = {_mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4)),
                            _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4))};
      for (int k = 0; k < 2; ++k) {
        const int lane = j + 4 * k;
        const __m256i pairs = _mm256_maddubs_epi16(u[k], _mm256_set1_epi32(load_i32(yq + 4 * lane)));
        isum[lane] = _mm256_add_epi32(_mm256_madd_epi16(pairs, ones), _mm256_set1_epi32(bj[lane]));
      }
    }
  };
  for (int64_t b = 0; b < pairs_end; ++b) {
    const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(y.d[b]), e8m0_half_x8(group + b * kPackedMXFP4BlockBytes + 8 * h));
    __m256i isum[8];
    lane_isums(b, isum);
    for (int j = 0; j < 8; ++j) acc[b % 2][j] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum[j]), acc[b % 2][j]);
  }
  __m256 s[8];
  for (int j = 0; j < 8; ++j) s[j] = _mm256_add_ps(acc[0][j], acc[1][j]);
  __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s[0], s[4]), _mm256_add_ps(s[2], s[6])),
                             _mm256_add_ps(_mm256_add_ps(s[1], s[5]), _mm256_add_ps(s[3], s[7])));
  if (pairs_end < nb) {
    const int64_t b = pairs_end;
    const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(y.d[b]), e8m0_half_x8(group + b * kPackedMXFP4BlockBytes + 8 * h));
    __m256i isum[8];
    lane_isums(b, isum);
    __m256i total = isum[0];
    for (int j = 1; j < 8; ++j) total = _mm256_add_epi32(total, isum[j]);
    sum = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(total), sum);
  }
  _mm256_storeu_ps(out, sum);
}

#if INFERD_X86_AVX512
// The same vec_dot order on all 16 rows of a group at once, one token: lane
// j's sixteen rows are one zmm, a dpbusd (the lane's bias as its accumulator)
// gives each row's exact isum_j.
void packed_lanes512_mxfp4(const uint8_t* group, int64_t cols, const PackedAct& y, const int32_t* bias, float* out) {
  const int64_t nb = cols / 32;
  __m512 acc[2][8];
  for (int k = 0; k < 2; ++k)
    for (int j = 0; j < 8; ++j) acc[k][j] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i lut = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kMxfp4Unsigned)));
  auto lane_isums = [&](int64_t b, __m512i isum[8]) {
    const uint8_t* p = group + b * kPackedMXFP4BlockBytes;
    prefetch_weights_ahead(p, kPackedMXFP4BlockBytes);
    const int8_t* yq = y.qs + 32 * b;
    const int32_t* bj = bias + 8 * b;
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(p + 16 + 64 * j);
      const __m512i u[2] = {_mm512_shuffle_epi8(lut, _mm512_and_si512(v, m4)),
                            _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4))};
      for (int k = 0; k < 2; ++k) {
        const int lane = j + 4 * k;
        isum[lane] = _mm512_dpbusd_epi32(_mm512_set1_epi32(bj[lane]), u[k], _mm512_set1_epi32(load_i32(yq + 4 * lane)));
      }
    }
  };
  const int64_t pairs_end = nb - nb % 2;
  for (int64_t b = 0; b < pairs_end; ++b) {
    const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(y.d[b]), e8m0_half_x16(group + b * kPackedMXFP4BlockBytes));
    __m512i isum[8];
    lane_isums(b, isum);
    for (int j = 0; j < 8; ++j) acc[b % 2][j] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum[j]), acc[b % 2][j]);
  }
  __m512 s[8];
  for (int j = 0; j < 8; ++j) s[j] = _mm512_add_ps(acc[0][j], acc[1][j]);
  __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s[0], s[4]), _mm512_add_ps(s[2], s[6])),
                             _mm512_add_ps(_mm512_add_ps(s[1], s[5]), _mm512_add_ps(s[3], s[7])));
  if (pairs_end < nb) {
    const int64_t b = pairs_end;
    const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(y.d[b]), e8m0_half_x16(group + b * kPackedMXFP4BlockBytes));
    __m512i isum[8];
    lane_isums(b, isum);
    __m512i total = isum[0];
    for (int j = 1; j < 8; ++j) total = _mm512_add_epi32(total, isum[j]);
    sum = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(total), sum);
  }
  _mm512_storeu_ps(out, sum);
}

void packed_lanes512_mxfp4_tile(const uint8_t* group, int64_t cols, const uint8_t* act, size_t as, const int32_t* bias,
                                int nt, float* out, size_t os) {
  const int64_t nb = cols / 32;
  for (int t = 0; t < nt; ++t) packed_lanes512_mxfp4(group, cols, packed_act(act + t * as, cols), bias + 8 * nb * t, out + t * os);
}
#endif

// PackedLaneBiasFn for MXFP4: -12 times the sum of each four quants.
void packed_lane_biases_mxfp4(const uint8_t* act, size_t as, int nt, int64_t cols, int32_t* bias) {
  const int64_t nb = cols / 32;
  const __m256i ones8 = _mm256_set1_epi8(1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int t = 0; t < nt; ++t) {
    const PackedAct y = packed_act(act + t * as, cols);
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i quads = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, load256(y.qs + 32 * b)), ones16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bias + 8 * (nb * t + b)),
                          _mm256_mullo_epi32(quads, _mm256_set1_epi32(-kMxfp4Bias)));
    }
  }
}

void packed_lanes_mxfp4_tile(const uint8_t* group, int64_t cols, const uint8_t* act, size_t as, const int32_t* bias,
                             int nt, float* out, size_t os) {
  const int64_t nb = cols / 32;
  for (int t = 0; t < nt; ++t) {
    const PackedAct y = packed_act(act + t * as, cols);
    for (int h = 0; h < 2; ++h) packed_lanes_half_mxfp4(group, h, cols, y, bias + 8 * nb * t, out + t * os + 8 * h);
  }
}

template <DType kType>
void set_packed(KernelTable& table) {
  TypeKernels& k = table.type[static_cast<uint32_t>(kType)];
  k.packed_tile = packed_tile<kType>;
  k.packed_bias = nullptr;  // signed products, or Q4_1's min term: no lane biases
  k.packed_tokens = 4;
}

void fill_x86_packed(KernelTable& table) {
  set_packed<DType::Q4_0>(table);
  set_packed<DType::Q4_1>(table);
  set_packed<DType::Q8_0>(table);
  TypeKernels& q4 = table.type[static_cast<uint32_t>(DType::Q4_0)];
  q4.packed_lanes_tile = packed_lanes_tile<LanesQ4_0>;
  q4.packed_lanes_bias = packed_lane_biases<LanesQ4_0::kBiasShift>;
  q4.packed_lanes_tokens = 4;
  // Q5_0 at every level by the AVX2 kernel, like Q8_0; as many tokens per call
  // as it may take, for fewer expansions of its blocks (and lane biases).
  TypeKernels& q5 = table.type[static_cast<uint32_t>(DType::Q5_0)];
  q5.packed_tile = packed_q5_0_tile;
  q5.packed_bias = packed_lane_biases<LanesQ5_0::kBiasShift>;
  q5.packed_tokens = kMaxPackedTokens;
  TypeKernels& mx = table.type[static_cast<uint32_t>(DType::MXFP4)];
  mx.packed_tile = packed_mxfp4_tile;
  mx.packed_bias = nullptr;  // the bias is the block's, added in the tile
  mx.packed_tokens = 4;
  mx.packed_lanes_tile = packed_lanes_mxfp4_tile;
  mx.packed_lanes_bias = packed_lane_biases_mxfp4;
  mx.packed_lanes_tokens = 4;
#if INFERD_X86_AVX512
  // GGML's lane order on 16 rows per register (the AVX2 kernels above: 8).
  q4.packed_lanes_tile = packed_lanes512_tile<Lanes512Q4_0>;
  q4.packed_lanes_bias = packed_lane_biases<Lanes512Q4_0::kBiasShift>;
  q5.packed_tile = packed_q5_0_tile512;
  q5.packed_bias = packed_lane_biases<Lanes512Q5_0::kBiasShift>;
  TypeKernels& q8 = table.type[static_cast<uint32_t>(DType::Q8_0)];
  q8.packed_tile = packed_lanes512_tile<Lanes512Q8_0>;
  q8.packed_bias = packed_lane_biases<Lanes512Q8_0::kBiasShift>;
  q8.packed_tokens = kMaxPackedTokens;
  mx.packed_lanes_tile = packed_lanes512_mxfp4_tile;
#endif
}
