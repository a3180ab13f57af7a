// Whole matmuls against GGML's CPU backend, bit for bit: the kernels Linear
// runs (model/linear.cpp: packed groups for Q4_0/Q4_1/Q5_0/Q8_0, repacked
// Q4_K, matmul_rows_ggml on GGML rows for the rest; for Q4_K, Q4_0 and Q5_0
// also their GGML rows) for steps of N = 1, 2, 3, 4, 5, 8, 17 tokens (the Q4_0
// and Q5_0 cases at the end: N = 1..9, 12, 16, 17), at every SIMD level this
// machine has, with the rows split between "threads" in two ways. Data:
// tests/data/kernels/ggml_matmul_avx2.bin, made by
// tools/reference/ggml_matmul_reference.c from ggml_mul_mat on llama.cpp's CPU
// backend (AVX2 build, tinyBLAS and the repack buffer on), real rows of the
// Qwen2.5-Coder and Gemma 3 Q4_K_M files and random rows of other types.
// MXFP4 (ggml_matmul_mxfp4_avx2.bin and _avx512.bin, by the same tool with
// --mxfp4 against GGML's AVX2 and AVX-512 builds): ggml_mul_mat and
// ggml_mul_mat_id (gpt-oss's experts), in and outside the repack buffer, N = 1..9,
// 12, 16, 17; both builds' outputs are checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/kquant_layout.h"
#include "kernels/cpu/kquant_pack.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/quants.h"
#include "kernels_test_util.h"
#include "test_data.h"

namespace inferd::kernels {
namespace {

using testing::bits_of;
using testing::runnable_levels;

struct MatmulRun {
  int n = 0;
  std::vector<float> y;  // y[t * rows + r]
};

struct Case {
  std::string name;
  DType type = DType::F32;
  int rows = 0, cols = 0;
  uint32_t seed = 0;
  bool repacked = false;
  std::vector<uint8_t> w;
  std::vector<MatmulRun> runs;
};

template <class T>
T read_as(std::ifstream& in) {
  T v{};
  in.read(reinterpret_cast<char*>(&v), sizeof v);
  return v;
}

std::vector<Case> load(const std::string& file = "ggml_matmul_avx2.bin") {
  const std::string path = inferd::test::test_data_root() + "/kernels/" + file;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing " << path;
  char magic[8] = {};
  in.read(magic, 8);
  EXPECT_EQ(std::string(magic, 8), "IFMM0001");
  const uint32_t n = read_as<uint32_t>(in);
  std::vector<Case> cases(n);
  for (Case& c : cases) {
    char name[48];
    in.read(name, 48);
    c.name = std::string(name, strnlen(name, 48));
    c.type = static_cast<DType>(read_as<uint32_t>(in));
    c.rows = static_cast<int>(read_as<uint32_t>(in));
    c.cols = static_cast<int>(read_as<uint32_t>(in));
    c.seed = read_as<uint32_t>(in);
    c.repacked = read_as<uint32_t>(in) != 0;
    c.w.resize(read_as<uint64_t>(in));
    in.read(reinterpret_cast<char*>(c.w.data()), static_cast<std::streamsize>(c.w.size()));
    c.runs.resize(read_as<uint32_t>(in));
    for (MatmulRun& r : c.runs) {
      r.n = static_cast<int>(read_as<uint32_t>(in));
      r.y.resize(static_cast<size_t>(r.n) * c.rows);
      in.read(reinterpret_cast<char*>(r.y.data()), static_cast<std::streamsize>(r.y.size() * sizeof(float)));
    }
  }
  EXPECT_TRUE(in.good());
  return cases;
}

// make_activations of ggml_matmul_reference.c, operation for operation.
void make_activations(uint32_t seed, int t, int cols, float* x) {
  uint32_t s = seed * 2654435761u + static_cast<uint32_t>(t) * 40503u + 1u;
  const float k = static_cast<float>(1 + t % 5) * (1.0f / 8388608.0f);
  for (int c = 0; c < cols; ++c) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    x[c] = static_cast<float>(static_cast<int32_t>(s >> 8) - 8388608) * k;
  }
  if (t % 3 == 1) {
    for (int b = 0; b + 256 <= cols; b += 256) {
      x[b + 5] = -4.0f * static_cast<float>(1 + t % 5);
      x[b + 100] = 4.0f * static_cast<float>(1 + t % 5);
    }
  }
}

// The types whose every path (GgmlKernel of matmul.h) follows GGML's order.
bool matched(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::F16: case DType::BF16: case DType::F32: case DType::MXFP4:
      return true;
    default:
      return false;
  }
}

