// x86 SIMD kernels shared by quants_avx2.cpp and quants_avx512.cpp.
//
// This file is textually included by those two translation units only (inside
// an anonymous namespace, so each gets private copies compiled for its own
// instruction set). INFERD_X86_AVX512 selects the AVX-512/VNNI variants of the
// few primitives where they pay; everything else is plain AVX2+FMA+F16C.
//
// Integer dot products: every helper returns eight int32 lanes, each holding
// the sum of four adjacent byte products, whichever instruction computes it
// (VNNI dpbusd or maddubs+madd) — so both levels produce identical integers.
//
// Each dot-product kernel is a template over a tile of NR weight rows x NT
// activation rows: a weight block is unpacked once for NT tokens and an
// activation block loaded once for NR rows, while each (row, token) pair runs
// exactly the 1x1 sequence of operations, so results never depend on how the
// caller batches tokens or splits rows.
//
// Requires before inclusion: <immintrin.h>, <cstring>, quants_blocks.h, kernel_table.h.

#ifndef INFERD_X86_AVX512
#error "define INFERD_X86_AVX512 to 0 or 1 before including quants_x86_impl.h"
#endif

inline float fp16(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t to_fp16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// u (unsigned bytes) . s (signed bytes), four products per int32 lane.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if INFERD_X86_AVX512
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// u . s with lanes 0-3 (bytes 0-15) scaled by one int16 and lanes 4-7 by
// another, given as `scales` = 8 copies of each. Used by the K-quants, whose
// products stay far from int16 saturation (at most 2*63*127).
inline __m256i dot_u8s8_scaled(__m256i u, __m256i s, __m256i scales) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scales);
}
inline __m256i scale_pair(int lo, int hi) {
  return _mm256_setr_m128i(_mm_set1_epi16(static_cast<int16_t>(lo)),
                           _mm_set1_epi16(static_cast<int16_t>(hi)));
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 16 bytes of packed nibbles -> 32 bytes: low nibbles first, then high nibbles.
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i v = _mm256_setr_m128i(t, _mm_srli_epi16(t, 4));
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

// 32 bits -> 32 bytes, byte i = 0xff if bit i is set, else 0.
inline __m256i bits_to_bytes(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
#if INFERD_X86_AVX512
  return _mm256_movm_epi8(bits);
#else
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
#endif
}

// ---- legacy formats (32-element blocks) --------------------------------------
// Kernels take a tile of NR weight rows x NT activation rows. Each (row, token)
// pair has its own accumulator, updated in block order, so its result is the
// same in every tile shape.

// Two consecutive f16 fields (d and m, or d and s) -> f32 lanes 0 and 1.
inline __m128 load_f16_pair(const uint16_t* p) {
  uint32_t u;
  std::memcpy(&u, p, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(u)));
}

template <class YBlock>
inline const YBlock* yrow(const void* b, size_t stride, int t) {
  return reinterpret_cast<const YBlock*>(static_cast<const uint8_t*>(b) + stride * t);
}

template <class B>
inline const B& block_at(const uint8_t* row, int64_t i) {
  return reinterpret_cast<const B*>(row)[i];
}

// Signed formats (Q4_0/Q5_0/Q8_0) follow GGML's order (ggml_vec_dot_*_q8_0 and
// tinyBLAS_Q0_AVX, the same per pair): eight float lanes, one FMA per block,
// block after block, hsum at the end; so does Q5_1 (KQ5_1). Q4_1's row kernel
// consumes blocks in pairs (the two blocks' terms combined first, then added;
// Linear runs Q4_1 packed, in GGML's order). Same order in every tile.

// Signed weights (Q4_0/Q5_0/Q8_0) against Q8_0. The format's Unpack gives the
// weights biased to unsigned bytes u = q + kBias. With VNNI each pair costs one
// dpbusd: sum(u*y) accumulated onto -kBias*sum(y), which is computed once per
// activation block and shared by all rows. Without VNNI, the signed q = u - kBias
// goes through maddubs with its sign moved onto y. Both give the same int32
// lanes (sum of four q*y), so AVX2 and AVX-512 results are identical.
struct LegacySymmetric {
  template <int NR, int NT, class Format>
  static void run(int64_t n, const uint8_t* a, size_t as, const uint8_t* b, size_t bs, float* out,
                  size_t ors, size_t ots) {
    using Block = typename Format::Block;
    const int64_t nb = n / kQK;
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(Format::kBias));
    __m256 acc[NR][NT];
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    // Per activation block: its quants and what the dot needs besides them.
    struct Act {
      __m256i yq, base;  // base: -kBias * sum(y) per lane (VNNI only)
      float d;
    };
    auto load_act = [&](int t, int64_t i) {
      const BlockQ8_0& y = block_at<BlockQ8_0>(b + t * bs, i);
      Act act;
      act.yq = load256(y.qs);
      act.d = fp16(y.d);
#if INFERD_X86_AVX512
      act.base = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), bias, act.yq));
#else
      act.base = _mm256_setzero_si256();
#endif
      return act;
    };
    // Weight block in the form the dot wants: biased unsigned (VNNI) or signed.
    auto load_weights = [&](const Block& x) {
#if INFERD_X86_AVX512
      return Format::unpack(x);
#else
      return _mm256_sub_epi8(Format::unpack(x), bias);
#endif
    };
    auto idot = [](__m256i q, const Act& act) {
#if INFERD_X86_AVX512
      return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(act.base, q, act.yq));
#else
      return _mm256_cvtepi32_ps(dot_u8s8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(act.yq, q)));
#endif
    };
    for (int64_t i = 0; i < nb; ++i) {
      Act y[NT];
      for (int t = 0; t < NT; ++t) y[t] = load_act(t, i);
      for (int r = 0; r < NR; ++r) {
        const Block& x = block_at<Block>(a + r * as, i);
        const __m256i q = load_weights(x);
        const float dx = fp16(x.d);
        for (int t = 0; t < NT; ++t) {
          acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dx * y[t].d), idot(q, y[t]), acc[r][t]);
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) out[r * ors + t * ots] = hsum(acc[r][t]);
    }
  }
};

// Unsigned weights x in [0, 15] with an offset m (Q4_1) against Q8_1:
// x.y = d*dy*sum(q*qy) + m*s, with s = dy*sum(qy) precomputed in the Q8_1 block.
// (d, m) * (dy, s) is one vector multiply; lane 1 accumulates the m*s terms.
struct LegacyAsymmetric {
  template <int NR, int NT, class Block, class Unpack>
  static void run(int64_t n, const uint8_t* a, size_t as, const uint8_t* b, size_t bs, float* out,
                  size_t ors, size_t ots, Unpack unpack) {
    const int64_t nb = n / kQK;
    __m256 acc[NR][NT];
    __m128 accm[NR][NT];
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps(), accm[r][t] = _mm_setzero_ps();
    }
    auto idot = [](__m256i q, __m256i yq) { return _mm256_cvtepi32_ps(dot_u8s8(q, yq)); };
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
      __m256i yq0[NT], yq1[NT];
      __m128 ydm0[NT], ydm1[NT];
      for (int t = 0; t < NT; ++t) {
        const BlockQ8_1& y0 = block_at<BlockQ8_1>(b + t * bs, i);
        const BlockQ8_1& y1 = block_at<BlockQ8_1>(b + t * bs, i + 1);
        yq0[t] = load256(y0.qs), ydm0[t] = load_f16_pair(&y0.d);
        yq1[t] = load256(y1.qs), ydm1[t] = load_f16_pair(&y1.d);
      }
      for (int r = 0; r < NR; ++r) {
        const Block& x0 = block_at<Block>(a + r * as, i);
        const Block& x1 = block_at<Block>(a + r * as, i + 1);
        const __m256i q0 = unpack(x0), q1 = unpack(x1);
        const __m128 xdm0 = load_f16_pair(&x0.d), xdm1 = load_f16_pair(&x1.d);
        for (int t = 0; t < NT; ++t) {
          const __m128 p0 = _mm_mul_ps(xdm0, ydm0[t]), p1 = _mm_mul_ps(xdm1, ydm1[t]);  // (d*dy, m*s)
          __m256 sum = _mm256_mul_ps(_mm256_broadcastss_ps(p0), idot(q0, yq0[t]));
          sum = _mm256_fmadd_ps(_mm256_broadcastss_ps(p1), idot(q1, yq1[t]), sum);
          acc[r][t] = _mm256_add_ps(acc[r][t], sum);
          accm[r][t] = _mm_add_ps(accm[r][t], _mm_add_ps(p0, p1));
        }
      }
    }
    if (i < nb) {
      for (int r = 0; r < NR; ++r) {
        const Block& x = block_at<Block>(a + r * as, i);
        const __m256i q = unpack(x);
        const __m128 xdm = load_f16_pair(&x.d);
        for (int t = 0; t < NT; ++t) {
          const BlockQ8_1& y = block_at<BlockQ8_1>(b + t * bs, i);
          const __m128 p = _mm_mul_ps(xdm, load_f16_pair(&y.d));
          acc[r][t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(p), idot(q, load256(y.qs)), acc[r][t]);
          accm[r][t] = _mm_add_ps(accm[r][t], p);
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) {
        out[r * ors + t * ots] = hsum(acc[r][t]) + _mm_cvtss_f32(_mm_movehdup_ps(accm[r][t]));
      }
    }
  }
};

