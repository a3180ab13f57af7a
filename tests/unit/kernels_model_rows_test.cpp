// Decodes rows of the real test models (raw bytes read at known file offsets)
// and compares them with what the gguf Python package dequantized
// (tests/data/kernels/gguf_py_reference.txt, made by
// tools/reference/kernels_make_expected.py). Skips when the models are absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kernels_test_util.h"
#include "test_data.h"

namespace inferd::kernels {
namespace {

std::string model_dir() {
  if (const char* env = std::getenv("INFERD_MODEL_DIR")) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/inferd/models";
}

struct Row {
  std::string model, tensor;
  DType type;
  int64_t offset, n;
  std::vector<float> values;
};

std::vector<Row> load_rows() {
  std::ifstream in(inferd::test::test_data_root() + "/kernels/gguf_py_reference.txt");
  EXPECT_TRUE(in.good());
  std::vector<Row> rows;
  std::string line;
  bool in_row = false;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string word;
    ss >> word;
    if (word == "row") {
      Row r;
      std::string type;
      ss >> r.model >> r.tensor >> type >> r.offset >> r.n;
      r.type = DType::F32;
      for (DType t : testing::all_types()) {
        if (type == dtype_name(t)) r.type = t;
      }
      rows.push_back(r);
      in_row = true;
    } else if (word == "values" && in_row) {
      std::string v;
      while (ss >> v) rows.back().values.push_back(std::strtof(v.c_str(), nullptr));
      in_row = false;
    } else {
      in_row = false;
    }
  }
  return rows;
}

TEST(KernelsModelRows, DecodeLikeGgufPython) {
  const std::vector<Row> rows = load_rows();
  ASSERT_GE(rows.size(), 10u);
  int checked = 0;
  for (const Row& r : rows) {
    const std::string path = model_dir() + "/" + r.model;
    std::ifstream f(path, std::ios::binary);
    if (!f) continue;
    std::vector<uint8_t> raw(row_bytes(r.type, r.n));
    f.seekg(r.offset);
    f.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
    ASSERT_TRUE(f.good()) << path;
    std::vector<float> got(static_cast<size_t>(r.n));
    dequantize_row(r.type, raw.data(), got.data(), r.n);
    ASSERT_EQ(got.size(), r.values.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(testing::bits_of(got[i]), testing::bits_of(r.values[i]))
          << r.model << " " << r.tensor << " element " << i << ": " << got[i] << " vs " << r.values[i];
    }
    // The same row through vec_dot against a one-hot activation picks single elements.
    if (r.type != DType::F32) {
      std::vector<float> onehot(static_cast<size_t>(r.n), 0.0f);
      onehot[5] = 1.0f;
      const DType at = vec_dot_type(r.type);
      std::vector<uint8_t> b(row_bytes(at, r.n));
      quantize_row(at, onehot.data(), b.data(), r.n);
      // Tolerance: the activation's f16 scale (1/127) is rounded, relative 2^-11.
      float row_max = 0.0f;
      for (float v : r.values) row_max = std::max(row_max, std::fabs(v));
      EXPECT_NEAR(vec_dot(r.type, r.n, raw.data(), b.data()), r.values[5], 2e-3 * row_max)
          << r.tensor;
    }
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "test models not found in " << model_dir() << " (set INFERD_MODEL_DIR)";
  EXPECT_EQ(checked, static_cast<int>(rows.size())) << "some model files are missing";
}

}  // namespace
}  // namespace inferd::kernels
