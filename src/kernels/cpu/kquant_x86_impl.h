// Faster x86 kernels for GGML's orders on K-quants, Q4_0, Q5_0 and Q8_0 (internal;
// textually included by quants_avx2.cpp and quants_avx512.cpp after
// quants_x86_impl.h, whose helpers it uses; fill_x86_kquant at the end puts
// them in the table).
//
// Same bits as the kernels they replace: in each of these orders GGML sums a
// (row, token) pair's integer products per block exactly (int32, no overflow
// for these formats) and then runs a fixed scalar sequence of float steps on
// those integers. The integers may be formed in any order; only the float
// steps must be the same. So the K-quant kernels form the integer sums of
// eight rows at once and put one row in each float lane, where the scalar
// sequence runs unchanged; the vec_dot kernels keep GGML's lanes and do less
// work per block around them.

// ---- GGML's repacked Q4_K gemv order (dot_q4_k_x8), eight rows at a time ------
// Per (row, token) and super-block: a = fma(float(isum), d * dy, a) and
// m = fma(float(msum), dmin * dy, m), the result a - m. Eight rows' isum and
// msum are reduced into the eight lanes of a vector (lane r: row r), so a
// super-block of eight rows costs two fmas and no horizontal sum per row.

// pshufb mask: byte k of each 128-bit lane into the low byte of every int16
// lane, high byte zero (index 0x80): 16 int16 copies of an unsigned byte.
inline __m256i bcast_byte_mask(int k) { return _mm256_set1_epi16(static_cast<int16_t>(0x8000 | k)); }

// Four bytes at p in every 32-bit lane.
inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

#if INFERD_X86_AVX512
inline __m512i join256(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// The int32 sums of sub-blocks j0 and j0 + 1 (kSteps dpbusd steps of four
// quants each, the two interleaved) of NG unpacked weight units by NT tokens:
// step s of sub-block j is w[g][kSteps * j + s] against the token's four
// quants at 4 * (kSteps * j + s).
template <int kSteps, int NG, int NT>
inline void dpbusd_subblock_pair(const __m512i* const* w, const BlockQ8_K* const* y, int j0,
                                 __m512i (&sum)[2][NG][NT]) {
  for (int h = 0; h < 2; ++h) {
    for (int g = 0; g < NG; ++g) {
      for (int t = 0; t < NT; ++t) sum[h][g][t] = _mm512_setzero_si512();
    }
  }
  for (int st = 0; st < kSteps; ++st) {
    for (int h = 0; h < 2; ++h) {
      const int step = kSteps * (j0 + h) + st;
      __m512i yb[NT];
      for (int t = 0; t < NT; ++t) {
        int32_t v;
        std::memcpy(&v, y[t]->qs + 4 * step, 4);
        yb[t] = _mm512_set1_epi32(v);
      }
      for (int g = 0; g < NG; ++g) {
        const __m512i wv = _mm512_load_si512(w[g] + step);
        for (int t = 0; t < NT; ++t) sum[h][g][t] = _mm512_dpbusd_epi32(sum[h][g][t], wv, yb[t]);
      }
    }
  }
}
#endif

// f.operator()<N>() for a count n in 1..kMax known only at run time.
template <int kMax, class F>
inline void with_count(int n, F&& f) {
  if constexpr (kMax > 1) {
    if (n < kMax) return with_count<kMax - 1>(n, f);
  }
  f.template operator()<kMax>();
}

// The 8 int32 sums of v[0..7] (eight lanes each) as one vector, lane r = sum of v[r].
struct RowReduce8 {
  // Fed rows 0..7 in order; result() after the 8th.
  __m256i h01, h0123, h45, p_even;
  template <int R>
  void add(__m256i p) {
    if constexpr (R % 2 == 0) {
      p_even = p;
    } else if constexpr (R == 1) {
      h01 = _mm256_hadd_epi32(p_even, p);
    } else if constexpr (R == 3) {
      h0123 = _mm256_hadd_epi32(h01, _mm256_hadd_epi32(p_even, p));
    } else if constexpr (R == 5) {
      h45 = _mm256_hadd_epi32(p_even, p);
    } else {
      const __m256i h4567 = _mm256_hadd_epi32(h45, _mm256_hadd_epi32(p_even, p));
      // h0123: [r0..r3 of lanes 0-3 | r0..r3 of lanes 4-7], h4567 likewise.
      h01 = _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                             _mm256_permute2x128_si256(h0123, h4567, 0x31));
    }
  }
  __m256i result() const { return h01; }
};

// row.operator()<R>() for R = 0..7, in order (RowReduce8 wants them so).
template <class Row>
inline void for_rows8(Row&& row) {
  [&]<int... R>(std::integer_sequence<int, R...>) { (row.template operator()<R>(), ...); }(
      std::make_integer_sequence<int, 8>{});
}

// Lane r of v (row r's result) to out[r * ors].
inline void store_rows8(__m256 v, float* out, size_t ors) {
  alignas(32) float res[8];
  _mm256_store_ps(res, v);
  for (int r = 0; r < 8; ++r) out[r * ors] = res[r];
}

// A GemmTileFn's walk for the eight-row kernels: eight(NT, r, t) on rows
// r..r+7 and NT (std::integral_constant 1 or 2) tokens from t, two tokens per
// pass; the last nr % 8 rows by rest(r) from row r on.
template <class Eight, class Rest>
inline void by_eight_rows(int nr, int nt, Eight&& eight, Rest&& rest) {
  int r = 0;
  for (; r + 8 <= nr; r += 8) {
    int t = 0;
    for (; t + 2 <= nt; t += 2) eight(std::integral_constant<int, 2>{}, r, t);
    if (t < nt) eight(std::integral_constant<int, 1>{}, r, t);
  }
  if (r < nr) rest(r);
}

// Fields shared by eight Q4_K rows' super-block i: d and dmin as float lanes.
inline void q4k_d_dmin8(const uint8_t* a, size_t as, int64_t i, __m256* d, __m256* dmin) {
  uint32_t w[8];
  for (int r = 0; r < 8; ++r) std::memcpy(&w[r], a + r * as + i * sizeof(BlockQ4_K), 4);
  const __m256i dd = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i split = _mm256_shuffle_epi8(
      dd, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,  //
                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
  const __m256i ordered = _mm256_permute4x64_epi64(split, _MM_SHUFFLE(3, 1, 2, 0));  // d0-7 | dmin0-7
  *d = _mm256_cvtph_ps(_mm256_castsi256_si128(ordered));
  *dmin = _mm256_cvtph_ps(_mm256_extracti128_si256(ordered, 1));
}

// Q8_K's bsums summed in pairs (one per 32 elements), twice: [s0..s7 | s0..s7] as int16.
inline __m256i q8k_pair_sums2(const BlockQ8_K& y) {
  const __m256i b = load256(y.bsums);
  return _mm256_permute4x64_epi64(_mm256_hadd_epi16(b, b), _MM_SHUFFLE(2, 0, 2, 0));
}

// Rows a .. a + 7 * as against NT (1 or 2) tokens.
template <int NT>
void q4k_repack_gemv8(int64_t n, const uint8_t* a, size_t as, const uint8_t* b, size_t bs, float* out, size_t ors,
                      size_t ots) {
  const int64_t nb = n / kQK_K;
  const BlockQ8_K* yr[NT];
  __m256 acc[NT], accm[NT];
  for (int t = 0; t < NT; ++t) yr[t] = yrow<BlockQ8_K>(b, bs, t), acc[t] = accm[t] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int64_t i = 0; i < nb; ++i) {
    __m256i ysum[NT];
    for (int t = 0; t < NT; ++t) ysum[t] = q8k_pair_sums2(yr[t][i]);
    RowReduce8 isum[NT];
    __m256i mpair[NT][4];
    uint64_t prev_mins = 0;
    auto row = [&]<int R>() {
      const BlockQ4_K& x = block_at<BlockQ4_K>(a + R * as, i);
      uint64_t scales, mins;
      k4_unpack_scales(x.scales, &scales, &mins);
      const __m256i sv = _mm256_broadcastq_epi64(_mm_cvtsi64_si128(static_cast<long long>(scales)));
      __m256i p[NT];
      for (int t = 0; t < NT; ++t) p[t] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i v = load256(x.qs + 32 * c);
        const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        const __m256i sl = _mm256_shuffle_epi8(sv, bcast_byte_mask(2 * c));
        const __m256i sh = _mm256_shuffle_epi8(sv, bcast_byte_mask(2 * c + 1));
        for (int t = 0; t < NT; ++t) {
          const int8_t* q = yr[t][i].qs + 64 * c;
          p[t] = _mm256_add_epi32(p[t], _mm256_add_epi32(dot_u8s8_scaled(lo, load256(q), sl),
                                                         dot_u8s8_scaled(hi, load256(q + 32), sh)));
        }
      }
      for (int t = 0; t < NT; ++t) isum[t].template add<R>(p[t]);
      // Mins of this row and the next as int16 (rows R, R+1), times the pair sums.
      if constexpr (R % 2 == 0) {
        prev_mins = mins;
      } else {
        const __m256i m16 = _mm256_cvtepu8_epi16(_mm_set_epi64x(static_cast<long long>(mins), static_cast<long long>(prev_mins)));
        for (int t = 0; t < NT; ++t) mpair[t][R / 2] = _mm256_madd_epi16(m16, ysum[t]);
      }
    };
    for_rows8(row);
    __m256 d, dmin;
    q4k_d_dmin8(a, as, i, &d, &dmin);
    for (int t = 0; t < NT; ++t) {
      // mpair[t][k]: rows 2k (lanes 0-3) and 2k+1 (lanes 4-7) -> [r0 r2 r4 r6 | r1 r3 r5 r7] -> in order.
      const __m256i m = _mm256_hadd_epi32(_mm256_hadd_epi32(mpair[t][0], mpair[t][1]),
                                          _mm256_hadd_epi32(mpair[t][2], mpair[t][3]));
      const __m256i msum = _mm256_permutevar8x32_epi32(m, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      const __m256 dy = _mm256_set1_ps(yr[t][i].d);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t].result()), _mm256_mul_ps(d, dy), acc[t]);
      accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, dy), accm[t]);
    }
  }
  for (int t = 0; t < NT; ++t) store_rows8(_mm256_sub_ps(acc[t], accm[t]), out + t * ots, ors);
}