// y (n x rows) as Linear computes it with `table`: the packed kernels for the
// types Linear packs, repacked Q4_K for the weights llama.cpp repacks (or,
// with ggml_rows, Q4_K and Q4_0 on their GGML rows), else GGML rows; the rows
// split at `split` (two threads).
std::vector<float> linear_matmul(const KernelTable& table, const Case& c, const std::vector<float>& x, int n,
                                 int64_t split, bool ggml_rows = false) {
  std::vector<float> y(static_cast<size_t>(n) * c.rows, -1.0f);
  if (can_pack(c.type) && !ggml_rows) {
    const PackedMatrix w = PackedMatrix::pack(c.type, c.w.data(), c.rows, c.cols);
    PackedActivations a;
    a.resize(n, c.cols);
    quantize_packed_rows(x.data(), 0, n, a);
    const int64_t g = split / kPackRows;
    packed_matmul_groups_with(table, w, a, 0, g, y.data(), c.rows);
    packed_matmul_groups_with(table, w, a, g, w.groups(), y.data(), c.rows);
    return y;
  }
  std::vector<uint8_t> act(matmul_act_row_bytes(c.type, c.cols) * n);
  const std::vector<TokenPlace> places = one_chunk(n);  // the reference runs n tokens in one matmul
  matmul_quantize_rows_ggml_with(table, c.type, c.rows, x.data(), c.cols, 0, n, places.data(), act.data());
  if (RepackedQ4K::applies(c.type, c.rows) && !ggml_rows) {
    const RepackedQ4K w = RepackedQ4K::pack(c.w.data(), c.rows, c.cols);
    const int64_t s = split / kQ4KGroupRows * kQ4KGroupRows;
    repacked_q4k_rows_with(table, w, act.data(), n, places.data(), y.data(), c.rows, 0, s);
    repacked_q4k_rows_with(table, w, act.data(), n, places.data(), y.data(), c.rows, s, c.rows);
    return y;
  }
  matmul_rows_ggml_with(table, c.type, c.w.data(), c.rows, c.cols, act.data(), n, places.data(), y.data(), 0, split);
  matmul_rows_ggml_with(table, c.type, c.w.data(), c.rows, c.cols, act.data(), n, places.data(), y.data(), split,
                        c.rows);
  return y;
}

int check_cases(const std::vector<Case>& cases) {
  int checked = 0;
  for (const Case& c : cases) {
    // The reference's idea of the repack buffer is ours.
    EXPECT_EQ(c.repacked, ggml_repacked(c.type, c.rows)) << c.name;
    if (!matched(c.type)) continue;
    int max_n = 0;
    for (const MatmulRun& run : c.runs) max_n = std::max(max_n, run.n);
    std::vector<float> x(static_cast<size_t>(max_n) * c.cols);
    for (int t = 0; t < max_n; ++t) make_activations(c.seed, t, c.cols, x.data() + static_cast<size_t>(t) * c.cols);
    for (SimdLevel level : runnable_levels()) {
      const KernelTable table = build_kernel_table(level);
      for (const MatmulRun& run : c.runs) {
        for (int64_t split : {int64_t{0}, int64_t{c.rows / 2}, int64_t{c.rows}}) {
          for (bool ggml_rows : {false, true}) {
            // Q4_K, Q4_0 and Q5_0 have a kernel of GGML's order on the GGML rows
            // too (Q4_1's row kernel pairs blocks: Linear runs it packed only).
            if (ggml_rows && !RepackedQ4K::applies(c.type, c.rows) && c.type != DType::Q4_0 &&
                c.type != DType::Q5_0 && c.type != DType::MXFP4) {
              continue;
            }
            const std::vector<float> y = linear_matmul(table, c, x, run.n, split, ggml_rows);
            int bad = 0;
            for (size_t i = 0; i < y.size(); ++i) {
              if (bits_of(y[i]) != bits_of(run.y[i]) && bad++ < 3) {
                ADD_FAILURE() << c.name << " at " << testing::level_name(level) << " N=" << run.n
                              << " split=" << split << (ggml_rows ? " (GGML rows)" : "") << ": token " << i / c.rows
                              << " row " << i % c.rows << " got " << y[i] << " want " << run.y[i];
              }
            }
          }
        }
        ++checked;
      }
    }
  }
  return checked;
}