#define INFERD_TILE_ARGS int64_t n, const uint8_t *a, size_t as, const uint8_t *b, size_t bs, float *out, size_t ors, size_t ots
#define INFERD_TILE_PASS n, a, as, b, bs, out, ors, ots

struct FormatQ4_0 {
  using Block = BlockQ4_0;
  static constexpr int kBias = 8;
  static __m256i unpack(const BlockQ4_0& x) { return unpack_nibbles(x.qs); }
};
struct FormatQ5_0 {
  using Block = BlockQ5_0;
  static constexpr int kBias = 16;
  static __m256i unpack(const BlockQ5_0& x) {
    const __m256i high = _mm256_and_si256(bits_to_bytes(x.qh), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(unpack_nibbles(x.qs), high);
  }
};
struct FormatQ8_0 {
  using Block = BlockQ8_0;
  static constexpr int kBias = 128;  // flipping the sign bit adds 128
  static __m256i unpack(const BlockQ8_0& x) {
    return _mm256_xor_si256(load256(x.qs), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

template <class Format>
struct SymmetricKernel {
  static constexpr int kMaxRows = 4;
  template <int NR, int NT>
  static void run(INFERD_TILE_ARGS) {
    LegacySymmetric::run<NR, NT, Format>(INFERD_TILE_PASS);
  }
};
using KQ4_0 = SymmetricKernel<FormatQ4_0>;
using KQ5_0 = SymmetricKernel<FormatQ5_0>;
using KQ8_0 = SymmetricKernel<FormatQ8_0>;

struct KQ4_1 {
  static constexpr int kMaxRows = 4;
  template <int NR, int NT>
  static void run(INFERD_TILE_ARGS) {
    LegacyAsymmetric::run<NR, NT, BlockQ4_1>(INFERD_TILE_PASS, [](const BlockQ4_1& x) { return unpack_nibbles(x.qs); });
  }
};

// Q5_1 in GGML's order (ggml_vec_dot_q5_1_q8_1, quants_ref.cpp): eight lanes
// of four products per block, acc = fma(lanes, dx * dy, acc); the offsets in
// one float chain, s = fma(m, s_y, s); hsum(acc) + s. (d, m) times (dy, s_y)
// as two-lane vectors: lane 0 of their product is dx * dy, lane 1 of an fma
// onto accm is the offsets' chain (its lane 0 is never read).
struct KQ5_1 {
  static constexpr int kMaxRows = 4;
  template <int NR, int NT>
  static void run(INFERD_TILE_ARGS) {
    const int64_t nb = n / kQK;
    __m256 acc[NR][NT];
    __m128 accm[NR][NT];
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps(), accm[r][t] = _mm_setzero_ps();
    }
    for (int64_t i = 0; i < nb; ++i) {
      __m256i yq[NT];
      __m128 ydm[NT];
      for (int t = 0; t < NT; ++t) {
        const BlockQ8_1& y = block_at<BlockQ8_1>(b + t * bs, i);
        yq[t] = load256(y.qs), ydm[t] = load_f16_pair(&y.d);
      }
      for (int r = 0; r < NR; ++r) {
        const BlockQ5_1& x = block_at<BlockQ5_1>(a + r * as, i);
        const __m256i high = _mm256_and_si256(bits_to_bytes(x.qh), _mm256_set1_epi8(0x10));
        const __m256i q = _mm256_or_si256(unpack_nibbles(x.qs), high);
        const __m128 xdm = load_f16_pair(&x.d);
        for (int t = 0; t < NT; ++t) {
          accm[r][t] = _mm_fmadd_ps(xdm, ydm[t], accm[r][t]);
          const __m256 d = _mm256_broadcastss_ps(_mm_mul_ps(xdm, ydm[t]));
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(q, yq[t])), d, acc[r][t]);
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      for (int t = 0; t < NT; ++t) {
        out[r * ors + t * ots] = hsum(acc[r][t]) + _mm_cvtss_f32(_mm_movehdup_ps(accm[r][t]));
      }
    }
  }
};

// Kernels written for one weight row at a time (K-quants, floats): a tile is
// those rows one after the other, each against all NT tokens.
template <class KRow>
struct RowByRow {
  static constexpr int kMaxRows = 1;
  template <int NR, int NT>
  static void run(INFERD_TILE_ARGS) {
    float tmp[NT];
    for (int r = 0; r < NR; ++r) {
      KRow::template run<NT>(n, a + r * as, b, bs, tmp);
      for (int t = 0; t < NT; ++t) out[r * ors + t * ots] = tmp[t];
    }
  }
};

// ---- K-quants (256-element super-blocks) against Q8_K ---------------------------
// Per super-block: an int32x8 of scale-weighted integer sums (less the bias
// correction) -> one FMA with d*dy, and for formats with mins a second FMA
// subtracting dmin*dy * sum(min_g * bsum_g).


// What a K-quant block contributes besides its quants, per group of 16 as
// int16 lanes (matching Q8_K's 16 bsums): an integer offset (quants are stored
// biased, so sum(offset_g * bsum_g) is subtracted from the integer dot) and a
// min (weighted by dmin instead of d).
struct KBlockInfo {
  __m256i offset;  // only read when the format has offsets
  __m256i min;     // only read when the format has mins
  float d, dmin;
};

// The float orders of GGML's kernels for K-quants (quants_ref.cpp has them in
// scalar form): kVecDotOrder its AVX2 vec_dot (eight lanes, hsum at the end),
// kTiledOrder its tiled matmul (per super-block r = d*isum [- dmin*msum],
// acc = fma(r, dy, acc)), kRepackOrder its repacked Q4_K kernels (a and m
// accumulated apart by fma with d*dy and dmin*dy, result a - m).
// kRepackGemmOrder its repacked Q4_K GEMM, which does the same per 64 elements
// (each pair of sub-blocks) instead of per super-block.
enum KOrder { kVecDotOrder = 0, kTiledOrder = 1, kRepackOrder = 2, kRepackGemmOrder = 3 };

// One super-block's scaled integer products of unpacked weights q (8 vectors
// of 32, sub-block scales sc) with y's quants, in 8 int32 lanes (two chains,
// then added): every K-quant order starts from these exact sums.
inline __m256i superblock_isum(const __m256i* q, const __m256i* sc, const BlockQ8_K& y) {
  __m256i p0 = dot_u8s8_scaled(q[0], load256(y.qs), sc[0]);
  __m256i p1 = dot_u8s8_scaled(q[1], load256(y.qs + 32), sc[1]);
  for (int k = 2; k < 8; k += 2) {
    p0 = _mm256_add_epi32(p0, dot_u8s8_scaled(q[k], load256(y.qs + 32 * k), sc[k]));
    p1 = _mm256_add_epi32(p1, dot_u8s8_scaled(q[k + 1], load256(y.qs + 32 * k + 32), sc[k + 1]));
  }
  return _mm256_add_epi32(p0, p1);
}

// Q4_K/Q5_K/Q2_K/Q3_K/Q6_K share this driver: `unpack` fills 8 vectors of 32
// unsigned quants (elements 32k..32k+31), their scale pairs and the info.
template <bool kHasOffset, bool kHasMin>
struct KQuantDriver {
  // Lanes 0-3 of the result: the int32 sum of all eight lanes of v[0..3], exact.
  static __m128i sum_lanes4(const __m256i* v) {
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  }
  // The scalar orders (tiled, repacked gemv and gemm) with one float lane per
  // token (up to four): each token's chain of fmas is the same sequence of
  // scalar operations as one at a time, but the horizontal integer sums of four
  // tokens share one hadd tree, and four tokens' fmas one instruction. Missing
  // tokens (NT not a multiple of 4) are zero lanes: not computed, not written.
  template <int NT, class Block, int kOrder, class Unpack>
  static void run_token_lanes(int64_t n, const void* a, const void* b, size_t bs, float* out, Unpack unpack) {
    static_assert(NT >= 1 && NT <= 8);
    constexpr int kGroups = (NT + 3) / 4;
    const Block* x = static_cast<const Block*>(a);
    const int64_t nb = n / kQK_K;
    const BlockQ8_K* yg[kGroups * 4];
    for (int t = 0; t < kGroups * 4; ++t) yg[t] = yrow<BlockQ8_K>(b, bs, t < NT ? t : 0);
    __m128 saccg[kGroups], sacc_ming[kGroups];
    for (int g = 0; g < kGroups; ++g) saccg[g] = sacc_ming[g] = _mm_setzero_ps();
    __m256i q[8], sc[8];
    for (int64_t i = 0; i < nb; ++i) {
      KBlockInfo info;
      unpack(x[i], q, sc, info);
      for (int g = 0; g < kGroups; ++g) {
      const BlockQ8_K* const* yr = yg + 4 * g;
      __m128& sacc = saccg[g];
      __m128& sacc_min = sacc_ming[g];
      const __m128 dy = _mm_setr_ps(yr[0][i].d, yr[1][i].d, yr[2][i].d, yr[3][i].d);
      if constexpr (kOrder == kRepackGemmOrder) {
        static_assert(kHasMin && !kHasOffset, "the repacked GEMM order is Q4_K's");
        __m256i pk[4][4], mm[4];  // pk[k][t]: sub-blocks 2k, 2k+1; mm[t]: min_j * bsum of sub-block j
        for (int t = NT - 4 * g; t < 4; ++t) {
          for (int k = 0; k < 4; ++k) pk[k][t] = _mm256_setzero_si256();
          mm[t] = _mm256_setzero_si256();
        }
        for (int t = 0; t < 4 && t < NT - 4 * g; ++t) {
          const BlockQ8_K& y = yr[t][i];
          for (int k = 0; k < 4; ++k) {
            pk[k][t] = _mm256_add_epi32(dot_u8s8_scaled(q[2 * k], load256(y.qs + 64 * k), sc[2 * k]),
                                        dot_u8s8_scaled(q[2 * k + 1], load256(y.qs + 64 * k + 32), sc[2 * k + 1]));
          }
          mm[t] = _mm256_madd_epi16(load256(y.bsums), info.min);
        }
        // Lane pairs of mm summed: [t0 k0, t0 k1, t1 k0, t1 k1 | t0 k2, t0 k3, t1 k2, t1 k3] and t2, t3.
        const __m256 m01 = _mm256_castsi256_ps(_mm256_hadd_epi32(mm[0], mm[1]));
        const __m256 m23 = _mm256_castsi256_ps(_mm256_hadd_epi32(mm[2], mm[3]));
        const __m256 m02 = _mm256_shuffle_ps(m01, m23, _MM_SHUFFLE(2, 0, 2, 0));  // k0 | k2, tokens 0-3
        const __m256 m13 = _mm256_shuffle_ps(m01, m23, _MM_SHUFFLE(3, 1, 3, 1));  // k1 | k3
        __m128 msum[4];
        msum[0] = _mm_cvtepi32_ps(_mm_castps_si128(_mm256_castps256_ps128(m02)));
        msum[1] = _mm_cvtepi32_ps(_mm_castps_si128(_mm256_castps256_ps128(m13)));
        msum[2] = _mm_cvtepi32_ps(_mm_castps_si128(_mm256_extractf128_ps(m02, 1)));
        msum[3] = _mm_cvtepi32_ps(_mm_castps_si128(_mm256_extractf128_ps(m13, 1)));
        const __m128 sd = _mm_mul_ps(_mm_set1_ps(info.d), dy), sm = _mm_mul_ps(_mm_set1_ps(info.dmin), dy);
        for (int k = 0; k < 4; ++k) {
          sacc = _mm_fmadd_ps(_mm_cvtepi32_ps(sum_lanes4(pk[k])), sd, sacc);
          sacc_min = _mm_fmadd_ps(msum[k], sm, sacc_min);
        }
        continue;
      }
      {
      __m256i p[4], mm[4];
      for (int t = NT - 4 * g; t < 4; ++t) p[t] = mm[t] = _mm256_setzero_si256();
      for (int t = 0; t < 4 && t < NT - 4 * g; ++t) {
        const BlockQ8_K& y = yr[t][i];
        p[t] = superblock_isum(q, sc, y);
        const __m256i bsums = load256(y.bsums);
        if (kHasOffset) p[t] = _mm256_sub_epi32(p[t], _mm256_madd_epi16(bsums, info.offset));
        if (kHasMin) mm[t] = _mm256_madd_epi16(bsums, info.min);
      }
      const __m128 isum = _mm_cvtepi32_ps(sum_lanes4(p));
      const __m128 msum = kHasMin ? _mm_cvtepi32_ps(sum_lanes4(mm)) : _mm_setzero_ps();
      if constexpr (kOrder == kTiledOrder) {
        __m128 r = _mm_mul_ps(_mm_set1_ps(info.d), isum);
        if (kHasMin) r = _mm_fmadd_ps(_mm_set1_ps(-info.dmin), msum, r);
        sacc = _mm_fmadd_ps(r, dy, sacc);
      } else {
        sacc = _mm_fmadd_ps(isum, _mm_mul_ps(_mm_set1_ps(info.d), dy), sacc);
        sacc_min = _mm_fmadd_ps(msum, _mm_mul_ps(_mm_set1_ps(info.dmin), dy), sacc_min);
      }
      }
      }
    }
    alignas(16) float res[4 * kGroups];
    for (int g = 0; g < kGroups; ++g) {
      _mm_store_ps(res + 4 * g, kOrder == kTiledOrder ? saccg[g] : _mm_sub_ps(saccg[g], sacc_ming[g]));
    }
    for (int t = 0; t < NT; ++t) out[t] = res[t];
  }

  template <int NT, class Block, int kOrder = kVecDotOrder, class Unpack>
  static void run(int64_t n, const void* a, const void* b, size_t bs, float* out, Unpack unpack) {
    if constexpr (kOrder != kVecDotOrder) {
      run_token_lanes<NT, Block, kOrder>(n, a, b, bs, out, unpack);
      return;
    }
    // GGML's AVX2 vec_dot orders (quants_ref.cpp, vec_dot_k_lanes and
    // vec_dot_q6_k_lanes): lane L of the isum holds elements 4L..4L+3 of each
    // 32-run, as superblock_isum builds it; the mins go per format. Q4_K's
    // four min lanes of two tokens share a vector (mins2), Q5_K's one min
    // chain of up to four tokens one (lane t: token t), so that their
    // horizontal integer sums share instructions.
    static_assert(NT >= 1 && NT <= 4);
    constexpr bool kQ2 = std::is_same_v<Block, BlockQ2_K>, kQ3 = std::is_same_v<Block, BlockQ3_K>;
    constexpr bool kQ4 = std::is_same_v<Block, BlockQ4_K>, kQ5 = std::is_same_v<Block, BlockQ5_K>;
    const Block* x = static_cast<const Block*>(a);
    const int64_t nb = n / kQK_K;
    const BlockQ8_K* yr[NT];
    __m256 acc[NT];
    __m256 mins2[(NT + 1) / 2];  // Q4_K: token 2u in the low half, 2u + 1 in the high
    __m128 mins4 = _mm_setzero_ps();  // Q5_K
    __m256i blk[4];  // Q5_K, one token: the last blocks' min products
    float blk_dmin[4], summs1 = 0.0f;
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps(), yr[t] = yrow<BlockQ8_K>(b, bs, t);
    for (int u = 0; u < (NT + 1) / 2; ++u) mins2[u] = _mm256_setzero_ps();
    __m256i q[8], sc[8], qabs[8];
    for (int64_t i = 0; i < nb; ++i) {
      if constexpr (NT == 1) {
        // Decode streams the rows one after the other: fetch the weights ahead.
        const char* p = reinterpret_cast<const char*>(x + i);
        prefetch_weights_ahead(p, sizeof(Block));
      }
      KBlockInfo info;
      unpack(x[i], q, sc, info);
      if constexpr (kQ3) {
        // The unpacked quants are signed here (the stored bias must leave each
        // lane's own elements): maddubs on |q| and y with q's sign (|q| <= 4:
        // exact in int16).
        for (int k = 0; k < 8; ++k) qabs[k] = _mm256_abs_epi8(q[k]);
      }
      __m256i mm[2];  // min_j * bsum_j of the last tokens
      __m256i pair[2];  // Q5_K: pairs of tokens' sums, halfway
      float dmin[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int t = 0; t < NT; ++t) {
        const BlockQ8_K& y = yr[t][i];
        const float d = y.d * info.d;
        dmin[t] = -y.d * info.dmin;
        __m256i p;
        if constexpr (kQ3) {
          __m256i p0 = dot_u8s8_scaled(qabs[0], _mm256_sign_epi8(load256(y.qs), q[0]), sc[0]);
          __m256i p1 = dot_u8s8_scaled(qabs[1], _mm256_sign_epi8(load256(y.qs + 32), q[1]), sc[1]);
          for (int k = 2; k < 8; k += 2) {
            p0 = _mm256_add_epi32(p0, dot_u8s8_scaled(qabs[k], _mm256_sign_epi8(load256(y.qs + 32 * k), q[k]), sc[k]));
            p1 = _mm256_add_epi32(
                p1, dot_u8s8_scaled(qabs[k + 1], _mm256_sign_epi8(load256(y.qs + 32 * k + 32), q[k + 1]), sc[k + 1]));
          }
          p = _mm256_add_epi32(p0, p1);
        } else {
          p = superblock_isum(q, sc, y);
        }
        const __m256i bsums = load256(y.bsums);
        if constexpr (kHasOffset && !kQ3) p = _mm256_sub_epi32(p, _mm256_madd_epi16(bsums, info.offset));
        if constexpr (kHasMin) {
          // Q2_K: lane L holds groups 2L and 2L+1; Q4_K/Q5_K: 32-run L.
          mm[t % 2] = _mm256_madd_epi16(bsums, info.min);
          if constexpr (kQ2) acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin[t]), _mm256_cvtepi32_ps(mm[t % 2]), acc[t]);
        }
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc[t]);
        if constexpr (kQ4 || kQ5) {
          // Tokens in pairs, as soon as both are there (fewer live registers).
          if (t % 2 == 0 && t + 1 < NT) continue;
          const int u = t / 2;
          // hadd gives [a 01, a 23, b 01, b 23 | a 45, a 67, b 45, b 67] (run sums).
          const __m256i h = _mm256_hadd_epi32(mm[0], t % 2 ? mm[1] : _mm256_setzero_si256());
          if constexpr (kQ4) {
            // Lane k of a token: runs 2k and 2k+1; the permute puts token a's
            // four lanes in the low half, b's in the high.
            const __m256 m = _mm256_cvtepi32_ps(_mm256_permute4x64_epi64(h, 0xD8));
            const __m256 dm = _mm256_setr_m128(_mm_set1_ps(dmin[2 * u]), _mm_set1_ps(dmin[t]));
            mins2[u] = _mm256_fmadd_ps(dm, m, mins2[u]);
          } else if constexpr (NT == 1) {
            pair[0] = mm[0];
          } else {
            pair[u] = h;
          }
        }
      }
      if constexpr (kQ5 && NT == 1) {
        // One token: four blocks' sums share the reduction, then their fmas
        // run in block order.
        const int64_t j = i % 4;
        blk[j] = pair[0];
        blk_dmin[j] = dmin[0];
        if (j == 3 || i == nb - 1) {
          for (int64_t z = j + 1; z < 4; ++z) blk[z] = _mm256_setzero_si256();
          const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(blk[0], blk[1]), _mm256_hadd_epi32(blk[2], blk[3]));
          alignas(16) float m[4];
          _mm_store_ps(m, _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))));
          for (int64_t z = 0; z <= j; ++z) summs1 = std::fma(blk_dmin[z], m[z], summs1);
        }
      } else if constexpr (kQ5) {
        // Each token's whole sum: [a, b, c, d] after one more hadd and the halves added.
        const __m256i h = _mm256_hadd_epi32(pair[0], NT > 2 ? pair[(NT - 1) / 2] : _mm256_setzero_si256());
        const __m128 m = _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
        mins4 = _mm_fmadd_ps(_mm_setr_ps(dmin[0], dmin[1], dmin[2], dmin[3]), m, mins4);
      }
    }
    alignas(16) float s5[4];
    _mm_store_ps(s5, mins4);
    for (int t = 0; t < NT; ++t) {
      if constexpr (kQ4) {
        __m128 m = t % 2 ? _mm256_extractf128_ps(mins2[t / 2], 1) : _mm256_castps256_ps128(mins2[t / 2]);
        m = _mm_add_ps(m, _mm_movehl_ps(m, m));
        m = _mm_add_ss(m, _mm_movehdup_ps(m));  // (m0 + m2) + (m1 + m3)
        out[t] = hsum(acc[t]) + _mm_cvtss_f32(m);
      } else if constexpr (kQ5) {
        out[t] = hsum(acc[t]) + (NT == 1 ? summs1 : s5[t]);
      } else {
        out[t] = hsum(acc[t]);
      }
    }
  }
};