// GemmTileFn for the repacked Q4_K gemv order: eight rows at a time, the rest
// (fewer than eight) by the row-by-row kernel.
void q4k_repack_gemv_tile(int64_t n, const void* va, size_t as, int nr, const void* vb, size_t bs, int nt, float* out,
                          size_t ors, size_t ots) {
  const uint8_t* a = static_cast<const uint8_t*>(va);
  const uint8_t* b = static_cast<const uint8_t*>(vb);
  by_eight_rows(
      nr, nt,
      [&](auto nt_pass, int r, int t) {
        q4k_repack_gemv8<decltype(nt_pass)::value>(n, a + r * as, as, b + t * bs, bs, out + r * ors + t * ots, ors, ots);
      },
      [&](int r) {
        gemm_tile<RowByRow<KOrdered<KQ4_K, kRepackOrder>>>(n, a + r * as, as, nr - r, vb, bs, nt, out + r * ors, ors, ots);
      });
}


// ---- Q4_0 in GGML's repacked order (dot_q4_0_x8) on GGML rows ------------------
// Per (row, token) one float chain, acc = fma(float(isum), dx * dy, acc) per
// block (ggml_gemv/gemm_q4_0_8x8_q8_0: the same steps in both). Eight rows at a
// time: the integer lanes of each row's block are reduced into one lane per
// row (RowReduce8, exact), so the chain runs for eight rows in one fma. Linear
// runs such weights packed (packed_ref.cpp, the same order); this is the GGML
// rows' kernel for matmul_rows_ggml.

// A Q4_0 block's quants minus 8 as signed bytes, in element order.
inline __m256i q4_0_signed(const BlockQ4_0& x) { return _mm256_sub_epi8(unpack_nibbles(x.qs), _mm256_set1_epi8(8)); }

// Products of signed bytes q and y, summed in fours: eight int32 lanes (exact).
inline __m256i dot_i8_quads(__m256i q, __m256i y) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y, q)),
                           _mm256_set1_epi16(1));
}

template <int NT>
void q4_0_repack8(int64_t n, const uint8_t* a, size_t as, const uint8_t* b, size_t bs, float* out, size_t ors,
                  size_t ots) {
  const int64_t nb = n / kQK;
  const BlockQ8_0* yr[NT];
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) yr[t] = yrow<BlockQ8_0>(b, bs, t), acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    __m256i yv[NT];
    for (int t = 0; t < NT; ++t) yv[t] = load256(yr[t][i].qs);
    RowReduce8 isum[NT];
    alignas(16) uint16_t d16[8];
    auto row = [&]<int R>() {
      const BlockQ4_0& x = block_at<BlockQ4_0>(a + R * as, i);
      d16[R] = x.d;
      const __m256i q = q4_0_signed(x);
      for (int t = 0; t < NT; ++t) isum[t].template add<R>(dot_i8_quads(q, yv[t]));
    };
    for_rows8(row);
    const __m256 dx = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d16)));
    for (int t = 0; t < NT; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t].result()), _mm256_mul_ps(dx, _mm256_set1_ps(fp16(yr[t][i].d))),
                               acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) store_rows8(acc[t], out + t * ots, ors);
}

// One row against one token, the same steps.
inline float q4_0_repack_one(int64_t n, const uint8_t* a, const uint8_t* b) {
  const BlockQ4_0* x = reinterpret_cast<const BlockQ4_0*>(a);
  const BlockQ8_0* y = reinterpret_cast<const BlockQ8_0*>(b);
  float acc = 0.0f;
  for (int64_t i = 0; i < n / kQK; ++i) {
    const int32_t isum = hsum_epi32(dot_i8_quads(q4_0_signed(x[i]), load256(y[i].qs)));
    acc = std::fma(static_cast<float>(isum), fp16(x[i].d) * fp16(y[i].d), acc);
  }
  return acc;
}

// GemmTileFn for that order: eight rows at a time (two tokens per pass), the
// rest (fewer than eight rows) one pair at a time.
void q4_0_repack_tile(int64_t n, const void* va, size_t as, int nr, const void* vb, size_t bs, int nt, float* out,
                      size_t ors, size_t ots) {
  const uint8_t* a = static_cast<const uint8_t*>(va);
  const uint8_t* b = static_cast<const uint8_t*>(vb);
  by_eight_rows(
      nr, nt,
      [&](auto nt_pass, int r, int t) {
        q4_0_repack8<decltype(nt_pass)::value>(n, a + r * as, as, b + t * bs, bs, out + r * ors + t * ots, ors, ots);
      },
      [&](int r0) {
        for (int r = r0; r < nr; ++r)
          for (int t = 0; t < nt; ++t) out[r * ors + t * ots] = q4_0_repack_one(n, a + r * as, b + t * bs);
      });
}

// ---- Q6_K in GGML's vec_dot order (ggml_vec_dot_q6_K_q8_K, AVX2) ----------------
// The order of KQ6_K's vec_dot (eight int32 lanes per row and token, one fma
// with d * dy per super-block, hsum at the end), for decode: a call takes
// several rows one after the other (the rows' bytes are contiguous, read in
// order, prefetched ahead) and up to four tokens, each row unpacked once for
// them; the sixteen scales are widened once and picked by one shuffle each.

// Q6_K's signed scales: sc[k] = scale 2k in int16 lanes 0-7, 2k+1 in 8-15;
// offset = 32 * scale g in int16 lane g (the quants are stored + 32).
inline void q6k_scales(const int8_t* scales, __m256i* sc, __m256i* offset) {
  const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
  const __m128i even_odd =
      _mm_shuffle_epi8(s8, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  const __m256i t = _mm256_cvtepi8_epi16(even_odd);  // low half: even scales, high half: odd
  for (int k = 0; k < 8; ++k) sc[k] = _mm256_shuffle_epi8(t, _mm256_set1_epi16(static_cast<int16_t>(((2 * k + 1) << 8) | (2 * k))));
  *offset = _mm256_slli_epi16(_mm256_cvtepi8_epi16(s8), 5);
}

template <int NT>
inline void q6k_vec_dot_row(int64_t nb, const BlockQ6_K* x, const uint8_t* b, size_t bs, float* out, size_t ots) {
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(x + i);
    prefetch_weights_ahead(p, sizeof(BlockQ6_K));
    __m256i q[8], sc[8], offset;
    q6k_unpack(x[i], q);
    q6k_scales(x[i].scales, sc, &offset);
    const float dx = fp16(x[i].d);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& y = yrow<BlockQ8_K>(b, bs, t)[i];
      const __m256i p32 = _mm256_sub_epi32(superblock_isum(q, sc, y), _mm256_madd_epi16(load256(y.bsums), offset));
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dx * y.d), _mm256_cvtepi32_ps(p32), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t * ots] = hsum(acc[t]);
}

#if INFERD_X86_AVX512

// The same order with chunks 2m and 2m+1 (64 quants) in one zmm: a maddubs and
// a madd give both chunks' eight lanes, and the upper chunk's lanes are added
// to the lower's at the end of the super-block (integers: exact), leaving
// GGML's eight int32 lanes; half the integer instructions of the AVX2 kernel.
inline void q6k_unpack512(const BlockQ6_K& x, __m512i* q) {  // q[m]: chunk 2m low, 2m + 1 high
  const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(0x30);
  const __m512i shl = join256(_mm256_set1_epi16(4), _mm256_set1_epi16(2));
  const __m512i shr = join256(_mm256_set1_epi16(0), _mm256_set1_epi16(2));
  constexpr int kAndOr = 0xea;  // ternary logic (a & b) | c
  for (int h = 0; h < 2; ++h) {
    const __m512i l = _mm512_loadu_si512(x.ql + 64 * h);  // l0 | l1
    const __m512i qh = _mm512_broadcast_i64x4(load256(x.qh + 32 * h));
    q[2 * h] = _mm512_ternarylogic_epi32(_mm512_sllv_epi16(qh, shl), m3, _mm512_and_si512(l, m4), kAndOr);
    q[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srlv_epi16(qh, shr), m3,
                                             _mm512_and_si512(_mm512_srli_epi16(l, 4), m4), kAndOr);
  }
}