TEST(KernelsGgmlMatmul, MatchesGgmlCpuBackendBitForBit) {
  const std::vector<Case> cases = load();
  ASSERT_GE(cases.size(), 13u);
  EXPECT_GT(check_cases(cases), 0);
}

// MXFP4 sums in the same order in GGML's two builds (vec_dot has no AVX-512
// code; the repacked gemm's AVX-512 tiles take the same float steps as its
// AVX2 ones), so the same kernels must give both builds' bits.
TEST(KernelsGgmlMatmul, Mxfp4MatchesBothGgmlBuildsBitForBit) {
  for (const char* file : {"ggml_matmul_mxfp4_avx2.bin", "ggml_matmul_mxfp4_avx512.bin"}) {
    SCOPED_TRACE(file);
    const std::vector<Case> cases = load(file);
    ASSERT_EQ(cases.size(), 14u);
    int repacked = 0;
    for (const Case& c : cases) {
      EXPECT_EQ(c.type, DType::MXFP4) << c.name;
      repacked += c.repacked;
    }
    EXPECT_EQ(repacked, 7);  // 3 mul_mat and 2 x 2 mul_mat_id cases in the repack buffer
    EXPECT_GT(check_cases(cases), 0);
  }
}

// Threads that share a token's row quantize its blocks apart (Linear::
// quantize_blocks): every span of blocks must get the bytes the whole row gets,
// for every input type and every order's quantizer (the repacked Q4_K gemm's
// tokens have their own), at every level. The matmuls above then hold.
TEST(KernelsGgmlMatmul, InputBlocksQuantizeAsTheirRow) {
  const int64_t cols = 1024, n = 5;  // five tokens of one chunk: four in the repacked gemm, one in its gemv
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (int t = 0; t < n; ++t) make_activations(7, t, static_cast<int>(cols), x.data() + t * cols);
  x[3] = -x[3] * 1000.0f;  // a row whose largest magnitude is negative (Q8_K's scale takes its sign)
  const std::vector<TokenPlace> places = one_chunk(n);
  for (SimdLevel level : runnable_levels()) {
    const KernelTable table = build_kernel_table(level);
    for (DType w : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                    DType::F16, DType::BF16, DType::F32, DType::MXFP4}) {
      const int64_t rows = 64;  // Q4_K and Q4_0 in llama.cpp's repack buffer
      const size_t row = matmul_act_row_bytes(w, cols);
      std::vector<uint8_t> whole(row * n), blocks(row * n, 0xAB);
      matmul_quantize_rows_ggml_with(table, w, rows, x.data(), cols, 0, n, places.data(), whole.data());
      const int64_t nb = cols / matmul_act_block(w);
      for (int64_t t = 0; t < n; ++t) {
        // Three uneven spans, the last one block long.
        const int64_t cut1 = nb / 3, cut2 = nb - 1;
        for (auto [b0, b1] : {std::pair{cut2, nb}, std::pair{int64_t{0}, cut1}, std::pair{cut1, cut2}})
          matmul_quantize_blocks_ggml_with(table, w, rows, x.data() + t * cols, cols, b0, b1, places[t],
                                           blocks.data() + t * row);
      }
      EXPECT_EQ(whole, blocks) << dtype_name(w) << " at " << testing::level_name(level);
    }
  }
}

}  // namespace
}  // namespace inferd::kernels