// A K-quant row kernel run in another of GGML's orders.
template <class K, int kOrder>
struct KOrdered {
  template <int NT>
  static void run(int64_t n, const void* a, const void* b, size_t bs, float* out) {
    K::template run<NT, kOrder>(n, a, b, bs, out);
  }
};

// Q4_K/Q5_K's 12 packed bytes -> 8 6-bit scales (bytes of *sc) and 8 mins
// (bytes of *mn). Scales/mins 0-3 are the low 6 bits of bytes 0-3 / 4-7;
// 4-7 take their low 4 bits from bytes 8-11 and their top 2 bits from the top
// of bytes 0-3 / 4-7.
inline void k4_unpack_scales(const uint8_t* p, uint64_t* sc, uint64_t* mn) {
  uint32_t u[3];
  std::memcpy(u, p, 12);
  const uint32_t s_lo = u[0] & 0x3f3f3f3fu, m_lo = u[1] & 0x3f3f3f3fu;
  const uint32_t s_hi = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
  const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
  *sc = s_lo | (static_cast<uint64_t>(s_hi) << 32);
  *mn = m_lo | (static_cast<uint64_t>(m_hi) << 32);
}

// 8 unsigned byte scales -> sc[k] = 16 int16 lanes of scale k.
inline void broadcast_scales8(uint64_t scales, __m256i* sc) {
  const __m256i v = _mm256_broadcastsi128_si256(_mm_cvtsi64_si128(static_cast<long long>(scales)));
  for (int k = 0; k < 8; ++k) {
    // Each int16 lane's low byte takes byte k, its high byte 0 (index 0x80).
    sc[k] = _mm256_shuffle_epi8(v, _mm256_set1_epi16(static_cast<int16_t>(0x8000 | k)));
  }
}