// Q6_K's signed scales for q6k_unpack512's chunk pairs: sc[m] holds scale 4m
// in int16 lanes 0-7, 4m + 1 in 8-15, 4m + 2 in 16-23, 4m + 3 in 24-31 (one
// permute each); offset as q6k_scales gives it.
inline void q6k_scales512(const int8_t* scales, __m512i* sc, __m256i* offset) {
  alignas(64) static constexpr int16_t kIndex[4][32] = {
      {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
      {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
      {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
      {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13,
       14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};
  const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
  const __m512i s = _mm512_castsi256_si512(s16);
  for (int m = 0; m < 4; ++m) sc[m] = _mm512_permutexvar_epi16(_mm512_load_si512(kIndex[m]), s);
  *offset = _mm256_slli_epi16(s16, 5);
}

template <int NT>
inline void q6k_vec_dot_row512(int64_t nb, const BlockQ6_K* x, const uint8_t* b, size_t bs, float* out,
                               size_t ots) {
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(x + i);
    prefetch_weights_ahead(p, sizeof(BlockQ6_K));
    __m512i q[4], sc[4];
    __m256i offset;
    q6k_unpack512(x[i], q);
    q6k_scales512(x[i].scales, sc, &offset);
    const float dx = fp16(x[i].d);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8_K& y = yrow<BlockQ8_K>(b, bs, t)[i];
      __m512i p512 = _mm512_madd_epi16(_mm512_maddubs_epi16(q[0], _mm512_loadu_si512(y.qs)), sc[0]);
      for (int m = 1; m < 4; ++m) {
        p512 = _mm512_add_epi32(
            p512, _mm512_madd_epi16(_mm512_maddubs_epi16(q[m], _mm512_loadu_si512(y.qs + 64 * m)), sc[m]));
      }
      const __m256i p = _mm256_add_epi32(_mm512_castsi512_si256(p512), _mm512_extracti64x4_epi64(p512, 1));
      const __m256i p32 = _mm256_sub_epi32(p, _mm256_madd_epi16(load256(y.bsums), offset));
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dx * y.d), _mm256_cvtepi32_ps(p32), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) out[t * ots] = hsum(acc[t]);
}


// One token against NR rows x[0..NR) together, each row's arithmetic
// q6k_vec_dot_row512<1>'s: a decode step's matrix-vector product, where a
// single row's chain of dependent steps per super-block (unpack, two
// multiplies, the sums, the conversion, the fma) left the core waiting;
// independent rows interleaved keep it busy.
template <int NR>
inline void q6k_vec_dot_rows512(int64_t nb, const BlockQ6_K* const* x, const uint8_t* b, float* out, size_t ors) {
  __m256 acc[NR];
  for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
  const BlockQ8_K* y = reinterpret_cast<const BlockQ8_K*>(b);
  // Rows one after another in memory (a matrix's rows) are read as one
  // stream: the NR rows' super-blocks i lie NR * as apart at most, so a lead
  // per row would leave the last row's bytes only lead - (NR - 1) * as ahead.
  // Prefetch the span the rows cover linearly instead, NR blocks a step, with
  // the lead measured past the last row.
  bool contiguous = true;
  for (int r = 1; r < NR; ++r) contiguous = contiguous && x[r] == x[r - 1] + nb;
  const char* span = reinterpret_cast<const char*>(x[0]) + (NR - 1) * nb * sizeof(BlockQ6_K);
  for (int64_t i = 0; i < nb; ++i) {
    if (contiguous) prefetch_weights_ahead(span + NR * i * sizeof(BlockQ6_K), NR * sizeof(BlockQ6_K));
    for (int r = 0; r < NR; ++r) {
      if (!contiguous) prefetch_weights_ahead(x[r] + i, sizeof(BlockQ6_K));
      __m512i q[4], sc[4];
      __m256i offset;
      q6k_unpack512(x[r][i], q);
      q6k_scales512(x[r][i].scales, sc, &offset);
      __m512i p512 = _mm512_madd_epi16(_mm512_maddubs_epi16(q[0], _mm512_loadu_si512(y[i].qs)), sc[0]);
      for (int m = 1; m < 4; ++m) {
        p512 = _mm512_add_epi32(
            p512, _mm512_madd_epi16(_mm512_maddubs_epi16(q[m], _mm512_loadu_si512(y[i].qs + 64 * m)), sc[m]));
      }
      const __m256i p = _mm256_add_epi32(_mm512_castsi512_si256(p512), _mm512_extracti64x4_epi64(p512, 1));
      const __m256i p32 = _mm256_sub_epi32(p, _mm256_madd_epi16(load256(y[i].bsums), offset));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(fp16(x[r][i].d) * y[i].d), _mm256_cvtepi32_ps(p32), acc[r]);
    }
  }
  for (int r = 0; r < NR; ++r) out[r * ors] = hsum(acc[r]);
}

#endif

void q6k_vec_dot_tile(int64_t n, const void* va, size_t as, int nr, const void* vb, size_t bs, int nt, float* out,
                      size_t ors, size_t ots) {
  const uint8_t* a = static_cast<const uint8_t*>(va);
  const uint8_t* b = static_cast<const uint8_t*>(vb);
  const int64_t nb = n / kQK_K;
  // Each row unpacked once for up to eight tokens (AVX-512) or four.
  constexpr int kMaxTokens = INFERD_X86_AVX512 ? 8 : 4;
  int r = 0;
#if INFERD_X86_AVX512
  if (nt == 1) {
    constexpr int kRows = 2;  // 15% faster than one row from L2; three or four rows spill registers
    for (; r + kRows <= nr; r += kRows) {
      const BlockQ6_K* x[kRows];
      for (int k = 0; k < kRows; ++k) x[k] = reinterpret_cast<const BlockQ6_K*>(a + (r + k) * as);
      q6k_vec_dot_rows512<kRows>(nb, x, b, out + r * ors, ors);
    }
  }
#endif
  for (; r < nr; ++r) {
    const BlockQ6_K* x = reinterpret_cast<const BlockQ6_K*>(a + r * as);
    for (int t = 0; t < nt; t += kMaxTokens) {
      const uint8_t* bt = b + t * bs;
      float* o = out + r * ors + t * ots;
      with_count<kMaxTokens>(std::min(kMaxTokens, nt - t), [&]<int NT>() {
#if INFERD_X86_AVX512
        q6k_vec_dot_row512<NT>(nb, x, bt, bs, o, ots);
#else
        q6k_vec_dot_row<NT>(nb, x, bt, bs, o, ots);
#endif
      });
    }
  }
}

float q6k_vec_dot_one(int64_t n, const void* a, const void* b) {
  float out;
  q6k_vec_dot_row<1>(n / kQK_K, static_cast<const BlockQ6_K*>(a), static_cast<const uint8_t*>(b), 0, &out, 0);
  return out;
}

// ---- Q6_K in GGML's tiled order (dot_k_tiled: chunks of 8 tokens or more) -------
// Per (row, token) and super-block: r = d * float(isum), acc = fma(r, dy, acc).
// Eight rows at a time, one per float lane: a call unpacks each 8-row group's
// super-block once (quants 0..63 as bytes, rows interleaved four at a time by
// an 8 x 8 transpose of 32-bit lanes; scales widened and transposed the same
// way) and runs every token of the call on it, two groups by two tokens. A
// 16-element sub-block is four 4-byte steps: maddubs of the rows' quants by
// the token's four bytes, two steps summed in int16 (at most 2 x 2 x 63 x 127
// = 32004 in magnitude: exact), madd by the scale pair; the quants' +32 is
// taken off as 32 * sum(scale_g * bsum_g), a madd of scale pairs by bsum
// pairs. The integers are exact, so each lane holds the reference's isum.

struct Q6KGroupBlock {
  __m256i w[64];      // vector 4g + s: sub-block g (16 elements), step s: 8 rows x 4 quants
  __m256i sc[16];     // lane r: row r's scale g as the int16 pair (s, s)
  __m256i scpair[8];  // lane r: row r's scales 2k, 2k+1 as an int16 pair
  __m256 d;
};

// Rows R[0..7] (8 dwords each) -> T[d] = dword d of every row, row r in lane r.
inline void transpose8x8_epi32(const __m256i* R, __m256i* T) {
  __m256i t[8], u[8];
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm256_unpacklo_epi32(R[2 * k], R[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_epi32(R[2 * k], R[2 * k + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3, 4-7
    const __m256i* th = t + 4 * h;
    u[4 * h + 0] = _mm256_unpacklo_epi64(th[0], th[2]);  // d0 | d4
    u[4 * h + 1] = _mm256_unpackhi_epi64(th[0], th[2]);  // d1 | d5
    u[4 * h + 2] = _mm256_unpacklo_epi64(th[1], th[3]);  // d2 | d6
    u[4 * h + 3] = _mm256_unpackhi_epi64(th[1], th[3]);  // d3 | d7
  }
  for (int d = 0; d < 4; ++d) {
    T[d] = _mm256_permute2x128_si256(u[d], u[4 + d], 0x20);
    T[d + 4] = _mm256_permute2x128_si256(u[d], u[4 + d], 0x31);
  }
}

// Eight GGML Q6_K rows' super-block i (rows a, a + as, ...) unpacked.
inline void q6k_unpack_group_block(const uint8_t* a, size_t as, int64_t i, Q6KGroupBlock& gb) {
  __m256i q[8][8];  // [row][32-element chunk]
  __m128i sc8[8];
  alignas(16) uint16_t d16[8];
  for (int r = 0; r < 8; ++r) {
    const BlockQ6_K& x = block_at<BlockQ6_K>(a + r * as, i);
    q6k_unpack(x, q[r]);
    sc8[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
    d16[r] = x.d;
  }
  for (int k = 0; k < 8; ++k) {
    const __m256i rows[8] = {q[0][k], q[1][k], q[2][k], q[3][k], q[4][k], q[5][k], q[6][k], q[7][k]};
    transpose8x8_epi32(rows, gb.w + 8 * k);  // chunk k = sub-blocks 2k, 2k+1, four steps each
  }
  // Scales: an 8 x 8 transpose of 16-bit pairs (scales 2k, 2k+1), then widened.
  __m128i b[8], c[8];
  for (int k = 0; k < 4; ++k) {
    b[2 * k] = _mm_unpacklo_epi16(sc8[2 * k], sc8[2 * k + 1]);
    b[2 * k + 1] = _mm_unpackhi_epi16(sc8[2 * k], sc8[2 * k + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    const __m128i* bh = b + 4 * h;
    c[4 * h + 0] = _mm_unpacklo_epi32(bh[0], bh[2]);  // pairs 0 | 1
    c[4 * h + 1] = _mm_unpackhi_epi32(bh[0], bh[2]);  // 2 | 3
    c[4 * h + 2] = _mm_unpacklo_epi32(bh[1], bh[3]);  // 4 | 5
    c[4 * h + 3] = _mm_unpackhi_epi32(bh[1], bh[3]);  // 6 | 7
  }
  const __m256i dup_lo = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,  //
                                          0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
  const __m256i dup_hi = _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15,  //
                                          2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
  for (int k = 0; k < 8; ++k) {
    // c[k / 2] (rows 0-3) and c[4 + k / 2] (rows 4-7) hold pairs k and k + 1 (k even).
    const int src = k / 2;
    const __m128i pairs = k % 2 == 0 ? _mm_unpacklo_epi64(c[src], c[4 + src]) : _mm_unpackhi_epi64(c[src], c[4 + src]);
    gb.scpair[k] = _mm256_cvtepi8_epi16(pairs);
    gb.sc[2 * k] = _mm256_shuffle_epi8(gb.scpair[k], dup_lo);
    gb.sc[2 * k + 1] = _mm256_shuffle_epi8(gb.scpair[k], dup_hi);
  }
  gb.d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d16)));
}

// NG groups' unpacked super-block against NT tokens' blocks: acc[g * NT + t] updated.
template <int NG, int NT>
inline void q6k_tiled_block(const Q6KGroupBlock* const* gb, const BlockQ8_K* const* y, __m256* acc) {
  __m256i p[NG][NT];
  for (int g = 0; g < NG; ++g) {
    for (int t = 0; t < NT; ++t) p[g][t] = _mm256_setzero_si256();
  }
#pragma GCC unroll 2
  for (int g16 = 0; g16 < 16; ++g16) {
    __m256i acc16[2][NG][NT];
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < 2; ++s) {
        const int st = 2 * h + s;
        __m256i yb[NT], wv[NG];
        for (int t = 0; t < NT; ++t) yb[t] = bcast4(y[t]->qs + 16 * g16 + 4 * st);
        for (int g = 0; g < NG; ++g) wv[g] = _mm256_load_si256(gb[g]->w + 4 * g16 + st);
        for (int g = 0; g < NG; ++g) {
          for (int t = 0; t < NT; ++t) {
            const __m256i prod = _mm256_maddubs_epi16(wv[g], yb[t]);
            acc16[h][g][t] = s == 0 ? prod : _mm256_add_epi16(acc16[h][g][t], prod);
          }
        }
      }
    }
    for (int g = 0; g < NG; ++g) {
      for (int t = 0; t < NT; ++t) {
        p[g][t] = _mm256_add_epi32(p[g][t], _mm256_add_epi32(_mm256_madd_epi16(acc16[0][g][t], gb[g]->sc[g16]),
                                                             _mm256_madd_epi16(acc16[1][g][t], gb[g]->sc[g16])));
      }
    }
  }
  for (int g = 0; g < NG; ++g) {
    for (int t = 0; t < NT; ++t) {
      // The stored quants' +32: 32 * sum over g of scale_g * bsum_g.
      __m256i off = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        int32_t pair;
        std::memcpy(&pair, y[t]->bsums + 2 * k, 4);
        off = _mm256_add_epi32(off, _mm256_madd_epi16(gb[g]->scpair[k], _mm256_set1_epi32(pair)));
      }
      const __m256i isum = _mm256_sub_epi32(p[g][t], _mm256_slli_epi32(off, 5));
      const __m256 r = _mm256_mul_ps(gb[g]->d, _mm256_cvtepi32_ps(isum));
      acc[g * NT + t] = _mm256_fmadd_ps(r, _mm256_set1_ps(y[t]->d), acc[g * NT + t]);
    }
  }
}

constexpr int kQ6KTiledMaxTokens = 64;  // tokens per pass over a group's unpacked super-blocks

#if INFERD_X86_AVX512

// The tiled order with VNNI on two unpacked groups side by side (16 rows per
// zmm): a sub-block's four steps are four dpbusd into an int32 per row, scaled
// by one mullo (the AVX2 kernel: four maddubs, two int16 adds, two madds).
// The integers are the same, and so are the float steps, per lane.
struct Q6KPairBlock {
  __m512i w[64];      // as Q6KGroupBlock::w, 16 rows
  __m512i sc[16];     // lane r: row r's scale g as an int32
  __m512i scpair[8];  // as Q6KGroupBlock::scpair
  __m512 d;
};

inline void q6k_join_pair(const Q6KGroupBlock& a, const Q6KGroupBlock& b, Q6KPairBlock& p) {
  for (int v = 0; v < 64; ++v) p.w[v] = join256(a.w[v], b.w[v]);
  for (int g = 0; g < 16; ++g) p.sc[g] = _mm512_srai_epi32(join256(a.sc[g], b.sc[g]), 16);  // (s, s) -> s
  for (int k = 0; k < 8; ++k) p.scpair[k] = join256(a.scpair[k], b.scpair[k]);
  p.d = _mm512_insertf32x8(_mm512_castps256_ps512(a.d), b.d, 1);
}

template <int NG, int NT>
inline void q6k_pair_tiled_block(const Q6KPairBlock* const* pb, const BlockQ8_K* const* y, __m512* acc) {
  __m512i p[NG][NT];
  for (int g = 0; g < NG; ++g) {
    for (int t = 0; t < NT; ++t) p[g][t] = _mm512_setzero_si512();
  }
  const __m512i* w[NG];
  for (int g = 0; g < NG; ++g) w[g] = pb[g]->w;
  for (int g16 = 0; g16 < 16; g16 += 2) {  // sub-blocks g16 and g16 + 1 (16 quants: four steps each)
    __m512i sum[2][NG][NT];
    dpbusd_subblock_pair<4>(w, y, g16, sum);
    for (int g = 0; g < NG; ++g) {
      for (int t = 0; t < NT; ++t) {
        p[g][t] = _mm512_add_epi32(p[g][t], _mm512_add_epi32(_mm512_mullo_epi32(sum[0][g][t], pb[g]->sc[g16]),
                                                             _mm512_mullo_epi32(sum[1][g][t], pb[g]->sc[g16 + 1])));
      }
    }
  }
  for (int g = 0; g < NG; ++g) {
    for (int t = 0; t < NT; ++t) {
      __m512i off = _mm512_setzero_si512();  // the stored quants' +32, as q6k_tiled_block
      for (int k = 0; k < 8; ++k) {
        int32_t pair;
        std::memcpy(&pair, y[t]->bsums + 2 * k, 4);
        off = _mm512_add_epi32(off, _mm512_madd_epi16(pb[g]->scpair[k], _mm512_set1_epi32(pair)));
      }
      const __m512i isum = _mm512_sub_epi32(p[g][t], _mm512_slli_epi32(off, 5));
      const __m512 r = _mm512_mul_ps(pb[g]->d, _mm512_cvtepi32_ps(isum));
      acc[g * NT + t] = _mm512_fmadd_ps(r, _mm512_set1_ps(y[t]->d), acc[g * NT + t]);
    }
  }
}

// Rows [0, 16 * n_pairs) of q6k_tiled_tile's call, 32 rows by two tokens at a time.
void q6k_tiled_pairs(int64_t n, const uint8_t* a, size_t as, int n_pairs, const uint8_t* b, size_t bs, int nt,
                     float* out, size_t ors, size_t ots, int tile_tokens) {
  const int64_t nb = n / kQK_K;
  thread_local std::vector<Q6KGroupBlock> groups(2);
  struct alignas(64) Pairs {
    Q6KPairBlock p[2];
  };
  thread_local std::vector<Pairs> pairs(1);
  Q6KPairBlock* pbs = pairs[0].p;
  const Q6KPairBlock* pp[2] = {&pbs[0], &pbs[1]};
  alignas(64) __m512 acc[2 * kQ6KTiledMaxTokens];
  for (int t0 = 0; t0 < nt; t0 += tile_tokens) {
    const int tn = std::min(tile_tokens, nt - t0);
    for (int p0 = 0; p0 < n_pairs; p0 += 2) {
      const int np = std::min(2, n_pairs - p0);
      for (int k = 0; k < 2 * tn; ++k) acc[k] = _mm512_setzero_ps();
      for (int64_t i = 0; i < nb; ++i) {
        for (int q = 0; q < np; ++q) {
          const uint8_t* rows = a + 16 * (p0 + q) * as;
          q6k_unpack_group_block(rows, as, i, groups[0]);
          q6k_unpack_group_block(rows + 8 * as, as, i, groups[1]);
          q6k_join_pair(groups[0], groups[1], pbs[q]);
        }
        for (int t = 0; t < tn; t += 2) {
          const int ntb = std::min(2, tn - t);
          const BlockQ8_K* y[2] = {&yrow<BlockQ8_K>(b, bs, t0 + t)[i], &yrow<BlockQ8_K>(b, bs, t0 + t + ntb - 1)[i]};
          __m512* blk = acc + 2 * t;  // np x ntb accumulators
          if (np == 2) {
            if (ntb == 2) q6k_pair_tiled_block<2, 2>(pp, y, blk); else q6k_pair_tiled_block<2, 1>(pp, y, blk);
          } else {
            if (ntb == 2) q6k_pair_tiled_block<1, 2>(pp, y, blk); else q6k_pair_tiled_block<1, 1>(pp, y, blk);
          }
        }
      }
      for (int t = 0; t < tn; ++t) {
        const int b0 = t / 2 * 2, ntb = std::min(2, tn - b0);
        for (int q = 0; q < np; ++q) {
          alignas(64) float v[16];
          _mm512_store_ps(v, acc[2 * b0 + q * ntb + (t - b0)]);
          for (int r = 0; r < 16; ++r) out[(16 * (p0 + q) + r) * ors + (t0 + t) * ots] = v[r];
        }
      }
    }
  }
}

#endif

template <int NG>
inline void q6k_tiled_dispatch(int nt, const Q6KGroupBlock* const* gb, const BlockQ8_K* const* y, __m256* acc) {
  if (nt == 2) {
    q6k_tiled_block<NG, 2>(gb, y, acc);
  } else {
    q6k_tiled_block<NG, 1>(gb, y, acc);
  }
}

// GemmTileFn for the tiled order: eight-row groups as above, the rest of the
// rows (fewer than eight) by the row-by-row kernel.
void q6k_tiled_tile(int64_t n, const void* va, size_t as, int nr, const void* vb, size_t bs, int nt, float* out,
                    size_t ors, size_t ots) {
  const uint8_t* a = static_cast<const uint8_t*>(va);
  const uint8_t* b = static_cast<const uint8_t*>(vb);
  const int64_t nb = n / kQK_K;
  const int full = nr / 8 * 8;
  if (full < nr) {
    gemm_tile<RowByRow<KOrdered<KQ6_K, kTiledOrder>>>(n, a + full * as, as, nr - full, vb, bs, nt, out + full * ors,
                                                      ors, ots);
  }
  if (full == 0) return;
#if INFERD_X86_AVX512
  const int pairs = full / 16;
  if (pairs > 0) q6k_tiled_pairs(n, a, as, pairs, b, bs, nt, out, ors, ots, kQ6KTiledMaxTokens);
  if (16 * pairs == full) return;
  a += 16 * pairs * as;  // the last group of eight rows, below
  out += 16 * pairs * ors;
  const int rest = full - 16 * pairs;
#else
  const int rest = full;
#endif
  thread_local std::vector<Q6KGroupBlock> scratch(2);
  Q6KGroupBlock* gbs = scratch.data();
  alignas(32) __m256 acc[2 * kQ6KTiledMaxTokens];
  for (int t0 = 0; t0 < nt; t0 += kQ6KTiledMaxTokens) {
    const int tn = std::min(kQ6KTiledMaxTokens, nt - t0);
    for (int r0 = 0; r0 < rest; r0 += 16) {
      const int ng = rest - r0 >= 16 ? 2 : 1;
      for (int k = 0; k < 2 * tn; ++k) acc[k] = _mm256_setzero_ps();
      for (int64_t i = 0; i < nb; ++i) {
        for (int g = 0; g < ng; ++g) q6k_unpack_group_block(a + (r0 + 8 * g) * as, as, i, gbs[g]);
        const Q6KGroupBlock* gp[2] = {&gbs[0], &gbs[1]};
        for (int t = 0; t < tn; t += 2) {
          const int ntb = std::min(2, tn - t);
          const BlockQ8_K* y[2] = {&yrow<BlockQ8_K>(b, bs, t0 + t)[i], &yrow<BlockQ8_K>(b, bs, t0 + t + ntb - 1)[i]};
          __m256* blk = acc + 2 * t;  // ng x ntb accumulators
          if (ng == 2) {
            q6k_tiled_dispatch<2>(ntb, gp, y, blk);
          } else {
            q6k_tiled_dispatch<1>(ntb, gp, y, blk);
          }
        }
      }
      for (int t = 0; t < tn; ++t) {
        const int b0 = t / 2 * 2, ntb = std::min(2, tn - b0);
        for (int g = 0; g < ng; ++g) {
          alignas(32) float v[8];
          _mm256_store_ps(v, acc[2 * b0 + g * ntb + (t - b0)]);
          for (int r = 0; r < 8; ++r) out[(r0 + 8 * g + r) * ors + (t0 + t) * ots] = v[r];
        }
      }
    }
  }
}

// ---- Q5_0 / Q8_0 in GGML's vec_dot order, for decode ---------------------------
// The order of LegacySymmetric (eight int32 lanes of four products per block,
// acc = fma(dx * dy, lanes, acc) block after block, hsum at the end), with
// fewer instructions per block for steps of one to three tokens: a call takes
// several rows one after the other (contiguous, read in order, prefetched
// ahead) against activations prepared once per call (their quants copied
// aligned: a Q8_0 block's often cross a cache line). Q5_0's quants are taken
// as u = q + 16 (0..31, no sign fix-up): maddubs(u, y) summed in pairs by madd
// is sum(q*y) + 16 * sum(y) per lane, exactly (|2 * 31 * 127| fits int16), and
// 16 * sum(y) per lane is the token's, computed once. Q8_0 keeps the sign
// trick. Eight blocks' dx * dy are one vector multiply (the same rounding as
// the scalar product), each broadcast back from memory.
struct SymDecodeAct {
  std::vector<Vec256> yq;    // [token][block]: the quants, aligned (a Q8_0 block's cross cache lines)
  std::vector<Vec256> base;  // [token][block]: kBias * (sum of y in each lane's four)
  std::vector<float> dy;     // [token][block], padded to a multiple of 8
};
inline SymDecodeAct& sym_decode_act() {
  thread_local SymDecodeAct a;
  return a;
}

// Eight f16 fields 'stride' bytes apart as floats.
inline __m256 gather_f16x8(const uint8_t* p, size_t stride) {
  uint16_t h[8];
  for (int k = 0; k < 8; ++k) std::memcpy(&h[k], p + k * stride, 2);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}

template <class Format>
inline __m256i sym_lanes(const typename Format::Block& x, __m256i yq, __m256i base) {
  if constexpr (Format::kBias == 16) {  // Q5_0: u = q + 16
    const __m256i hb = _mm256_and_si256(bits_to_bytes(x.qh), _mm256_set1_epi8(0x10));
    // The 16 nibble bytes in both halves, the upper half shifted by 4: no lane-crossing insert.
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qs)));
    const __m256i nib = _mm256_and_si256(_mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                                         _mm256_set1_epi8(0x0f));
    const __m256i u = _mm256_or_si256(nib, hb);
    return _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u, yq), _mm256_set1_epi16(1)), base);
  } else {  // Q8_0: signed quants, the sign moved onto y
    const __m256i q = load256(x.qs);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(yq, q)),
                             _mm256_set1_epi16(1));
  }
}

