// Repacked Q4_K with AMX tiles (internal; textually included by
// quants_avx512.cpp after kquant_x86_impl.h, whose pair units it extends).
//
// Same bits as the VNNI pair units: per (row, token) GGML's orders sum each
// 32-quant sub-block's products exactly into an int32, scale it by the row's
// 6-bit sub-block scale, and run a fixed sequence of float steps on those
// integers. A TDPBSUD of a token block's sub-block (tokens x 32 signed
// activation bytes) by a pair of groups' unpacked sub-block (8 x 64 bytes:
// each 64-byte step holds four quants of each of the 16 rows, which is the
// layout AMX wants for its second operand) leaves exactly those int32 sums,
// token by row, one C tile row per token with a row in each lane, the lanes
// the float steps run in. AMX does the products (a tile op computes 16 x 16 x
// 32 of them, where the VNNI kernel issues 128 dpbusd); vectors do the scales
// and the float steps, unchanged.
//
// Used for steps of many tokens (prompt chunks, batches of decoding
// sequences): a single stream's decode step is bound by memory, not by the
// products, and keeps the streaming kernel.
constexpr int kAmxTokens = 16;  // a C tile's rows

// Tiles: 0 the activations (rows = the block's tokens, 32 bytes), 1 and 2 a
// unit's weights (8 steps of 64 bytes), 3 and 4 their sums (tokens x 16
// int32), 5 and 6 the units' mins' sums, 7 a unit's mins (8 steps).
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// GCC 12's tile intrinsics are asm statements that do not tell the compiler
// which memory they read (ldtilecfg names 8 bytes of its 64, tileloadd none):
// without this barrier the stores of the configuration, of the unpacked
// weights or of the activations may be moved past them or dropped.
inline void amx_memory_barrier() { asm volatile("" ::: "memory"); }

// The tile shapes for blocks of nt tokens; loaded on a thread only when nt
// changes (the tiles stay configured through a call, released at its end).
inline thread_local int amx_configured_tokens = 0;

inline void amx_configure(int nt) {
  if (amx_configured_tokens == nt) return;
  AmxTileConfig cfg;
  cfg.rows[0] = static_cast<uint8_t>(nt), cfg.colsb[0] = 32;
  for (int b : {1, 2, 7}) cfg.rows[b] = 8, cfg.colsb[b] = 64;
  for (int c = 3; c <= 6; ++c) cfg.rows[c] = static_cast<uint8_t>(nt), cfg.colsb[c] = 64;
  amx_memory_barrier();
  _tile_loadconfig(&cfg);
  amx_configured_tokens = nt;
}

// Gives the thread's tile state back (a thread holding it makes every
// context switch save 8 KiB more).
inline void amx_release() {
  if (amx_configured_tokens == 0) return;
  _tile_release();
  amx_configured_tokens = 0;
}