// 8 unsigned byte mins (one per 32 elements) -> 16 int16 lanes, one per group of 16.
inline __m256i mins_per_16(uint64_t mins) {
  const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(mins)));
  return _mm256_setr_m128i(_mm_unpacklo_epi16(m16, m16), _mm_unpackhi_epi16(m16, m16));
}

struct KQ4_K {
  template <int NT, int kOrder = kVecDotOrder>
  static void run(int64_t n, const void* a, const void* b, size_t bs, float* out) {
    KQuantDriver<false, true>::run<NT, BlockQ4_K, kOrder>(n, a, b, bs, out, [](const BlockQ4_K& x, __m256i* q, __m256i* sc, KBlockInfo& info) {
      uint64_t scales, mins;
      k4_unpack_scales(x.scales, &scales, &mins);
      broadcast_scales8(scales, sc);
      const __m256i m4 = _mm256_set1_epi8(0x0f);
      for (int c = 0; c < 4; ++c) {
        const __m256i v = load256(x.qs + 32 * c);
        q[2 * c] = _mm256_and_si256(v, m4);
        q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      }
      info.min = mins_per_16(mins);
      info.d = fp16(x.d);
      info.dmin = fp16(x.dmin);
    });
  }
};

struct KQ5_K {
  template <int NT, int kOrder = kVecDotOrder>
  static void run(int64_t n, const void* a, const void* b, size_t bs, float* out) {
    KQuantDriver<false, true>::run<NT, BlockQ5_K, kOrder>(n, a, b, bs, out, [](const BlockQ5_K& x, __m256i* q, __m256i* sc, KBlockInfo& info) {
      uint64_t scales, mins;
      k4_unpack_scales(x.scales, &scales, &mins);
      broadcast_scales8(scales, sc);
      const __m256i m4 = _mm256_set1_epi8(0x0f);
      const __m256i bit4 = _mm256_set1_epi8(0x10);
      const __m256i qh = load256(x.qh);
      for (int c = 0; c < 4; ++c) {
        const __m256i v = load256(x.qs + 32 * c);
        // 5th bit of element 32k+l is bit k of qh[l]; move it to bit 4.
        const __m256i h0 = _mm256_and_si256(c * 2 <= 4 ? _mm256_slli_epi16(qh, 4 - 2 * c) : _mm256_srli_epi16(qh, 2 * c - 4), bit4);
        const __m256i h1 = _mm256_and_si256(c * 2 + 1 <= 4 ? _mm256_slli_epi16(qh, 3 - 2 * c) : _mm256_srli_epi16(qh, 2 * c - 3), bit4);
        q[2 * c] = _mm256_or_si256(_mm256_and_si256(v, m4), h0);
        q[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), h1);
      }
      info.min = mins_per_16(mins);
      info.d = fp16(x.d);
      info.dmin = fp16(x.dmin);
    });
  }
};