// NR rows (x, x + xs bytes, ...) against NT tokens (their blocks bs apart at b;
// their prepared base and dy at base and dy, nb and nb8 apart per token): each
// (row, token) its own chain of fmas, several chains so that the fma latency
// is hidden (one row's chain alone waits on it every block).
template <class Format, int NR, int NT>
inline void sym_decode_rows(int64_t nb, const uint8_t* x, size_t xs, const Vec256* yq, const Vec256* base,
                            const float* dy, float* out, size_t ors, size_t ots) {
  using Block = typename Format::Block;
  const int64_t nb8 = (nb + 7) / 8 * 8;
  __m256 acc[NR][NT];
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  // The eight blocks' dx * dy wait in memory, each broadcast from there: kept
  // in registers with four chains they pushed the accumulators onto the stack.
  alignas(32) float dd[NR][NT][8];
  for (; i + 8 <= nb; i += 8) {
    for (int r = 0; r < NR; ++r) {
      const uint8_t* p = x + r * xs + i * sizeof(Block);
      prefetch_weights_ahead(p, 8 * sizeof(Block));
      const __m256 dx = gather_f16x8(p, sizeof(Block));
      for (int t = 0; t < NT; ++t) _mm256_store_ps(dd[r][t], _mm256_mul_ps(dx, _mm256_loadu_ps(dy + t * nb8 + i)));
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      for (int r = 0; r < NR; ++r) {
        const Block& xb = block_at<Block>(x + r * xs, i + j);
        for (int t = 0; t < NT; ++t) {
          const __m256i lanes = sym_lanes<Format>(xb, yq[t * nb + i + j].v, base[t * nb + i + j].v);
          acc[r][t] = _mm256_fmadd_ps(_mm256_broadcast_ss(&dd[r][t][j]), _mm256_cvtepi32_ps(lanes), acc[r][t]);
        }
      }
    }
  }
  for (; i < nb; ++i) {
    for (int r = 0; r < NR; ++r) {
      const Block& xb = block_at<Block>(x + r * xs, i);
      const float dx = fp16(xb.d);
      for (int t = 0; t < NT; ++t) {
        const __m256i lanes = sym_lanes<Format>(xb, yq[t * nb + i].v, base[t * nb + i].v);
        acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dy[t * nb8 + i]), _mm256_cvtepi32_ps(lanes), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int t = 0; t < NT; ++t) out[r * ors + t * ots] = hsum(acc[r][t]);
  }
}

