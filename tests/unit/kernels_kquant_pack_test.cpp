// Repacked Q4_K (kernels/cpu/kquant_pack.h) against the GGML-row kernels it
// replaces, bit for bit: the scalar reference's repacked gemv and gemm orders
// (matmul_rows_ggml_with on the scalar table, itself checked against GGML's
// own output by kernels_ggml_matmul_test) at every SIMD level, for decode
// steps, prompt chunks, mixed batches of sequences, token counts that cross
// the kernels' token tiles and blocks, odd numbers of row groups, row splits,
// and the integer extremes the int16 sums are sized for.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/kquant_layout.h"
#include "kernels/cpu/kquant_pack.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/quants_blocks.h"
#include "kernels_test_util.h"

namespace inferd::kernels {
namespace {

using testing::bits_of;
using testing::level_name;
using testing::random_floats;
using testing::runnable_levels;

std::vector<uint8_t> random_q4k(std::mt19937& rng, int64_t rows, int64_t cols) {
  std::vector<uint8_t> w(row_bytes(DType::Q4_K, cols) * rows);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> x = random_floats(rng, cols, 0.1f);
    ref::quantize_row(DType::Q4_K, x.data(), w.data() + r * row_bytes(DType::Q4_K, cols), cols);
  }
  return w;
}

// Places of tokens from sequences with these chunk sizes, laid end to end.
std::vector<TokenPlace> chunks(std::initializer_list<int> sizes) {
  std::vector<TokenPlace> p;
  for (int n : sizes) {
    for (int i = 0; i < n; ++i) p.push_back({n, i});
  }
  return p;
}

// y (n x rows) of the repacked matrix with `table`, the rows split at `split`.
std::vector<float> repacked_y(const KernelTable& table, const RepackedQ4K& w, const std::vector<uint8_t>& act,
                              const std::vector<TokenPlace>& places, int64_t split) {
  const int64_t n = static_cast<int64_t>(places.size());
  std::vector<float> y(static_cast<size_t>(n * w.rows()), -1.0f);
  repacked_q4k_rows_with(table, w, act.data(), n, places.data(), y.data(), w.rows(), 0, split);
  repacked_q4k_rows_with(table, w, act.data(), n, places.data(), y.data(), w.rows(), split, w.rows());
  return y;
}

// Checks the repacked kernels at every level against the scalar GGML-row
// kernels for weights w (rows x cols) and activations x (one row per place).
void check(const std::vector<uint8_t>& wbytes, int64_t rows, int64_t cols, const std::vector<float>& x,
           const std::vector<TokenPlace>& places, const char* what) {
  const int64_t n = static_cast<int64_t>(places.size());
  const KernelTable scalar = build_kernel_table(SimdLevel::kScalar);
  std::vector<uint8_t> act(matmul_act_row_bytes(DType::Q4_K, cols) * n);
  matmul_quantize_rows_ggml_with(scalar, DType::Q4_K, rows, x.data(), cols, 0, n, places.data(), act.data());
  std::vector<float> want(static_cast<size_t>(n * rows));
  matmul_rows_ggml_with(scalar, DType::Q4_K, wbytes.data(), rows, cols, act.data(), n, places.data(), want.data(), 0,
                        rows);
  const RepackedQ4K w = RepackedQ4K::pack(wbytes.data(), rows, cols);
  for (SimdLevel level : runnable_levels()) {
    const KernelTable table = build_kernel_table(level);
    for (int64_t split : {int64_t{0}, rows / 16 * 8, rows}) {
      const std::vector<float> y = repacked_y(table, w, act, places, split);
      int bad = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        if (bits_of(y[i]) != bits_of(want[i]) && bad++ < 3) {
          ADD_FAILURE() << what << " " << rows << "x" << cols << " N=" << n << " at " << level_name(level)
                        << " split=" << split << ": token " << i / rows << " row " << i % rows << " got " << y[i]
                        << " want " << want[i];
        }
      }
    }
  }
}