// Super-block x's quants (+32, 0..63) as 8 vectors of 32: elements 32k..32k+31.
inline void q6k_unpack(const BlockQ6_K& x, __m256i* q) {
  const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(0x30);
  for (int h = 0; h < 2; ++h) {
    const __m256i l0 = load256(x.ql + 64 * h), l1 = load256(x.ql + 64 * h + 32);
    const __m256i qh = load256(x.qh + 32 * h);
    __m256i* qq = q + 4 * h;
    qq[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m3));
    qq[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m3));
    qq[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m3));
    qq[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m3));
  }
}

struct KQ6_K {
  template <int NT, int kOrder = kVecDotOrder>
  static void run(int64_t n, const void* a, const void* b, size_t bs, float* out) {
    KQuantDriver<true, false>::run<NT, BlockQ6_K, kOrder>(n, a, b, bs, out, [](const BlockQ6_K& x, __m256i* q, __m256i* sc, KBlockInfo& info) {
      q6k_unpack(x, q);
      // Signed scale per 16: vector k needs scale 2k in lanes 0-7 and 2k+1 in 8-15.
      const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
      const __m256i sb = _mm256_broadcastsi128_si256(s8);
      for (int k = 0; k < 8; ++k) {
        const __m256i pick = _mm256_setr_m128i(_mm_set1_epi8(static_cast<char>(2 * k)),
                                               _mm_set1_epi8(static_cast<char>(2 * k + 1)));
        sc[k] = _mm256_srai_epi16(_mm256_shuffle_epi8(sb, pick), 8);  // sign-extends
      }
      // Quants are stored +32: subtract 32 * scale_g * sum(qy in g).
      info.offset = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s8), 5);
      info.d = fp16(x.d);
      info.dmin = 0.0f;
    });
  }
};

struct KQ3_K {
  template <int NT, int kOrder = kVecDotOrder>
  static void run(int64_t n, const void* a, const void* b, size_t bs, float* out) {
    KQuantDriver<true, false>::run<NT, BlockQ3_K, kOrder>(n, a, b, bs, out, [](const BlockQ3_K& x, __m256i* q, __m256i* sc, KBlockInfo& info) {
      const __m256i m2 = _mm256_set1_epi8(3);
      const __m256i hm = load256(x.hmask);
      for (int k = 0; k < 8; ++k) {
        // Element 32k+l: bits 2*(k%4) of qs[32*(k/4)+l], high bit = bit k of hmask[l].
        const __m256i v = load256(x.qs + 32 * (k / 4));
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(v, 2 * (k % 4)), m2);
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << k));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
        if constexpr (kOrder == kVecDotOrder) {
          q[k] = _mm256_add_epi8(low, _mm256_andnot_si256(set, _mm256_set1_epi8(-4)));  // signed q in [-4, 3]
        } else {
          q[k] = _mm256_or_si256(low, _mm256_and_si256(set, _mm256_set1_epi8(4)));  // stored value q+4 in [0, 7]
        }
      }
      // The 16 6-bit scales (low 4 bits in bytes 0-7, two bits each in 8-11), less 32.
      uint32_t u[3];
      std::memcpy(u, x.scales, 12);
      const uint32_t k4 = 0x0f0f0f0fu, k2 = 0x03030303u;
      const __m128i s8 = _mm_sub_epi8(
          _mm_setr_epi32(static_cast<int>((u[0] & k4) | ((u[2] & k2) << 4)),
                         static_cast<int>((u[1] & k4) | (((u[2] >> 2) & k2) << 4)),
                         static_cast<int>(((u[0] >> 4) & k4) | (((u[2] >> 4) & k2) << 4)),
                         static_cast<int>(((u[1] >> 4) & k4) | (((u[2] >> 6) & k2) << 4))),
          _mm_set1_epi8(32));
      // sc[k]: scale 2k in int16 lanes 0-7, 2k+1 in 8-15 (even scales widened
      // into the low half, odd into the high, one shuffle each).
      const __m128i even_odd =
          _mm_shuffle_epi8(s8, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
      const __m256i t = _mm256_cvtepi8_epi16(even_odd);
      for (int k = 0; k < 8; ++k) {
        sc[k] = _mm256_shuffle_epi8(t, _mm256_set1_epi16(static_cast<int16_t>(((2 * k + 1) << 8) | (2 * k))));
      }
      info.offset = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s8), 2);  // stored quants are q+4
      info.d = fp16(x.d);
      info.dmin = 0.0f;
    });
  }
};