// Rows against nt (1..3) tokens, one row at a time (interleaving four rows'
// chains hid the fma latency in L2 but read memory 40% slower); the
// activations' per-block terms prepared once per call.
template <class Format>
void sym_decode_tile(int64_t n, const void* va, size_t as, int nr, const void* vb, size_t bs, int nt, float* out,
                     size_t ors, size_t ots) {
  const uint8_t* a = static_cast<const uint8_t*>(va);
  const uint8_t* b = static_cast<const uint8_t*>(vb);
  const int64_t nb = n / kQK, nb8 = (nb + 7) / 8 * 8;
  SymDecodeAct& pa = sym_decode_act();
  if (pa.base.size() < static_cast<size_t>(nt * nb)) pa.base.resize(static_cast<size_t>(nt * nb));
  if (pa.yq.size() < static_cast<size_t>(nt * nb)) pa.yq.resize(static_cast<size_t>(nt * nb));
  if (pa.dy.size() < static_cast<size_t>(nt * nb8)) pa.dy.resize(static_cast<size_t>(nt * nb8));
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(Format::kBias));
  for (int t = 0; t < nt; ++t) {
    for (int64_t i = 0; i < nb; ++i) {
      const BlockQ8_0& y = block_at<BlockQ8_0>(b + t * bs, i);
      pa.yq[t * nb + i].v = load256(y.qs);
      if constexpr (Format::kBias == 16) {
        pa.base[t * nb + i].v = _mm256_madd_epi16(_mm256_maddubs_epi16(bias, load256(y.qs)), _mm256_set1_epi16(1));
      }
      pa.dy[t * nb8 + i] = fp16(y.d);
    }
  }
  for (int t = 0; t < nt;) {
    const int tt = nt - t >= 2 ? 2 : 1;
    const Vec256* yq = pa.yq.data() + t * nb;
    const Vec256* base = pa.base.data() + t * nb;
    const float* dy = pa.dy.data() + t * nb8;
    int r = 0;
    if (tt == 2) {
      for (; r + 2 <= nr; r += 2) sym_decode_rows<Format, 2, 2>(nb, a + r * as, as, yq, base, dy, out + r * ors + t * ots, ors, ots);
      for (; r < nr; ++r) sym_decode_rows<Format, 1, 2>(nb, a + r * as, as, yq, base, dy, out + r * ors + t * ots, ors, ots);
    } else {
      for (; r < nr; ++r) sym_decode_rows<Format, 1, 1>(nb, a + r * as, as, yq, base, dy, out + r * ors + t * ots, ors, ots);
    }
    t += tt;
  }
}

// Q5_0 / Q8_0 tiles: decode-sized steps (fewer than 4 tokens) by the kernel
// above, larger ones by the level's prefill tile.
template <class Format, GemmTileFn kPrefill>
void sym_tile(int64_t n, const void* va, size_t as, int nr, const void* vb, size_t bs, int nt, float* out, size_t ors,
              size_t ots) {
  if (nt < 4) {
    sym_decode_tile<Format>(n, va, as, nr, vb, bs, nt, out, ors, ots);
  } else {
    kPrefill(n, va, as, nr, vb, bs, nt, out, ors, ots);
  }
}

// ---- Repacked Q4_K (kquant_layout.h): GGML's repacked gemv and gemm orders ------
// One 32-bit lane per row throughout. Sub-block j's integer dot of a row is
// built in int16 lanes over its eight 4-byte steps (maddubs of the row's four
// quants, 0..15, by the token's four, -127..127: each step's int16 is at most
// 2*15*127 = 3810 in magnitude, eight of them 30480, so the int16 sums are
// exact), then one madd by the scale pair (s, s) gives the row's int32 sum of
// s * q * y. The mins' part is a madd of the pairs (min_2k, min_2k+1) by the
// token's pair sums of bsums. Every integer is exact, so each lane holds the
// same isum and msum as the reference, and the float steps are its own.

