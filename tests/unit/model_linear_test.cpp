// Linear on the weights the fast tier leaves to the exact kernels (F32, as a
// mixture's router; F16 whose columns do not fill the BF16 product's blocks):
// GGML sums them in an order that depends on the token's chunk (tinyBLAS from
// two tokens, ggml_vec_dot for one), and the exact tier follows that, but the
// fast tier promises that a token's result depends on its own row only.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/quants.h"
#include "model/linear.h"

namespace inferd {
namespace {

struct Case {
  DType type;
  int64_t rows, cols;
};

// Each token's outputs computed as one chunk of n tokens and as n one-token
// steps; how many tokens got other bits.
int64_t tokens_that_differ(const Linear& lin, const std::vector<float>& x, int64_t n) {
  const int64_t rows = lin.rows(), cols = lin.cols();
  const std::vector<kernels::TokenPlace> chunk = kernels::one_chunk(n);
  LinearInput in;
  lin.prepare(in, n);
  lin.quantize(x.data(), 0, n, {n, chunk.data()}, in);
  std::vector<float> together(n * rows);
  lin.compute(in, {n, chunk.data()}, together.data(), 0, 1);

  const std::vector<kernels::TokenPlace> one = kernels::one_chunk(1);
  int64_t differ = 0;
  for (int64_t t = 0; t < n; ++t) {
    LinearInput in1;
    lin.prepare(in1, 1);
    lin.quantize(x.data() + t * cols, 0, 1, {1, one.data()}, in1);
    std::vector<float> alone(rows);
    lin.compute(in1, {1, one.data()}, alone.data(), 0, 1);
    differ += std::memcmp(alone.data(), together.data() + t * rows, rows * sizeof(float)) != 0;
  }
  return differ;
}

TEST(Linear, FastTierSumsEveryTokenOfAChunkAsItSumsItAlone) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const kernels::GgmlFlavour flavour : {kernels::GgmlFlavour::kAvx2, kernels::GgmlFlavour::kAvx512}) {
    for (const Case c : {Case{DType::F32, 16, 32}, Case{DType::F32, 64, 256}, Case{DType::F16, 16, 40}}) {
      std::vector<float> values(c.rows * c.cols);
      for (float& v : values) v = dist(rng);
      std::vector<uint8_t> bytes(row_bytes(c.type, c.cols) * c.rows);
      for (int64_t r = 0; r < c.rows; ++r)
        kernels::quantize_row(c.type, values.data() + r * c.cols, bytes.data() + r * row_bytes(c.type, c.cols),
                              c.cols);
      const WeightView w{c.type, bytes.data(), c.cols, c.rows};
      const int64_t n = 33;
      std::vector<float> x(n * c.cols);
      for (float& v : x) v = dist(rng);
      const std::string what = std::string(info(c.type).name) + " " + std::to_string(c.rows) + "x" +
                                std::to_string(c.cols) +
                                (flavour == kernels::GgmlFlavour::kAvx512 ? ", AVX-512 order" : ", AVX2 order");

      const Linear fast = Linear::make(w, nullptr, flavour, kernels::Numerics::kFast);
      ASSERT_FALSE(fast.fast() || fast.bf16()) << what << ": not a case the fast tier leaves to the exact kernels";
      EXPECT_EQ(tokens_that_differ(fast, x, n), 0) << what;
      // The exact tier keeps llama.cpp's chunk-dependent order: the same
      // inputs do give other bits there, so the check above is not vacuous.
      const Linear exact = Linear::make(w, nullptr, flavour, kernels::Numerics::kExact);
      EXPECT_GT(tokens_that_differ(exact, x, n), 0) << what;
    }
  }
}

// The loader gives a weight's file pages back as make() reports its rows
// copied (CpuExecutor): a row once reported must never be read again. Each
// report here overwrites the source's reported rows with garbage, and the
// product must still be the one from an untouched source; the reports must
// come in steps and end at the last row.
TEST(Linear, ReportsRowsCopiedOnlyOnceNoLongerRead) {
  struct PathCase {
    DType type;
    kernels::Numerics numerics;
    int64_t rows;
    const char* path;
  };
  const int64_t cols = 256, n = 5;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const PathCase c : {PathCase{DType::Q4_1, kernels::Numerics::kExact, 2500, "packed"},
                           PathCase{DType::Q4_K, kernels::Numerics::kExact, 2504, "repacked Q4_K"},
                           PathCase{DType::Q6_K, kernels::Numerics::kExact, 2500, "copied as is"},
                           PathCase{DType::Q4_1, kernels::Numerics::kFast, 2500, "fast"},
                           PathCase{DType::F16, kernels::Numerics::kFast, 2500, "BF16 product"}}) {
    const std::string what = std::string(info(c.type).name) + " (" + c.path + ")";
    const size_t row = row_bytes(c.type, cols);
    std::vector<float> values(c.rows * cols);
    for (float& v : values) v = dist(rng);
    std::vector<uint8_t> bytes(row * c.rows);
    for (int64_t r = 0; r < c.rows; ++r) kernels::quantize_row(c.type, values.data() + r * cols, bytes.data() + r * row, cols);
    std::vector<uint8_t> scribbled = bytes;
    const WeightView w{c.type, bytes.data(), cols, c.rows};
    const WeightView w_scribbled{c.type, scribbled.data(), cols, c.rows};

    kernels::PackedArena arena_a(Linear::packed_bytes(w, c.numerics)), arena_b(Linear::packed_bytes(w, c.numerics));
    const Linear untouched = Linear::make(w, &arena_a, kernels::GgmlFlavour::kAvx2, c.numerics);
    std::vector<int64_t> reports;
    const Linear linear = Linear::make(w_scribbled, &arena_b, kernels::GgmlFlavour::kAvx2, c.numerics, [&](int64_t done) {
      std::memset(scribbled.data(), 0xA5, row * static_cast<size_t>(done));
      reports.push_back(done);
    });
    ASSERT_TRUE(linear.reads_copy()) << what;
    EXPECT_EQ(reports, (std::vector<int64_t>{1024, 2048, c.rows})) << what;

    std::vector<float> x(n * cols);
    for (float& v : x) v = dist(rng);
    const std::vector<kernels::TokenPlace> chunk = kernels::one_chunk(n);
    std::vector<float> want(n * c.rows), got(n * c.rows);
    for (const auto& [lin, y] : {std::pair{&untouched, &want}, std::pair{&linear, &got}}) {
      LinearInput in;
      lin->prepare(in, n);
      lin->quantize(x.data(), 0, n, {n, chunk.data()}, in);
      lin->compute(in, {n, chunk.data()}, y->data(), 0, 1);
    }
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << what;
  }
}

}  // namespace
}  // namespace inferd