struct KQ2_K {
  template <int NT, int kOrder = kVecDotOrder>
  static void run(int64_t n, const void* a, const void* b, size_t bs, float* out) {
    KQuantDriver<false, true>::run<NT, BlockQ2_K, kOrder>(n, a, b, bs, out, [](const BlockQ2_K& x, __m256i* q, __m256i* sc, KBlockInfo& info) {
      const __m256i m2 = _mm256_set1_epi8(3);
      for (int k = 0; k < 8; ++k) {
        const __m256i v = load256(x.qs + 32 * (k / 4));
        q[k] = _mm256_and_si256(_mm256_srli_epi16(v, 2 * (k % 4)), m2);
        sc[k] = scale_pair(x.scales[2 * k] & 0xf, x.scales[2 * k + 1] & 0xf);
      }
      const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
      info.min = _mm256_srli_epi16(sc16, 4);
      info.d = fp16(x.d);
      info.dmin = fp16(x.dmin);
    });
  }
};

// ---- float dot products ------------------------------------------------------


// Elements of the float weight types as 8 float lanes, or one float.
struct ElemF32 {
  using T = float;
  static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
  static float one(float v) { return v; }
};
struct ElemF16 {
  using T = uint16_t;
  static __m256 load8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static float one(uint16_t v) { return fp16(v); }
};
struct ElemBF16 {
  using T = uint16_t;
  static __m256 load8(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static float one(uint16_t v) {
    const uint32_t u = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// Float weights in the order of GGML's AVX2 ggml_vec_dot_f32 / _f16 / _bf16
// (quants_ref.cpp, vec_dot_float_lanes): four 8-lane accumulators over
// 32-element steps, folded (0+2) + (1+3) and summed as GGML_F32x8_REDUCE
// (kHsum8 false) or as hsum_float_8 (BF16), then the rest element by element
// (in float for F32, in double for F16/BF16). 8-lane vectors at every
// level: the AVX-512 build of the kernel keeps the AVX2 build's bits.
template <class E, bool kHsum8, bool kTailDouble>
struct KFloatVecDot {
  template <int NT>
  static void run(int64_t n, const void* va, const void* vb, size_t bs, float* out) {
    using T = typename E::T;
    const T* a = static_cast<const T*>(va);
    for (int t = 0; t < NT; ++t) {
      const T* b = reinterpret_cast<const T*>(static_cast<const uint8_t*>(vb) + bs * t);
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
      int64_t i = 0;
      for (; i + 32 <= n; i += 32) {
        for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_ps(E::load8(a + i + 8 * j), E::load8(b + i + 8 * j), acc[j]);
      }
      const __m256 v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
      float sum;
      if constexpr (kHsum8) {
        sum = hsum(v);
      } else {
        const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        const __m128 t1 = _mm_hadd_ps(t0, t0);
        sum = _mm_cvtss_f32(_mm_hadd_ps(t1, t1));  // (t0 + t1) + (t2 + t3)
      }
      if constexpr (kTailDouble) {
        double sumd = sum;
        for (; i < n; ++i) sumd += static_cast<double>(E::one(a[i]) * E::one(b[i]));
        sum = static_cast<float>(sumd);
      } else {
        // Rounded product, then sum, as GGML's build does it: by intrinsics, so
        // that GCC does not contract them into an fma here.
        __m128 s = _mm_set_ss(sum);
        for (; i < n; ++i) s = _mm_add_ss(s, _mm_mul_ss(_mm_set_ss(E::one(a[i])), _mm_set_ss(E::one(b[i]))));
        sum = _mm_cvtss_f32(s);
      }
      out[t] = sum;
    }
  }
};
using KF32 = KFloatVecDot<ElemF32, false, false>;
using KF16 = KFloatVecDot<ElemF16, false, true>;
using KBF16 = KFloatVecDot<ElemBF16, true, true>;

// tinyBLAS's order on float weights (quants_ref.cpp, dot_tinyblas): per
// (row, token) one 8-lane accumulator, fma per 8 elements, hsum. RM rows by
// RN tokens share each load, as tinyBLAS's own 4 x 3 register blocks do.
template <class E, int RM, int RN>
inline void tinyblas_block(int64_t n, const uint8_t* a, size_t as, const uint8_t* b, size_t bs, float* out, size_t ors,
                           size_t ots) {
  using T = typename E::T;
  __m256 acc[RM][RN];
  for (int r = 0; r < RM; ++r) {
    for (int t = 0; t < RN; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    __m256 bv[RN];
    for (int t = 0; t < RN; ++t) bv[t] = E::load8(reinterpret_cast<const T*>(b + t * bs) + i);
    for (int r = 0; r < RM; ++r) {
      const __m256 av = E::load8(reinterpret_cast<const T*>(a + r * as) + i);
      for (int t = 0; t < RN; ++t) acc[r][t] = _mm256_fmadd_ps(av, bv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < RM; ++r) {
    for (int t = 0; t < RN; ++t) out[r * ors + t * ots] = hsum(acc[r][t]);
  }
}

template <class E, int RM>
inline void tinyblas_rows(int64_t n, const uint8_t* a, size_t as, const uint8_t* b, size_t bs, int nt, float* out,
                          size_t ors, size_t ots) {
  int t = 0;
  for (; t + 3 <= nt; t += 3) tinyblas_block<E, RM, 3>(n, a, as, b + t * bs, bs, out + t * ots, ors, ots);
  if (nt - t == 2) tinyblas_block<E, RM, 2>(n, a, as, b + t * bs, bs, out + t * ots, ors, ots);
  if (nt - t == 1) tinyblas_block<E, RM, 1>(n, a, as, b + t * bs, bs, out + t * ots, ors, ots);
}

template <class E>
void tinyblas_tile(int64_t n, const void* va, size_t as, int nr, const void* vb, size_t bs, int nt, float* out,
                   size_t ors, size_t ots) {
  const uint8_t* a = static_cast<const uint8_t*>(va);
  const uint8_t* b = static_cast<const uint8_t*>(vb);
  int r = 0;
  for (; r + 4 <= nr; r += 4) tinyblas_rows<E, 4>(n, a + r * as, as, b, bs, nt, out + r * ors, ors, ots);
  for (; r < nr; ++r) tinyblas_rows<E, 1>(n, a + r * as, as, b, bs, nt, out + r * ors, ors, ots);
}

template <class K>
float vec_dot_one(int64_t n, const void* a, const void* b) {
  float out;
  K::template run<1, 1>(n, static_cast<const uint8_t*>(a), 0, static_cast<const uint8_t*>(b), 0, &out, 0, 0);
  return out;
}

template <class K, int NR>
void run_tokens(int nt, INFERD_TILE_ARGS) {
  switch (nt) {
    case 4: K::template run<NR, 4>(INFERD_TILE_PASS); break;
    case 3: K::template run<NR, 3>(INFERD_TILE_PASS); break;
    case 2: K::template run<NR, 2>(INFERD_TILE_PASS); break;
    default: K::template run<NR, 1>(INFERD_TILE_PASS); break;
  }
}

// Any nr x nt tile, cut into the instantiated shapes (rows 4/2/1, tokens 1..4).
template <class K>
void gemm_tile(int64_t n, const void* va, size_t as, int nr, const void* vb, size_t bs, int nt, float* out,
               size_t ors, size_t ots) {
  const uint8_t* a = static_cast<const uint8_t*>(va);
  const uint8_t* b = static_cast<const uint8_t*>(vb);
  for (int r = 0; r < nr;) {
    const int rr = (K::kMaxRows >= 4 && nr - r >= 4) ? 4 : (K::kMaxRows >= 2 && nr - r >= 2) ? 2 : 1;
    for (int t = 0; t < nt;) {
      const int tt = nt - t < kMaxTileTokens ? nt - t : kMaxTileTokens;
      const uint8_t* ta = a + r * as;
      const uint8_t* tb = b + t * bs;
      float* to = out + r * ors + t * ots;
      if constexpr (K::kMaxRows >= 4) {
        if (rr == 4) {
          run_tokens<K, 4>(tt, n, ta, as, tb, bs, to, ors, ots);
          t += tt;
          continue;
        }
      }
      if constexpr (K::kMaxRows >= 2) {
        if (rr == 2) {
          run_tokens<K, 2>(tt, n, ta, as, tb, bs, to, ors, ots);
          t += tt;
          continue;
        }
      }
      run_tokens<K, 1>(tt, n, ta, as, tb, bs, to, ors, ots);
      t += tt;
    }
    r += rr;
  }
}

// ---- Q4_0/Q5_0 x Q8_0 for many tokens (AVX2) ----------------------------------
// The same per (row, token) arithmetic as LegacySymmetric (GGML's order: eight
// int32 lanes of four products per block, one fma with dx*dy per block in block
// order, hsum at the end), with the work arranged for a prefill step: a call
// unpacks its weight rows once into biased unsigned bytes u = q + kBias (and
// dx as float), and prepares each of its tokens' blocks once (the quants
// copied aligned, kBias * sum(y) per lane, dy as float). Its register tiles then
// cost six vector operations per (row, token, block): maddubs(u, y), madd,
// the bias subtracted, int -> float, dx*dy, fma. The integers are exact either
// way (|u*y + u'*y'| <= 2*31*128 does not saturate maddubs), so each lane holds
// the same sum of four q*y as GGML's, and every result bit is LegacySymmetric's.
struct Vec256 {
  __m256i v;  // 32-byte aligned by the type
};
struct UnpackedScratch {
  std::vector<Vec256> wq, yq, yb;  // u of [block][row]; y and kBias*sum(y) of [token][block]
  std::vector<float> wd, yd;        // dx of [block][row], dy of [token][block]
};
inline UnpackedScratch& unpacked_scratch() {
  thread_local UnpackedScratch s;
  return s;
}

// Rows [r0, r0+NR) x tokens [t0, t0+NT) of the prepared call.
template <int NR, int NT>
inline void unpacked_symmetric_tile(int64_t nb, int nr, const __m256i* wq, const float* wd, const __m256i* yq,
                                    const __m256i* yb, const float* yd, float* out, size_t ors, size_t ots) {
  __m256 acc[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < nb; ++i) {
    __m256 dy[NT];
    for (int t = 0; t < NT; ++t) dy[t] = _mm256_broadcast_ss(yd + t * nb + i);
    for (int r = 0; r < NR; ++r) {
      const __m256i u = _mm256_load_si256(wq + i * nr + r);
      const __m256 dx = _mm256_broadcast_ss(wd + i * nr + r);
      for (int t = 0; t < NT; ++t) {
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_load_si256(yq + t * nb + i)), ones);
        const __m256i q = _mm256_sub_epi32(p, _mm256_load_si256(yb + t * nb + i));
        acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy[t]), _mm256_cvtepi32_ps(q), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) out[r * ors + t * ots] = hsum(acc[r][t]);
  }
}

// Fewer tokens than this per call run on LegacySymmetric: preparing the rows
// would cost more than it saves.
constexpr int kUnpackMinTokens = 4;
// What matmul hands one call: the rows' unpacked blocks and the tokens' prepared
// blocks stay in L2, a register tile's in L1.
constexpr int kUnpackTileRows = 16;
constexpr int kUnpackTileTokens = 64;

template <class Format>
void gemm_unpacked_symmetric(int64_t n, const void* va, size_t as, int nr, const void* vb, size_t bs, int nt,
                             float* out, size_t ors, size_t ots) {
  if (nt < kUnpackMinTokens) {
    gemm_tile<SymmetricKernel<Format>>(n, va, as, nr, vb, bs, nt, out, ors, ots);
    return;
  }
  using Block = typename Format::Block;
  const uint8_t* a = static_cast<const uint8_t*>(va);
  const uint8_t* b = static_cast<const uint8_t*>(vb);
  const int64_t nb = n / kQK;
  UnpackedScratch& s = unpacked_scratch();
  const size_t wn = static_cast<size_t>(nb) * nr, yn = static_cast<size_t>(nb) * nt;
  if (s.wq.size() < wn) s.wq.resize(wn), s.wd.resize(wn);
  if (s.yq.size() < yn) s.yq.resize(yn), s.yb.resize(yn), s.yd.resize(yn);
  for (int r = 0; r < nr; ++r) {
    for (int64_t i = 0; i < nb; ++i) {
      const Block& x = block_at<Block>(a + r * as, i);
      s.wq[i * nr + r].v = Format::unpack(x);
      s.wd[i * nr + r] = fp16(x.d);
    }
  }
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(Format::kBias));
  const __m256i ones = _mm256_set1_epi16(1);
  for (int t = 0; t < nt; ++t) {
    for (int64_t i = 0; i < nb; ++i) {
      const BlockQ8_0& y = block_at<BlockQ8_0>(b + t * bs, i);
      const __m256i yq = load256(y.qs);
      s.yq[t * nb + i].v = yq;
      s.yb[t * nb + i].v = _mm256_madd_epi16(_mm256_maddubs_epi16(bias, yq), ones);
      s.yd[t * nb + i] = fp16(y.d);
    }
  }
  auto tile = [&]<int NR, int NT>(int r, int t) {
    unpacked_symmetric_tile<NR, NT>(nb, nr, &s.wq[0].v + r, s.wd.data() + r, &s.yq[0].v + t * nb, &s.yb[0].v + t * nb,
                                    s.yd.data() + t * nb, out + r * ors + t * ots, ors, ots);
  };
  // Register tiles of kR rows x kT tokens (AVX2's 16 registers: kR * kT
  // accumulators), the edges in smaller ones.
  constexpr int kR = 4, kT = 2;
  int r = 0;
  for (; r + kR <= nr; r += kR) {
    int t = 0;
    for (; t + kT <= nt; t += kT) tile.template operator()<kR, kT>(r, t);
    for (; t < nt; ++t) tile.template operator()<kR, 1>(r, t);
  }
  for (; r < nr; ++r) {
    int t = 0;
    for (; t + kT <= nt; t += kT) tile.template operator()<1, kT>(r, t);
    for (; t < nt; ++t) tile.template operator()<1, 1>(r, t);
  }
}

// ---- activation quantizers (bit-exact with the scalar reference) ---------------

inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// roundf (half away from zero) of values well inside int range.
inline __m256i round_away(__m256 v) {
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 frac = abs_ps(_mm256_sub_ps(v, t));  // exact
  const __m256 up = _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ),
                                  _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(1.0f)));
  return _mm256_cvttps_epi32(_mm256_add_ps(t, up));
}