// A group super-block's scales and super-scales as the kernels use them.
struct Q4KGroupScales {
  __m256i sc[8];  // sub-block j: lane r = row r's scale as the int16 pair (s, s)
  __m256i mn[4];  // lane r = row r's mins of sub-blocks 2k, 2k+1 as an int16 pair
  __m256 d, dmin;
};

inline __m256i dword_byte_mask(int b0, int b1) {
  // Per 32-bit lane w of each 128-bit half: bytes (4w+b0, zero, 4w+b1, zero).
  const auto lane = [&](int w) {
    return static_cast<int>((4 * w + b0) | 0x8000 | ((4 * w + b1) << 16) | 0x80000000u);
  };
  return _mm256_setr_epi32(lane(0), lane(1), lane(2), lane(3), lane(0), lane(1), lane(2), lane(3));
}

inline void q4k_group_scales(const uint8_t* gb, Q4KGroupScales& s) {
  const __m256i u0 = load256(gb + kQ4KGroupScalesOffset), u1 = load256(gb + kQ4KGroupScalesOffset + 32);
  const __m256i u2 = load256(gb + kQ4KGroupScalesOffset + 64);
  const __m256i m6 = _mm256_set1_epi8(0x3f), m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
  // Per row (lane): scales 0-3, 4-7 and mins 0-3, 4-7 as bytes (k4_scale_min).
  const __m256i s03 = _mm256_and_si256(u0, m6);
  const __m256i s47 = _mm256_or_si256(_mm256_and_si256(u2, m4), _mm256_and_si256(_mm256_srli_epi16(u0, 2), m30));
  const __m256i m03 = _mm256_and_si256(u1, m6);
  const __m256i m47 =
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(u2, 4), m4), _mm256_and_si256(_mm256_srli_epi16(u1, 2), m30));
  for (int j = 0; j < 4; ++j) {
    s.sc[j] = _mm256_shuffle_epi8(s03, dword_byte_mask(j, j));
    s.sc[4 + j] = _mm256_shuffle_epi8(s47, dword_byte_mask(j, j));
  }
  s.mn[0] = _mm256_shuffle_epi8(m03, dword_byte_mask(0, 1));
  s.mn[1] = _mm256_shuffle_epi8(m03, dword_byte_mask(2, 3));
  s.mn[2] = _mm256_shuffle_epi8(m47, dword_byte_mask(0, 1));
  s.mn[3] = _mm256_shuffle_epi8(m47, dword_byte_mask(2, 3));
  s.d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb)));
  s.dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 16)));
}

// A token's super-block i as the kernels read it: dy, and its bsums' pair sums
// (one per 32 elements) as int16 pairs (s_2k, s_2k+1) in every lane.
struct Q8KTokenBlock {
  __m256i pairs[4];
  __m256 dy;
};
inline void q8k_token_block(const BlockQ8_K& y, Q8KTokenBlock& tb) {
  const __m128i s = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y.bsums)),
                                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(y.bsums + 8)));
  const __m256i s2 = _mm256_broadcastsi128_si256(s);
  tb.pairs[0] = _mm256_shuffle_epi32(s2, 0x00);
  tb.pairs[1] = _mm256_shuffle_epi32(s2, 0x55);
  tb.pairs[2] = _mm256_shuffle_epi32(s2, 0xaa);
  tb.pairs[3] = _mm256_shuffle_epi32(s2, 0xff);
  tb.dy = _mm256_set1_ps(y.d);
}


// msum of the eight rows for pair k of sub-blocks, and for the whole super-block.
inline __m256i q4k_msum_pair(const Q4KGroupScales& s, const Q8KTokenBlock& tb, int k) {
  return _mm256_madd_epi16(s.mn[k], tb.pairs[k]);
}
inline __m256i q4k_msum_all(const Q4KGroupScales& s, const Q8KTokenBlock& tb) {
  return _mm256_add_epi32(_mm256_add_epi32(q4k_msum_pair(s, tb, 0), q4k_msum_pair(s, tb, 1)),
                          _mm256_add_epi32(q4k_msum_pair(s, tb, 2), q4k_msum_pair(s, tb, 3)));
}

// Decode (the gemv order, one or two tokens): the nibbles unpacked as they
// stream in, each vector for every token; the next weights prefetched.
template <int NT>
void q4k_groups_gemv_stream(const uint8_t* groups, int64_t n_groups, int64_t cols, const uint8_t* act,
                            size_t act_stride, float* out, size_t out_stride) {
  const int64_t nb = cols / kQK_K;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int64_t g = 0; g < n_groups; ++g) {
    const uint8_t* group = groups + g * nb * kQ4KGroupBlockBytes;
    __m256 acc[NT], accm[NT];
    for (int t = 0; t < NT; ++t) acc[t] = accm[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      const uint8_t* gb = group + i * kQ4KGroupBlockBytes;
      prefetch_weights_ahead(gb, kQ4KGroupBlockBytes);
      Q4KGroupScales s;
      q4k_group_scales(gb, s);
      const BlockQ8_K* y[NT];
      for (int t = 0; t < NT; ++t) y[t] = &yrow<BlockQ8_K>(act, act_stride, t)[i];
      __m256i isum[NT];
      for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
      const uint8_t* qs = gb + kQ4KGroupQsOffset;
      for (int c = 0; c < 4; ++c) {
#if INFERD_X86_AVX512
        // VNNI: int32 sums of each sub-block by dpbusd, scaled by one mullo.
        __m256i lo32[NT], hi32[NT];
        for (int t = 0; t < NT; ++t) lo32[t] = hi32[t] = _mm256_setzero_si256();
        for (int st = 0; st < 8; ++st) {
          const __m256i v = load256(qs + 32 * (8 * c + st));
          const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
          for (int t = 0; t < NT; ++t) {
            const int8_t* q = y[t]->qs + 64 * c + 4 * st;
            lo32[t] = _mm256_dpbusd_epi32(lo32[t], lo, bcast4(q));
            hi32[t] = _mm256_dpbusd_epi32(hi32[t], hi, bcast4(q + 32));
          }
        }
        const __m256i low16 = _mm256_set1_epi32(0xffff);  // (s, s) int16 pair -> s
        const __m256i sl = _mm256_and_si256(s.sc[2 * c], low16), sh = _mm256_and_si256(s.sc[2 * c + 1], low16);
        for (int t = 0; t < NT; ++t) {
          isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_mullo_epi32(lo32[t], sl),
                                                               _mm256_mullo_epi32(hi32[t], sh)));
        }
#else
        __m256i lo16[NT], hi16[NT];
        for (int t = 0; t < NT; ++t) lo16[t] = hi16[t] = _mm256_setzero_si256();
        for (int st = 0; st < 8; ++st) {
          const __m256i v = load256(qs + 32 * (8 * c + st));
          const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
          for (int t = 0; t < NT; ++t) {
            const int8_t* q = y[t]->qs + 64 * c + 4 * st;
            lo16[t] = _mm256_add_epi16(lo16[t], _mm256_maddubs_epi16(lo, bcast4(q)));
            hi16[t] = _mm256_add_epi16(hi16[t], _mm256_maddubs_epi16(hi, bcast4(q + 32)));
          }
        }
        for (int t = 0; t < NT; ++t) {
          isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_madd_epi16(lo16[t], s.sc[2 * c]),
                                                               _mm256_madd_epi16(hi16[t], s.sc[2 * c + 1])));
        }
#endif
      }
      for (int t = 0; t < NT; ++t) {
        Q8KTokenBlock tb;
        q8k_token_block(*y[t], tb);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(s.d, tb.dy), acc[t]);
        accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4k_msum_all(s, tb)), _mm256_mul_ps(s.dmin, tb.dy), accm[t]);
      }
    }
    for (int t = 0; t < NT; ++t) _mm256_storeu_ps(out + t * out_stride + 8 * g, _mm256_sub_ps(acc[t], accm[t]));
  }
}

// NG groups' super-block i (nibbles unpacked in w[g], vector 8j + s: sub-block
// j, step s) against NT tokens, updating each (group, token)'s a and m lanes
// (am[2 * (g * NT + t)] and the one after) in the gemm order (an fma per pair
// of sub-blocks) or the gemv order (one per super-block). In a block of NG
// groups by NT tokens each weight vector serves NT products and each
// broadcast activation NG.
template <bool kGemm, int NG, int NT>
inline void q4k_block_unpacked(const __m256i* const* w, const Q4KGroupScales* const* s, const BlockQ8_K* const* y,
                               __m256* am) {
  Q8KTokenBlock tb[NT];
  for (int t = 0; t < NT; ++t) q8k_token_block(*y[t], tb[t]);
  __m256 a[NG][NT], m[NG][NT];
  for (int g = 0; g < NG; ++g) {
    for (int t = 0; t < NT; ++t) a[g][t] = am[2 * (g * NT + t)], m[g][t] = am[2 * (g * NT + t) + 1];
  }
  // The integers first: sub-block j's scaled sums of every (group, token)...
  alignas(32) __m256i isub[8][NG][NT];
#pragma GCC unroll 1
  for (int j = 0; j < 8; ++j) {
    __m256i acc16[NG][NT];
    for (int g = 0; g < NG; ++g) {
      for (int t = 0; t < NT; ++t) acc16[g][t] = _mm256_setzero_si256();
    }
    // Rolled by two: unrolled, GCC forms all the products first and sums them
    // as a tree, spilling most of them (and with the chains forced, the
    // unrolled loop measured 15% slower).
#pragma GCC unroll 2
    for (int st = 0; st < 8; ++st) {
      __m256i yb[NT], wv[NG];
      for (int t = 0; t < NT; ++t) yb[t] = bcast4(y[t]->qs + 32 * j + 4 * st);
      for (int g = 0; g < NG; ++g) wv[g] = _mm256_load_si256(w[g] + 8 * j + st);
      for (int g = 0; g < NG; ++g) {
        for (int t = 0; t < NT; ++t) acc16[g][t] = _mm256_add_epi16(acc16[g][t], _mm256_maddubs_epi16(wv[g], yb[t]));
      }
    }
    for (int g = 0; g < NG; ++g) {
      for (int t = 0; t < NT; ++t) isub[j][g][t] = _mm256_madd_epi16(acc16[g][t], s[g]->sc[j]);
    }
  }
  // ... then each (group, token)'s float steps, in the reference's order.
  for (int g = 0; g < NG; ++g) {
    for (int t = 0; t < NT; ++t) {
      const __m256 sd = _mm256_mul_ps(s[g]->d, tb[t].dy), sm = _mm256_mul_ps(s[g]->dmin, tb[t].dy);
      __m256i isum = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k) {
        const __m256i p = _mm256_add_epi32(isub[2 * k][g][t], isub[2 * k + 1][g][t]);
        if constexpr (kGemm) {
          a[g][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sd, a[g][t]);
          m[g][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4k_msum_pair(*s[g], tb[t], k)), sm, m[g][t]);
        } else {
          isum = _mm256_add_epi32(isum, p);
        }
      }
      if constexpr (!kGemm) {
        a[g][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), sd, a[g][t]);
        m[g][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4k_msum_all(*s[g], tb[t])), sm, m[g][t]);
      }
      am[2 * (g * NT + t)] = a[g][t];
      am[2 * (g * NT + t) + 1] = m[g][t];
    }
  }
}