TEST(KernelsRepackedQ4K, PackUnpackRoundTrip) {
  std::mt19937 rng(1);
  const int64_t rows = 24, cols = 768;
  const std::vector<uint8_t> w = random_q4k(rng, rows, cols);
  const RepackedQ4K p = RepackedQ4K::pack(w.data(), rows, cols);
  ASSERT_EQ(p.groups(), 3);
  EXPECT_EQ(p.rows_bytes(0, rows).second, w.size());
  EXPECT_EQ(p.rows_bytes(8, 16).second, w.size() / 3);
  std::vector<uint8_t> row(row_bytes(DType::Q4_K, cols));
  for (int64_t r = 0; r < rows; ++r) {
    p.unpack_row(r, row.data());
    EXPECT_EQ(0, std::memcmp(row.data(), w.data() + r * row.size(), row.size())) << "row " << r;
  }
}

TEST(KernelsRepackedQ4K, AppliesWhereLlamaCppRepacks) {
  EXPECT_TRUE(RepackedQ4K::applies(DType::Q4_K, 1536));
  EXPECT_FALSE(RepackedQ4K::applies(DType::Q4_K, 1540));
  EXPECT_FALSE(RepackedQ4K::applies(DType::Q6_K, 1536));
}

TEST(KernelsRepackedQ4K, MatchesGgmlRowsInEveryOrder) {
  std::mt19937 rng(2);
  struct Shape {
    int64_t rows, cols;
  };
  // 8960 columns: a token tile of 19 activation rows, so 40 and 70 tokens cross tiles.
  for (const Shape s : {Shape{8, 256}, Shape{24, 1536}, Shape{40, 512}, Shape{16, 8960}}) {
    const std::vector<uint8_t> w = random_q4k(rng, s.rows, s.cols);
    for (int n : {1, 2, 3, 4, 5, 7, 8, 9, 17, 40, 70}) {
      const std::vector<float> x = random_floats(rng, n * s.cols);
      check(w, s.rows, s.cols, x, one_chunk(n), "one chunk");
    }
    // A batch: decoding sequences (gemv), prompt chunks (gemm for the first
    // n - n % 4 tokens, gemv for the rest), interleaved.
    const std::vector<TokenPlace> mixed = chunks({1, 1, 6, 1, 13, 4, 1, 2, 9});
    check(w, s.rows, s.cols, random_floats(rng, static_cast<int64_t>(mixed.size()) * s.cols), mixed, "mixed");
    // Batches of decoding sequences: the gemv order for every token of one call.
    for (int n : {5, 6, 11, 16, 70}) {  // a stream, chunks of streams, tiles
      const std::vector<TokenPlace> decode(static_cast<size_t>(n), TokenPlace{1, 0});
      check(w, s.rows, s.cols, random_floats(rng, n * s.cols), decode, "decode batch");
    }
  }
}

TEST(KernelsRepackedQ4K, IntegerExtremes) {
  // Every nibble 15 with the largest scales and mins, against activations that
  // quantize to +-127 throughout: the int16 sums at their bound (8 x 2 x 15 x 127).
  std::mt19937 rng(3);
  const int64_t rows = 16, cols = 512;
  std::vector<uint8_t> w = random_q4k(rng, rows, cols);
  BlockQ4_K* blocks = reinterpret_cast<BlockQ4_K*>(w.data());
  for (int64_t b = 0; b < rows * cols / kQK_K; ++b) {
    if (b % 3 == 0) continue;  // keep some ordinary blocks
    std::memset(blocks[b].qs, 0xff, sizeof blocks[b].qs);
    std::memset(blocks[b].scales, 0xff, sizeof blocks[b].scales);  // every scale and min 63
  }
  // The AMX kernels' float sums of scaled sub-block sums are exact only below
  // 2^24: 20 tokens take them, in one chunk (gemm order) and as 20 decoding
  // sequences (gemv order).
  for (float sign : {1.0f, -1.0f}) {
    for (int n : {9, 20}) {
      std::vector<float> x(static_cast<size_t>(n * cols), sign * 3.0f);
      for (int64_t i = 0; i < n * cols; i += 7) x[i] = -sign * 3.0f;  // both extremes
      check(w, rows, cols, x, one_chunk(n), "extremes");
      check(w, rows, cols, x, std::vector<TokenPlace>(static_cast<size_t>(n), TokenPlace{1, 0}), "extremes, decode");
    }
  }
}