// Four int32x8 (values within int8 range) -> 32 int8 in order.
inline __m256i pack_4x8(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Quantizes one block of 32 to int8 with scale d = amax/127; returns d and
// writes the int32 sum of the quants to *sum. Q8_0 rounds x * (1 / d) half
// away from zero, as the reference quantizer; Q8_1 is only ever an activation
// format and rounds x * (127 / amax) to nearest even, as GGML's CPU backend
// quantizes it (quants_ref.cpp quantize_q8_1 says why).
template <bool kQ8_1>
inline float quantize_block32(const float* x, int8_t* qs, int* sum) {
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(x + 8 * k), amax = _mm256_max_ps(amax, abs_ps(v[k]));
  const float max = hmax(amax);
  const float d = max / 127;
  const float id = kQ8_1 ? (max != 0.0f ? 127.0f / max : 0.0f) : (d != 0.0f ? 1.0f / d : 0.0f);
  const __m256 vid = _mm256_set1_ps(id);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) {
    const __m256 scaled = _mm256_mul_ps(v[k], vid);
    q[k] = kQ8_1 ? _mm256_cvtps_epi32(scaled) : round_away(scaled);  // cvtps: MXCSR, nearest even
  }
  *sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), pack_4x8(q[0], q[1], q[2], q[3]));
  return d;
}

template <bool kCpu>
void quantize_row_q8_0(const float* x, void* dst, int64_t n) {
  BlockQ8_0* y = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i) {
    int sum;
    y[i].d = to_fp16(quantize_block32<kCpu>(x + i * kQK, y[i].qs, &sum));
  }
}

void quantize_row_q8_1(const float* x, void* dst, int64_t n) {
  BlockQ8_1* y = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / kQK; ++i) {
    int sum;
    const float d = quantize_block32<true>(x + i * kQK, y[i].qs, &sum);
    y[i].d = to_fp16(d);
    y[i].s = to_fp16(static_cast<float>(sum) * d);
  }
}