// Many tokens: per group super-block the nibbles are unpacked once into an
// L1 buffer, then every token of a tile (activations kept in L2) runs on it,
// three groups by two tokens at a time; the a and m lanes of each (group,
// token) wait in a buffer between super-blocks. This runs at about one cycle
// per maddubs, what this Zen 3 core sustains for maddubs with memory
// operands (a 2 x 2 block measured the same, 2 x 4 25% slower).
constexpr int kQ4KMaxTileTokens = 64;
constexpr size_t kQ4KTileActBytes = 192 * 1024;

inline void q4k_unpack_group_block(const uint8_t* gb, __m256i* w, Q4KGroupScales& s) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  q4k_group_scales(gb, s);
  const uint8_t* qs = gb + kQ4KGroupQsOffset;
  for (int c = 0; c < 4; ++c) {
    for (int st = 0; st < 8; ++st) {
      const __m256i v = load256(qs + 32 * (8 * c + st));
      w[8 * (2 * c) + st] = _mm256_and_si256(v, m4);
      w[8 * (2 * c + 1) + st] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
  }
}

// A block: kQ4KBlockGroups groups (of eight rows) by two tokens.
constexpr int kQ4KBlockGroups = 3;

// The tile loop of the kernels below, for a unit of rows (U: one group by
// AVX2, a pair of groups by VNNI): per super-block each unit of a block is
// unpacked once, then the tile's tokens run on the block two at a time; the
// a and m lanes of each (unit, token) wait in a buffer between super-blocks.
// U gives the vectors (Vec, W, Scales), kGroups (groups per unit),
// kBlockUnits, unpack(unit's super-block, group bytes, w, scales),
// block<kGemm, NG, NT>(w, scales, y, am) and store(dst, a, m).
template <class U, bool kGemm, int NG = U::kBlockUnits>
inline void q4k_unit_block(int ng, int nt, const typename U::W* const* w, const typename U::Scales* const* s,
                           const BlockQ8_K* const* y, typename U::Vec* am) {
  if constexpr (NG > 1) {
    if (ng < NG) return q4k_unit_block<U, kGemm, NG - 1>(ng, nt, w, s, y, am);
  }
  with_count<U::kBlockTokens>(nt, [&]<int NT>() { U::template block<kGemm, NG, NT>(w, s, y, am); });
}

template <class U, bool kGemm>
void q4k_unit_tiles(const uint8_t* groups, int64_t n_units, int64_t cols, const uint8_t* act, size_t act_stride,
                    int64_t nt, float* out, size_t out_stride) {
  constexpr int G = U::kBlockUnits, T = U::kBlockTokens, kRows = 8 * U::kGroups;
  using Vec = typename U::Vec;
  const int64_t nb = cols / kQK_K;
  const size_t gbytes = static_cast<size_t>(nb) * kQ4KGroupBlockBytes;
  const int64_t tile = std::clamp<int64_t>(static_cast<int64_t>(kQ4KTileActBytes / act_stride), 2, kQ4KMaxTileTokens);
  struct alignas(64) Unpacked {
    typename U::W w[G][64];
    typename U::Scales sc[G];
  };
  Unpacked u;
  const typename U::W* wp[G];
  const typename U::Scales* sp[G];
  for (int g = 0; g < G; ++g) wp[g] = u.w[g], sp[g] = &u.sc[g];
  // [token block][unit][token of block][a, m]: a block of nb_t tokens holds ng * nb_t * 2.
  alignas(64) Vec am[2 * G * kQ4KMaxTileTokens];
  for (int64_t t0 = 0; t0 < nt; t0 += tile) {
    const int64_t tn = std::min(tile, nt - t0);
    for (int64_t g = 0; g < n_units; g += G) {
      const int ng = static_cast<int>(std::min<int64_t>(G, n_units - g));
      for (int64_t k = 0; k < 2 * G * tn; ++k) am[k] = Vec{};
      for (int64_t i = 0; i < nb; ++i) {
        for (int gi = 0; gi < ng; ++gi) {
          U::unpack(groups + (g + gi) * U::kGroups * gbytes + i * kQ4KGroupBlockBytes, gbytes, u.w[gi], u.sc[gi]);
        }
        for (int64_t t = 0; t < tn; t += T) {
          const int nb_t = static_cast<int>(std::min<int64_t>(T, tn - t));
          const BlockQ8_K* y[T];
          for (int k = 0; k < nb_t; ++k) y[k] = &yrow<BlockQ8_K>(act, act_stride, static_cast<int>(t0 + t + k))[i];
          q4k_unit_block<U, kGemm>(ng, nb_t, wp, sp, y, am + 2 * G * t);
        }
      }
      for (int64_t t = 0; t < tn; ++t) {
        const int64_t b0 = t / T * T, tt = t - b0;
        const int64_t ntb = std::min<int64_t>(T, tn - b0);  // tokens in t's block
        for (int gi = 0; gi < ng; ++gi) {
          const Vec* v = am + 2 * G * b0 + 2 * (gi * ntb + tt);
          U::store(out + (t0 + t) * out_stride + kRows * (g + gi), v[0], v[1]);
        }
      }
    }
  }
}

// AVX2: a unit is one group.
struct Q4KGroupUnits {
  using Vec = __m256;
  using W = __m256i;
  using Scales = Q4KGroupScales;
  static constexpr int kGroups = 1, kBlockUnits = kQ4KBlockGroups, kBlockTokens = 2;
  static void unpack(const uint8_t* gb, size_t, W* w, Scales& s) { q4k_unpack_group_block(gb, w, s); }
  template <bool kGemm, int NG, int NT>
  static void block(const W* const* w, const Scales* const* s, const BlockQ8_K* const* y, Vec* am) {
    q4k_block_unpacked<kGemm, NG, NT>(w, s, y, am);
  }
  static void store(float* dst, Vec a, Vec m) { _mm256_storeu_ps(dst, _mm256_sub_ps(a, m)); }
};

#if INFERD_X86_AVX512

// The gemm order with VNNI, two groups side by side (16 rows, lane r: row r of
// the pair) per zmm: a dpbusd adds four products into each row's int32, so a
// sub-block's eight steps leave its plain sum, which one mullo scales (the
// AVX2 kernel needs maddubs, an int16 add and, per sub-block, a madd). The
// integers are the same (exact), and so are the float steps, per lane.
struct Q4KPairScales {
  __m512i sc[8];  // sub-block j: row r's scale as an int32
  __m512i mn[4];  // as Q4KGroupScales::mn
  __m512 d, dmin;
};

inline void q4k_unpack_pair_block(const uint8_t* gb0, const uint8_t* gb1, __m512i* w, Q4KPairScales& s) {
  Q4KGroupScales a, b;
  q4k_group_scales(gb0, a);
  q4k_group_scales(gb1, b);
  const __m512i low16 = _mm512_set1_epi32(0xffff);  // (s, s) int16 pair -> s
  for (int j = 0; j < 8; ++j) s.sc[j] = _mm512_and_si512(join256(a.sc[j], b.sc[j]), low16);
  for (int k = 0; k < 4; ++k) s.mn[k] = join256(a.mn[k], b.mn[k]);
  s.d = _mm512_insertf32x8(_mm512_castps256_ps512(a.d), b.d, 1);
  s.dmin = _mm512_insertf32x8(_mm512_castps256_ps512(a.dmin), b.dmin, 1);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const uint8_t* q0 = gb0 + kQ4KGroupQsOffset;
  const uint8_t* q1 = gb1 + kQ4KGroupQsOffset;
  for (int c = 0; c < 4; ++c) {
    for (int st = 0; st < 8; ++st) {
      const size_t off = 32 * static_cast<size_t>(8 * c + st);
      const __m512i v = join256(load256(q0 + off), load256(q1 + off));
      w[8 * (2 * c) + st] = _mm512_and_si512(v, m4);
      w[8 * (2 * c + 1) + st] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
  }
}

// NG group pairs' super-block i (w[g]: vector 8j + s is sub-block j, step s)
// against NT tokens; am[2 * (g * NT + t)] and the one after are (group pair,
// token)'s a and m lanes, updated in the gemm order (an fma per pair of
// sub-blocks) or the gemv order (one per super-block), as q4k_block_unpacked.
template <bool kGemm, int NG, int NT>
inline void q4k_pair_block(const __m512i* const* w, const Q4KPairScales* const* s, const BlockQ8_K* const* y,
                           __m512* am) {
  __m512i pairs[NT][4];
  __m512 dy[NT];
  for (int t = 0; t < NT; ++t) {
    Q8KTokenBlock tb;
    q8k_token_block(*y[t], tb);
    for (int k = 0; k < 4; ++k) pairs[t][k] = _mm512_broadcast_i64x4(tb.pairs[k]);
    dy[t] = _mm512_set1_ps(y[t]->d);
  }
  __m512i isum[NG][NT], msum_all[NG][NT];  // the gemv order's
  for (int g = 0; g < NG; ++g) {
    for (int t = 0; t < NT; ++t) isum[g][t] = msum_all[g][t] = _mm512_setzero_si512();
  }
  for (int k = 0; k < 4; ++k) {  // sub-blocks 2k and 2k+1 (32 quants: eight steps each)
    __m512i acc[2][NG][NT];
    dpbusd_subblock_pair<8>(w, y, 2 * k, acc);
    for (int g = 0; g < NG; ++g) {
      for (int t = 0; t < NT; ++t) {
        const __m512i p = _mm512_add_epi32(_mm512_mullo_epi32(acc[0][g][t], s[g]->sc[2 * k]),
                                           _mm512_mullo_epi32(acc[1][g][t], s[g]->sc[2 * k + 1]));
        const __m512i msum = _mm512_madd_epi16(s[g]->mn[k], pairs[t][k]);
        if constexpr (kGemm) {
          __m512* a = am + 2 * (g * NT + t);
          a[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(s[g]->d, dy[t]), a[0]);
          a[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(s[g]->dmin, dy[t]), a[1]);
        } else {
          isum[g][t] = _mm512_add_epi32(isum[g][t], p);
          msum_all[g][t] = _mm512_add_epi32(msum_all[g][t], msum);
        }
      }
    }
  }
  if constexpr (!kGemm) {
    for (int g = 0; g < NG; ++g) {
      for (int t = 0; t < NT; ++t) {
        __m512* a = am + 2 * (g * NT + t);
        a[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[g][t]), _mm512_mul_ps(s[g]->d, dy[t]), a[0]);
        a[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum_all[g][t]), _mm512_mul_ps(s[g]->dmin, dy[t]), a[1]);
      }
    }
  }
}