// The GGML-order tile kernels of every level (the K-quants' tiled order, the
// repacked Q4_K gemv and gemm orders on GGML rows, Q6_K's vec_dot) against the
// scalar table's, at shapes past every edge of their row groups and token
// blocks, with both output layouts, and with every quant at its largest.
TEST(KernelsGgmlOrderTiles, MatchScalarAtEveryShape) {
  std::mt19937 rng(4);
  const KernelTable scalar = build_kernel_table(SimdLevel::kScalar);
  const int max_rows = 41, max_tokens = 70;
  for (DType t : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    for (const int64_t n : {int64_t{512}, int64_t{1280}}) {
      for (bool extreme : {false, true}) {
        const size_t as = row_bytes(t, n), bs = row_bytes(DType::Q8_K, n);
        std::vector<uint8_t> a(as * max_rows), b(bs * max_tokens);
        for (int r = 0; r < max_rows; ++r) {
          const std::vector<float> x = random_floats(rng, n, 0.1f);
          ref::quantize_row(t, x.data(), a.data() + r * as, n);
        }
        if (extreme) {
          // Every quant byte and scale byte all ones: the largest quants (and,
          // for Q6_K, scales of -1), so the int16 sums reach their bounds.
          for (int64_t r = 0; r < max_rows; r += 2) std::memset(a.data() + r * as, 0xff, as);
          for (int64_t r = 0; r < max_rows; r += 2) {
            for (int64_t i = 0; i < n / kQK_K; ++i) {  // keep d finite: f16 0x3c00 = 1
              const size_t bb = as / (n / kQK_K);
              uint8_t* blk = a.data() + r * as + i * bb;
              const uint16_t one = 0x3c00;
              if (t == DType::Q6_K) std::memcpy(blk + bb - 2, &one, 2);
              if (t == DType::Q3_K) std::memcpy(blk + bb - 2, &one, 2);
              if (t == DType::Q2_K) std::memcpy(blk + bb - 4, &one, 2), std::memcpy(blk + bb - 2, &one, 2);
              if (t == DType::Q4_K || t == DType::Q5_K) std::memcpy(blk, &one, 2), std::memcpy(blk + 2, &one, 2);
            }
          }
        }
        for (int tok = 0; tok < max_tokens; ++tok) {
          std::vector<float> x = random_floats(rng, n);
          if (extreme && tok % 2 == 0) {
            for (int64_t i = 0; i < n; ++i) x[i] = (i % 5 == 0) == (tok % 4 == 0) ? 2.0f : -2.0f;
          }
          ref::quantize_row(DType::Q8_K, x.data(), b.data() + tok * bs, n);
        }
        const TypeKernels& want_k = scalar.type[static_cast<uint32_t>(t)];
        for (SimdLevel level : runnable_levels()) {
          const TypeKernels& k = build_kernel_table(level).type[static_cast<uint32_t>(t)];
          struct Order {
            const char* name;
            GemmTileFn got, want;
          };
          const Order orders[] = {{"vec_dot", k.gemm_tile, want_k.gemm_tile},
                                  {"tiled", k.tiled_tile, want_k.tiled_tile},
                                  {"repack gemv", k.repack_tile, want_k.repack_tile},
                                  {"repack gemm", k.repack_gemm_tile, want_k.repack_gemm_tile}};
          for (const Order& o : orders) {
            const bool vec_dot = std::string(o.name) == "vec_dot";
            // The vec_dot order: the scalar table has no tile for it, its
            // vec_dot per pair.
            if (o.got == nullptr || (!vec_dot && o.want == nullptr)) continue;
            for (int nr : {1, 7, 8, 9, 16, 17, 25, 32, 41}) {  // AVX-512: 16-row pairs, two per pass
              for (int nt : {1, 2, 3, 5, 8, 9, 33, 64, 70}) {
                for (bool rows_inner : {true, false}) {
                  const size_t ors = rows_inner ? 1 : max_tokens, ots = rows_inner ? max_rows : 1;
                  std::vector<float> got(static_cast<size_t>(max_rows) * max_tokens, NAN), want = got;
                  o.got(n, a.data(), as, nr, b.data(), bs, nt, got.data(), ors, ots);
                  if (vec_dot) {
                    for (int r = 0; r < nr; ++r) {
                      for (int tk = 0; tk < nt; ++tk) {
                        want[r * ors + tk * ots] = want_k.vec_dot(n, a.data() + r * as, b.data() + tk * bs);
                      }
                    }
                  } else {
                    o.want(n, a.data(), as, nr, b.data(), bs, nt, want.data(), ors, ots);
                  }
                  for (int r = 0; r < nr; ++r) {
                    for (int tk = 0; tk < nt; ++tk) {
                      ASSERT_EQ(bits_of(got[r * ors + tk * ots]), bits_of(want[r * ors + tk * ots]))
                          << dtype_name(t) << " " << o.name << " n=" << n << (extreme ? " extreme" : "") << " tile "
                          << nr << "x" << nt << " row " << r << " token " << tk << " at " << level_name(level);
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

// Q5_0 and Q8_0 tiles of every level (the decode kernel for steps of up to
// three tokens, the prefill tiles past that) against the scalar vec_dot (GGML's
// order) per pair, with block counts that are not multiples of eight.
TEST(KernelsGgmlOrderTiles, SymmetricTilesMatchScalarVecDot) {
  std::mt19937 rng(5);
  const KernelTable scalar = build_kernel_table(SimdLevel::kScalar);
  const int max_rows = 21, max_tokens = 9;
  for (DType t : {DType::Q5_0, DType::Q8_0}) {
    for (const int64_t n : {int64_t{352}, int64_t{896}, int64_t{1024}}) {
      for (bool extreme : {false, true}) {
        const size_t as = row_bytes(t, n), bs = row_bytes(DType::Q8_0, n);
        std::vector<uint8_t> a(as * max_rows), b(bs * max_tokens);
        for (int r = 0; r < max_rows; ++r) {
          const std::vector<float> x = random_floats(rng, n, 0.1f);
          ref::quantize_row(t, x.data(), a.data() + r * as, n);
          if (extreme && r % 2 == 0) {
            // Every quant at its largest (Q5_0: 15, Q8_0: -128 and 127), d = 1.
            const size_t block = row_bytes(t, kQK);
            for (int64_t i = 0; i < n / kQK; ++i) {
              uint8_t* blk = a.data() + r * as + i * block;
              std::memset(blk + 2, t == DType::Q8_0 ? (i % 2 ? 0x80 : 0x7f) : 0xff, block - 2);
              const uint16_t one = 0x3c00;
              std::memcpy(blk, &one, 2);
            }
          }
        }
        for (int tok = 0; tok < max_tokens; ++tok) {
          std::vector<float> x = random_floats(rng, n);
          if (extreme && tok % 2 == 0) {
            for (int64_t i = 0; i < n; ++i) x[i] = (i % 5 == 0) == (tok % 4 == 0) ? 2.0f : -2.0f;
          }
          scalar.quantize_q8_0_cpu(x.data(), b.data() + tok * bs, n);
        }
        const TypeKernels& want_k = scalar.type[static_cast<uint32_t>(t)];
        for (SimdLevel level : runnable_levels()) {
          const TypeKernels& k = build_kernel_table(level).type[static_cast<uint32_t>(t)];
          for (int nr : {1, 2, 16, 21}) {
            for (int nt : {1, 2, 3, 4, 9}) {
              for (bool rows_inner : {true, false}) {
                const size_t ors = rows_inner ? 1 : max_tokens, ots = rows_inner ? max_rows : 1;
                std::vector<float> got(static_cast<size_t>(max_rows) * max_tokens, NAN);
                if (k.gemm_tile != nullptr) k.gemm_tile(n, a.data(), as, nr, b.data(), bs, nt, got.data(), ors, ots);
                for (int r = 0; r < nr; ++r) {
                  for (int tk = 0; tk < nt; ++tk) {
                    const float want = want_k.vec_dot(n, a.data() + r * as, b.data() + tk * bs);
                    if (k.gemm_tile == nullptr) got[r * ors + tk * ots] = want;  // the scalar level: vec_dot only
                    ASSERT_EQ(bits_of(got[r * ors + tk * ots]), bits_of(want))
                        << dtype_name(t) << " n=" << n << (extreme ? " extreme" : "") << " tile " << nr << "x" << nt
                        << " row " << r << " token " << tk << " at " << level_name(level);
                    ASSERT_EQ(bits_of(k.vec_dot(n, a.data() + r * as, b.data() + tk * bs)), bits_of(want));
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

// Q5_1's tiles (GGML's vec_dot order at every step size) and the float
// weights' tinyBLAS tiles of every level against the scalar table, at tile
// shapes past the 4-row and 3-token register blocks, rows whose length is not
// a multiple of the kernels' steps (Q5_1: odd block counts; floats: 8-element
// steps with and without a 32-element remainder), and extreme values.
TEST(KernelsGgmlOrderTiles, Q5_1AndFloatTilesMatchScalar) {
  std::mt19937 rng(6);
  const KernelTable scalar = build_kernel_table(SimdLevel::kScalar);
  const int max_rows = 11, max_tokens = 8;
  for (DType t : {DType::Q5_1, DType::F32, DType::F16, DType::BF16}) {
    const bool q = t == DType::Q5_1;
    for (const int64_t n : q ? std::vector<int64_t>{32, 96, 1056} : std::vector<int64_t>{8, 24, 40, 1040}) {
      for (bool extreme : {false, true}) {
        const DType at = vec_dot_type(t);
        const size_t as = row_bytes(t, n), bs = row_bytes(at, n);
        std::vector<uint8_t> a(as * max_rows), b(bs * max_tokens);
        for (int r = 0; r < max_rows; ++r) {
          std::vector<float> x = random_floats(rng, n, 0.1f);
          if (extreme && r % 2 == 0) {
            for (int64_t i = 0; i < n; ++i) x[i] = (i % 3 == 0) ? 6e4f : -1e-7f * static_cast<float>(i);
          }
          ref::quantize_row(t, x.data(), a.data() + r * as, n);
        }
        for (int tok = 0; tok < max_tokens; ++tok) {
          std::vector<float> x = random_floats(rng, n);
          if (extreme && tok % 2 == 0) {
            for (int64_t i = 0; i < n; ++i) x[i] = (i % 5 == 0) == (tok % 4 == 0) ? 2.0f : -2.0f;
          }
          ref::quantize_row(at, x.data(), b.data() + tok * bs, n);
        }
        const TypeKernels& want_k = scalar.type[static_cast<uint32_t>(t)];
        for (SimdLevel level : runnable_levels()) {
          const TypeKernels& k = build_kernel_table(level).type[static_cast<uint32_t>(t)];
          for (bool tinyblas : {false, true}) {
            if (tinyblas && q) continue;
            const GemmTileFn got_fn = tinyblas ? k.tinyblas_tile : k.gemm_tile;
            ASSERT_TRUE(!tinyblas || (got_fn != nullptr && want_k.tinyblas_tile != nullptr)) << dtype_name(t);
            for (int nr : {1, 3, 4, 5, 8, 11}) {
              for (int nt : {1, 2, 3, 4, 7, 8}) {
                std::vector<float> got(static_cast<size_t>(max_rows) * max_tokens, NAN), want = got;
                if (tinyblas) {
                  got_fn(n, a.data(), as, nr, b.data(), bs, nt, got.data(), 1, max_rows);
                  want_k.tinyblas_tile(n, a.data(), as, nr, b.data(), bs, nt, want.data(), 1, max_rows);
                } else {
                  for (int r = 0; r < nr; ++r) {
                    for (int tk = 0; tk < nt; ++tk) {
                      const uint8_t* ar = a.data() + r * as;
                      const uint8_t* bt = b.data() + tk * bs;
                      want[tk * max_rows + r] = want_k.vec_dot(n, ar, bt);
                      if (got_fn == nullptr) got[tk * max_rows + r] = k.vec_dot(n, ar, bt);
                    }
                  }
                  if (got_fn != nullptr) got_fn(n, a.data(), as, nr, b.data(), bs, nt, got.data(), 1, max_rows);
                }
                for (int r = 0; r < nr; ++r) {
                  for (int tk = 0; tk < nt; ++tk) {
                    ASSERT_EQ(bits_of(got[tk * max_rows + r]), bits_of(want[tk * max_rows + r]))
                        << dtype_name(t) << (tinyblas ? " tinyBLAS" : " vec_dot") << " n=" << n
                        << (extreme ? " extreme" : "") << " tile " << nr << "x" << nt << " row " << r << " token "
                        << tk << " at " << level_name(level);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace inferd::kernels