// The same blocks written as packed activations want them (PackedQuantizeFn).
void quantize_packed_q8_1(const float* x, int64_t n_blocks, int8_t* qs, float* d, float* s, int32_t* sum) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    int total;
    const float di = quantize_block32<true>(x + i * kQK, qs + i * kQK, &total);
    d[i] = _cvtsh_ss(to_fp16(di));
    s[i] = _cvtsh_ss(to_fp16(static_cast<float>(total) * di));
    sum[i] = total;
  }
}

template <bool kPositiveWins>
void quantize_row_q8_k(const float* src, void* dst, int64_t n) {
  BlockQ8_K* y = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float* x = src + i * kQK_K;
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < kQK_K; k += 8) amax = _mm256_max_ps(amax, abs_ps(_mm256_loadu_ps(x + k)));
    const float am = hmax(amax);
    if (!(am > 0.0f)) {
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    // The reference scales by the first element of largest magnitude (its sign
    // matters); the 4-row variant by +am whenever it occurs.
    float max = 0.0f;
    const __m256 vam = _mm256_set1_ps(am);
    bool positive = false;
    if (kPositiveWins) {
      for (int k = 0; k < kQK_K && !positive; k += 8) {
        positive = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + k), vam, _CMP_EQ_OQ)) != 0;
      }
    }
    for (int k = 0; k < kQK_K; k += 8) {
      const int mask = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + k)), vam, _CMP_EQ_OQ));
      if (mask != 0) {
        max = x[k + __builtin_ctz(static_cast<unsigned>(mask))];
        break;
      }
    }
    if (positive) max = am;
    const float iscale = -127.f / max;
    const __m256 vs = _mm256_set1_ps(iscale);
    for (int k = 0; k < kQK_K; k += 32) {
      __m256i q[4];
      for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + k + 8 * j)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + k), pack_4x8(q[0], q[1], q[2], q[3]));
    }
    for (int g = 0; g < kQK_K / 16; ++g) {
      // Sum of 16 int8: widen to int16 pairs, then to int32.
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(y[i].qs + 16 * g));
      const __m256i w = _mm256_cvtepi8_epi16(v);
      const __m256i s32 = _mm256_madd_epi16(w, _mm256_set1_epi16(1));
      y[i].bsums[g] = static_cast<int16_t>(hsum_epi32(s32));
    }
    y[i].d = 1 / iscale;
  }
}

void quantize_row_f16(const float* x, void* dst, int64_t n) {
  uint16_t* y = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) y[i] = to_fp16(x[i]);
}

// Preferred tiles: AVX-512 has 32 vector registers, AVX2 16, and each
// (row, token) pair keeps one accumulator (two for Q4_1/Q5_1) in them.
template <class K>
void set_dot(KernelTable& table, DType t, int gemv_rows, int tile_rows, int tile_tokens) {
  TypeKernels& k = table.type[static_cast<uint32_t>(t)];
  k.vec_dot = vec_dot_one<K>;
  k.gemm_tile = gemm_tile<K>;
  k.gemv_rows = gemv_rows;
  k.tile_rows = tile_rows;
  k.tile_tokens = tile_tokens;
}

void fill_x86(KernelTable& table) {
  // Decode streams one weight row at a time: interleaving several rows' reads
  // measured 2-3x slower from DRAM than reading them one after the other.
  const bool wide = INFERD_X86_AVX512 != 0;
  set_dot<KQ4_0>(table, DType::Q4_0, 1, wide ? 4 : 2, wide ? 4 : 2);
  set_dot<KQ5_0>(table, DType::Q5_0, 1, wide ? 4 : 2, wide ? 4 : 2);
  if (!wide) {
    // Prefill: rows unpacked once per call for many tokens (gemm_unpacked_symmetric).
    for (DType t : {DType::Q4_0, DType::Q5_0}) {
      TypeKernels& k = table.type[static_cast<uint32_t>(t)];
      k.gemm_tile = t == DType::Q4_0 ? gemm_unpacked_symmetric<FormatQ4_0> : gemm_unpacked_symmetric<FormatQ5_0>;
      k.tile_rows = kUnpackTileRows;
      k.tile_tokens = kUnpackTileTokens;
    }
  }
  set_dot<KQ8_0>(table, DType::Q8_0, 1, wide ? 4 : 2, wide ? 4 : 2);
  set_dot<KQ4_1>(table, DType::Q4_1, 1, 2, wide ? 4 : 2);
  set_dot<KQ5_1>(table, DType::Q5_1, 1, 2, wide ? 4 : 2);
  set_dot<RowByRow<KQ2_K>>(table, DType::Q2_K, 1, 1, 4);
  set_dot<RowByRow<KQ3_K>>(table, DType::Q3_K, 1, 1, 4);
  set_dot<RowByRow<KQ4_K>>(table, DType::Q4_K, 1, 1, 4);
  set_dot<RowByRow<KQ5_K>>(table, DType::Q5_K, 1, 1, 4);
  set_dot<RowByRow<KQ6_K>>(table, DType::Q6_K, 1, 1, 4);
  set_dot<RowByRow<KF16>>(table, DType::F16, 1, 1, 4);
  set_dot<RowByRow<KF32>>(table, DType::F32, 1, 1, 4);
  set_dot<RowByRow<KBF16>>(table, DType::BF16, 1, 1, 4);
  table.type[static_cast<uint32_t>(DType::Q8_0)].quantize_row = quantize_row_q8_0<false>;
  // GGML's CPU quantize_row_q8_0 (what it runs on activations): the Q8_1
  // arithmetic, 127/amax and ties to even.
  table.quantize_q8_0_cpu = quantize_row_q8_0<true>;
  table.type[static_cast<uint32_t>(DType::Q8_1)].quantize_row = quantize_row_q8_1;
  table.packed_quantize = quantize_packed_q8_1;
  table.type[static_cast<uint32_t>(DType::Q8_K)].quantize_row = quantize_row_q8_k<false>;
  table.quantize_q8_k_x4 = quantize_row_q8_k<true>;
  // GGML's other orders for the K-quants (kernel_table.h).
  auto at = [&](DType t) -> TypeKernels& { return table.type[static_cast<uint32_t>(t)]; };
  at(DType::Q2_K).tiled_tile = gemm_tile<RowByRow<KOrdered<KQ2_K, kTiledOrder>>>;
  at(DType::Q3_K).tiled_tile = gemm_tile<RowByRow<KOrdered<KQ3_K, kTiledOrder>>>;
  at(DType::Q4_K).tiled_tile = gemm_tile<RowByRow<KOrdered<KQ4_K, kTiledOrder>>>;
  at(DType::Q5_K).tiled_tile = gemm_tile<RowByRow<KOrdered<KQ5_K, kTiledOrder>>>;
  at(DType::Q6_K).tiled_tile = gemm_tile<RowByRow<KOrdered<KQ6_K, kTiledOrder>>>;
  at(DType::Q4_K).repack_tile = gemm_tile<RowByRow<KOrdered<KQ4_K, kRepackOrder>>>;
  at(DType::Q4_K).repack_gemm_tile = gemm_tile<RowByRow<KOrdered<KQ4_K, kRepackGemmOrder>>>;
  table.type[static_cast<uint32_t>(DType::F16)].quantize_row = quantize_row_f16;
  // tinyBLAS on float weights: calls of 4 rows x 3 tokens, its register block.
  at(DType::F32).tinyblas_tile = tinyblas_tile<ElemF32>;
  at(DType::F16).tinyblas_tile = tinyblas_tile<ElemF16>;
  at(DType::BF16).tinyblas_tile = tinyblas_tile<ElemBF16>;
  for (DType t : {DType::F32, DType::F16, DType::BF16}) at(t).tile_rows = 4, at(t).tile_tokens = 3;
}

#undef INFERD_TILE_ARGS
#undef INFERD_TILE_PASS