// NG group pairs' unpacked super-block (w[g]) against NT tokens (rows
// y[0] + k * stride, as q4k_unit_tiles hands them), updating each (pair,
// token)'s a and m lanes (am[2 * (g * NT + t)] and the one after) in the gemm
// order (an fma per pair of sub-blocks) or the gemv order (one per
// super-block), with the float steps of q4k_pair_block.
template <bool kGemm, int NG, int NT>
inline void q4k_amx_block(const __m512i* const* w, const Q4KPairScales* const* s, const BlockQ8_K* const* y,
                          __m512* am) {
  static_assert(NG >= 1 && NG <= 2 && NT <= kAmxTokens);
  const size_t stride =
      NT > 1 ? static_cast<size_t>(reinterpret_cast<const uint8_t*>(y[1]) - reinterpret_cast<const uint8_t*>(y[0]))
             : sizeof(BlockQ8_K);
  // The mins' side too is a product: msum = sum over sub-blocks j of min_j
  // times the token's sum of sub-block j, i.e. the activations against a
  // matrix holding min_j in every step of sub-block j. Its steps are all
  // alike, so one 64-byte vector loaded with stride 0 is the tile.
  alignas(64) __m512i mins[NG][8];
  // Byte 0 (min 2k) or byte 2 (min 2k + 1) of each int32 lane, four times.
  const __m512i even = _mm512_set4_epi32(0x0c0c0c0c, 0x08080808, 0x04040404, 0x00000000);
  const __m512i odd = _mm512_add_epi8(even, _mm512_set1_epi8(2));
  for (int g = 0; g < NG; ++g) {
    for (int k = 0; k < 4; ++k) {  // mn[k]: (min 2k, min 2k + 1) as int16 in each row's lane
      mins[g][2 * k] = _mm512_shuffle_epi8(s[g]->mn[k], even);
      mins[g][2 * k + 1] = _mm512_shuffle_epi8(s[g]->mn[k], odd);
    }
  }
  amx_configure(NT);
  amx_memory_barrier();
  // [pair][sub-block][token][row]; the mins' sums per pair of sub-blocks in
  // the gemm order, one total in the gemv order.
  alignas(64) int32_t sums[NG][8][NT][16];
  alignas(64) int32_t msums[NG][kGemm ? 4 : 1][NT][16];
  _tile_zero(5);
  _tile_zero(6);
  // Unit g's sub-block j into tiles B (weights), SUM and MIN; a macro because
  // the intrinsics take tile numbers as literal tokens.
#define INFERD_AMX_UNIT_SUBBLOCK(g, B, SUM, MIN) \
  do {                                           \
    _tile_loadd(B, w[g] + 8 * j, 64);            \
    _tile_zero(SUM);                             \
    _tile_dpbsud(SUM, 0, B);                     \
    _tile_stored(SUM, sums[g][j], 64);           \
    _tile_loadd(7, &mins[g][j], 0);              \
    _tile_dpbsud(MIN, 0, 7);                     \
  } while (0)
  for (int j = 0; j < 8; ++j) {
    _tile_loadd(0, y[0]->qs + 32 * j, stride);
    INFERD_AMX_UNIT_SUBBLOCK(0, 1, 3, 5);
    if constexpr (NG == 2) INFERD_AMX_UNIT_SUBBLOCK(1, 2, 4, 6);
    if (kGemm ? j % 2 == 1 : j == 7) {
      _tile_stored(5, msums[0][kGemm ? j / 2 : 0], 64);
      _tile_zero(5);
      if constexpr (NG == 2) {
        _tile_stored(6, msums[1][kGemm ? j / 2 : 0], 64);
        _tile_zero(6);
      }
    }
  }
#undef INFERD_AMX_UNIT_SUBBLOCK
  // The scales as floats: a product of a sub-block sum and its scale is an
  // integer below 2^22 (|sum| <= 32 * 15 * 128, scale <= 63), and four of
  // them below 2^24, so they add exactly in floats, and the two halves'
  // float sum rounds as the int32 total's conversion does: the float steps
  // get the very floats q4k_pair_block gives them, for fewer instructions
  // than int32 multiplies.
  __m512 scf[NG][8];
  for (int g = 0; g < NG; ++g) {
    for (int j = 0; j < 8; ++j) scf[g][j] = _mm512_cvtepi32_ps(s[g]->sc[j]);
  }
  auto sum_f = [&](int g, int j, int t) { return _mm512_cvtepi32_ps(_mm512_load_si512(sums[g][j][t])); };
  auto msum_f = [&](int g, int k, int t) { return _mm512_cvtepi32_ps(_mm512_load_si512(msums[g][k][t])); };
  for (int t = 0; t < NT; ++t) {
    const __m512 dy = _mm512_set1_ps(y[t]->d);
    for (int g = 0; g < NG; ++g) {
      const Q4KPairScales& sc = *s[g];
      __m512* a = am + 2 * (g * NT + t);
      const __m512 sd = _mm512_mul_ps(sc.d, dy), sm = _mm512_mul_ps(sc.dmin, dy);
      if constexpr (kGemm) {
        for (int k = 0; k < 4; ++k) {
          const __m512 p = _mm512_fmadd_ps(sum_f(g, 2 * k, t), scf[g][2 * k],
                                           _mm512_mul_ps(sum_f(g, 2 * k + 1, t), scf[g][2 * k + 1]));
          a[0] = _mm512_fmadd_ps(p, sd, a[0]);
          a[1] = _mm512_fmadd_ps(msum_f(g, k, t), sm, a[1]);
        }
      } else {
        __m512 half[2];
        for (int h = 0; h < 2; ++h) {
          half[h] = _mm512_mul_ps(sum_f(g, 4 * h, t), scf[g][4 * h]);
          for (int j = 4 * h + 1; j < 4 * h + 4; ++j) half[h] = _mm512_fmadd_ps(sum_f(g, j, t), scf[g][j], half[h]);
        }
        a[0] = _mm512_fmadd_ps(_mm512_add_ps(half[0], half[1]), sd, a[0]);
        a[1] = _mm512_fmadd_ps(msum_f(g, 0, t), sm, a[1]);
      }
    }
  }
}

// AMX: a unit is a pair of groups, as with VNNI; blocks of two pairs by up to
// 16 tokens.
struct Q4KAmxUnits : Q4KPairUnits {
  static constexpr int kBlockUnits = 2, kBlockTokens = kAmxTokens;
  template <bool kGemm, int NG, int NT>
  static void block(const W* const* w, const Scales* const* s, const BlockQ8_K* const* y, Vec* am) {
    q4k_amx_block<kGemm, NG, NT>(w, s, y, am);
  }
};

// Steps of fewer tokens than this keep the VNNI kernels (kernels_bench's
// "repacked qwen15 ffn_up Q4_K decode" cases: AMX 1.2x at 6 tokens, 0.9x at
// 5, where a tile op's fixed cost is spread over too few tokens).
constexpr int64_t kQ4KAmxMinTokens = 6;

void q4k_groups_amx(const uint8_t* groups, int64_t n_groups, int64_t cols, const uint8_t* act, size_t act_stride,
                    int64_t nt, bool gemm, float* out, size_t out_stride) {
  if (nt >= kQ4KAmxMinTokens) {
    n_groups = q4k_pair_tiles<Q4KAmxUnits>(groups, n_groups, cols, act, act_stride, nt, gemm, out, out_stride);
    amx_release();
  }
  // Short steps, and a last odd group, by the other kernels.
  if (n_groups > 0) q4k_groups_x86(groups, n_groups, cols, act, act_stride, nt, gemm, out, out_stride);
}