// VNNI: a unit is a pair of groups.
struct Q4KPairUnits {
  using Vec = __m512;
  using W = __m512i;
  using Scales = Q4KPairScales;
  // Blocks of 2 pairs by 2 tokens: by kernels_bench's repacked cases, 2 x 3
  // and 2 x 4 spill registers (30% slower) and 1 x 4 is 5-10% slower.
  static constexpr int kGroups = 2, kBlockUnits = 2, kBlockTokens = 2;
  static void unpack(const uint8_t* gb, size_t gbytes, W* w, Scales& s) { q4k_unpack_pair_block(gb, gb + gbytes, w, s); }
  template <bool kGemm, int NG, int NT>
  static void block(const W* const* w, const Scales* const* s, const BlockQ8_K* const* y, Vec* am) {
    q4k_pair_block<kGemm, NG, NT>(w, s, y, am);
  }
  static void store(float* dst, Vec a, Vec m) { _mm512_storeu_ps(dst, _mm512_sub_ps(a, m)); }
};

#endif

#if INFERD_X86_AVX512
// The pairs among n_groups groups by U's tiles (units of two groups), in the
// gemm or the gemv order; groups and out are moved past them. Returns the
// groups left to another kernel: 0, or 1 when n_groups is odd.
template <class U>
int64_t q4k_pair_tiles(const uint8_t*& groups, int64_t n_groups, int64_t cols, const uint8_t* act,
                       size_t act_stride, int64_t nt, bool gemm, float*& out, size_t out_stride) {
  const int64_t even = n_groups / 2 * 2;
  if (gemm) {
    q4k_unit_tiles<U, true>(groups, even / 2, cols, act, act_stride, nt, out, out_stride);
  } else {
    q4k_unit_tiles<U, false>(groups, even / 2, cols, act, act_stride, nt, out, out_stride);
  }
  groups += even * static_cast<int64_t>(cols / kQK_K * kQ4KGroupBlockBytes);
  out += 8 * even;
  return n_groups - even;
}
#endif

#if INFERD_X86_AVX512
// The gemv order for more tokens than a stream holds (a verify step of five
// drafts or more, a batch of decoding sequences): each group streamed once per
// chunk of up to five tokens (chunks as even as they can be), the group's
// weights still in cache for the chunks after the first.
constexpr int64_t kQ4KMaxChunkedTokens = 11;

void q4k_groups_gemv_chunks(const uint8_t* groups, int64_t n_groups, int64_t cols, const uint8_t* act,
                            size_t act_stride, int64_t nt, float* out, size_t out_stride) {
  constexpr int kChunk = 5;
  const int64_t chunks = (nt + kChunk - 1) / kChunk;
  const size_t group_bytes = static_cast<size_t>(cols / kQK_K) * kQ4KGroupBlockBytes;
  for (int64_t g = 0; g < n_groups; ++g) {
    const uint8_t* group = groups + static_cast<size_t>(g) * group_bytes;
    int64_t t = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int n = static_cast<int>((nt - t) / (chunks - c));
      with_count<kChunk>(n, [&]<int N>() {
        q4k_groups_gemv_stream<N>(group, 1, cols, act + t * act_stride, act_stride,
                                  out + t * out_stride + 8 * g, out_stride);
      });
      t += n;
    }
  }
}
#endif

void q4k_groups_x86(const uint8_t* groups, int64_t n_groups, int64_t cols, const uint8_t* act, size_t act_stride,
                    int64_t nt, bool gemm, float* out, size_t out_stride) {
#if INFERD_X86_AVX512
  // The gemv order (decode, verify steps, batches of decoding sequences):
  // steps of up to five tokens stream the weights (32 registers hold five
  // tokens' sums; at six they spill), up to eleven go by chunks of a stream,
  // and larger batches by the tiles, which unpack the weights once for all
  // their tokens (measured on Qwen 1.5B: the chunks are faster up to eleven
  // tokens, slower from fourteen).
  if (!gemm && nt > 5 && nt <= kQ4KMaxChunkedTokens) {
    q4k_groups_gemv_chunks(groups, n_groups, cols, act, act_stride, nt, out, out_stride);
    return;
  }
  // Pairs of groups by VNNI; a last odd group by the AVX2 kernel below.
  if (gemm || nt > 5) {
    n_groups = q4k_pair_tiles<Q4KPairUnits>(groups, n_groups, cols, act, act_stride, nt, gemm, out, out_stride);
    if (n_groups == 0) return;
  }
#endif
  if (gemm) {
    q4k_unit_tiles<Q4KGroupUnits, true>(groups, n_groups, cols, act, act_stride, nt, out, out_stride);
    return;
  }
  switch (nt) {
    case 1: q4k_groups_gemv_stream<1>(groups, n_groups, cols, act, act_stride, out, out_stride); return;
    case 2: q4k_groups_gemv_stream<2>(groups, n_groups, cols, act, act_stride, out, out_stride); return;
    case 3: q4k_groups_gemv_stream<3>(groups, n_groups, cols, act, act_stride, out, out_stride); return;
    case 4: q4k_groups_gemv_stream<4>(groups, n_groups, cols, act, act_stride, out, out_stride); return;
#if INFERD_X86_AVX512
    case 5: q4k_groups_gemv_stream<5>(groups, n_groups, cols, act, act_stride, out, out_stride); return;
#endif
    default: q4k_unit_tiles<Q4KGroupUnits, false>(groups, n_groups, cols, act, act_stride, nt, out, out_stride); return;
  }
}

void fill_x86_kquant(KernelTable& table) {
  TypeKernels& q4k = table.type[static_cast<uint32_t>(DType::Q4_K)];
  q4k.repack_tile = q4k_repack_gemv_tile;
  // Rows per call in decode and in batched steps, so the repacked order's
  // calls get eight rows (the other Q4_K orders run them row by row).
  q4k.gemv_rows = 8;
  q4k.tile_rows = 8;
  table.q4k_groups = q4k_groups_x86;
  TypeKernels& q40 = table.type[static_cast<uint32_t>(DType::Q4_0)];
  q40.repack_tile = q40.repack_gemm_tile = q4_0_repack_tile;  // the same float steps in both
  // Rows per call, so the repacked order's calls get eight rows (a multiple of
  // eight also for the vec_dot order's tiles: AVX2 16, AVX-512 8).
  q40.gemv_rows = 8;
  q40.tile_rows = (q40.tile_rows + 7) / 8 * 8;
  TypeKernels& q6k = table.type[static_cast<uint32_t>(DType::Q6_K)];
  q6k.vec_dot = q6k_vec_dot_one;
  q6k.gemm_tile = q6k_vec_dot_tile;
  q6k.gemv_rows = 16;  // rows per call in decode (one after the other)
  q6k.tiled_tile = q6k_tiled_tile;
  // Calls of 16 rows x 64 tokens: each group unpacked once for 64 tokens (the
  // vec_dot order's tile takes any shape).
  q6k.tile_rows = 16;
  q6k.tile_tokens = kQ6KTiledMaxTokens;
#if INFERD_X86_AVX512
  q6k.tile_rows = 32;  // two 16-row pairs per pass (q6k_tiled_pairs)
#endif
  // Q5_0 and Q8_0: the decode kernel for steps of up to three tokens, rows per
  // call in decode.
  TypeKernels& q5 = table.type[static_cast<uint32_t>(DType::Q5_0)];
  TypeKernels& q8 = table.type[static_cast<uint32_t>(DType::Q8_0)];
#if INFERD_X86_AVX512
  q5.gemm_tile = sym_tile<FormatQ5_0, gemm_tile<KQ5_0>>;
#else
  q5.gemm_tile = sym_tile<FormatQ5_0, gemm_unpacked_symmetric<FormatQ5_0>>;
#endif
  q8.gemm_tile = sym_tile<FormatQ8_0, gemm_tile<KQ8_0>>;
  q5.vec_dot = [](int64_t n, const void* a, const void* b) {
    float out;
    sym_decode_tile<FormatQ5_0>(n, a, 0, 1, b, 0, 1, &out, 0, 0);
    return out;
  };
  q8.vec_dot = [](int64_t n, const void* a, const void* b) {
    float out;
    sym_decode_tile<FormatQ8_0>(n, a, 0, 1, b, 0, 1, &out, 0, 0);
    return out;
  };
  q5.gemv_rows = q8.gemv_rows = 16;
}
