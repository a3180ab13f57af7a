// Helpers shared by the kernels_* unit tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/quants.h"

namespace inferd::kernels::testing {

inline const std::vector<DType>& weight_types() {
  static const std::vector<DType> types = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0,
                                           DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                                           DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K,
                                           DType::Q6_K, DType::MXFP4};
  return types;
}

inline const std::vector<DType>& all_types() {
  static const std::vector<DType> types = {
      DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
      DType::Q8_0, DType::Q8_1, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K,
      DType::Q8_K};
  return types;
}

// Every SIMD level this machine can run, scalar first.
inline std::vector<SimdLevel> runnable_levels() {
  std::vector<SimdLevel> levels;
  for (int l = 0; l <= static_cast<int>(best_simd_level()); ++l) levels.push_back(static_cast<SimdLevel>(l));
  return levels;
}

inline const char* level_name(SimdLevel l) {
  return l == SimdLevel::kScalar ? "scalar" : l == SimdLevel::kAvx2 ? "avx2" : l == SimdLevel::kAvx512 ? "avx512" : "amx";
}

inline std::vector<float> random_floats(std::mt19937& rng, int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

inline std::vector<uint8_t> quantize_ref(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(row_bytes(t, static_cast<int64_t>(x.size())));
  ref::quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

inline std::vector<float> dequantize_ref(DType t, const void* q, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  ref::dequantize_row(t, q, x.data(), n);
  return x;
}

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// A weight matrix (rows x cols of `type`, quantized by the reference) and
// n_tokens activation rows, both random.
struct Problem {
  DType type;
  int64_t rows, cols, n_tokens;
  std::vector<uint8_t> w;  // rows x cols of `type`
  std::vector<float> x;    // n_tokens x cols
};

inline Problem make_problem(std::mt19937& rng, DType t, int64_t rows, int64_t cols, int64_t n_tokens) {
  Problem p{t, rows, cols, n_tokens, {}, random_floats(rng, n_tokens * cols)};
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<uint8_t> row = quantize_ref(t, random_floats(rng, cols, 0.1f));
    p.w.insert(p.w.end(), row.begin(), row.end());
  }
  return p;
}

// Random f16 keys and values of n_pos positions in blocks of `block` slots
// of kv_heads heads of D, `layers` layers a block (the view reads the
// second), the blocks in shuffled order: a cache laid out as the executor's.
struct RandomPagedCache {
  std::vector<uint16_t> k, v;
  std::vector<int32_t> table;
  PagedKV kv;
  RandomPagedCache(int64_t D, int64_t n_pos, int64_t block, int64_t layers, int64_t kv_heads, std::mt19937& rng) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const int64_t n_blocks = (n_pos + block - 1) / block, slot = kv_heads * D, layer_elements = block * slot;
    k.resize(static_cast<size_t>(n_blocks * layers * layer_elements));
    v.resize(k.size());
    for (size_t i = 0; i < k.size(); ++i) k[i] = f32_to_f16(dist(rng)), v[i] = f32_to_f16(dist(rng));
    table.resize(static_cast<size_t>(n_blocks));
    for (int64_t b = 0; b < n_blocks; ++b) table[b] = static_cast<int32_t>(b);
    std::shuffle(table.begin(), table.end(), rng);
    kv = PagedKV{k.data() + layer_elements, v.data() + layer_elements, slot, block, table.data(), DType::F16,
                 static_cast<int64_t>(layers * layer_elements * sizeof(uint16_t))};
  }
  RandomPagedCache(const RandomPagedCache&) = delete;  // kv points into k, v and table
};

// A causal prompt's tile: token i at position first + i reads
// [begin_i, first + i + 1), begin_i moved by a sliding window (0: none).
inline std::pair<std::vector<int64_t>, std::vector<int64_t>> causal_ranges(int64_t n_tokens, int64_t first, int64_t window) {
  std::vector<int64_t> begin, end;
  for (int64_t i = 0; i < n_tokens; ++i) {
    const int64_t pos = first + i;
    begin.push_back(window > 0 && pos + 1 > window ? pos + 1 - window : 0);
    end.push_back(pos + 1);
  }
  return {begin, end};
}

}  // namespace inferd::kernels::testing
