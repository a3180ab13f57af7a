// Our kernels against GGML itself: activation quantizers byte for byte, and
// dot products on blocks made by GGML's own quantizers against GGML's vec_dot. Data: tests/data/kernels/ggml_reference.txt, made by
// tools/reference/kernels_make_ggml_reference.py from the libggml inside
// llama-cpp-python.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "kernels_test_util.h"
#include "test_data.h"

namespace inferd::kernels {
namespace {

using testing::bits_of;
using testing::runnable_levels;

struct Record {
  std::string kind;
  DType type = DType::F32;
  int64_t n = 0;
  std::vector<float> values, wvalues;
  std::vector<uint8_t> bytes, wbytes, abytes;
  float dot = 0;
};

std::vector<uint8_t> hex_bytes(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

std::vector<Record> load() {
  const std::string path = inferd::test::test_data_root() + "/kernels/ggml_reference.txt";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  std::vector<Record> records;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string tag, word;
    ss >> tag;
    auto floats = [&](std::vector<float>& v) {
      while (ss >> word) v.push_back(std::strtof(word.c_str(), nullptr));
    };
    if (tag == "actquant" || tag == "vecdot") {
      Record r;
      r.kind = tag;
      std::string type;
      ss >> type >> r.n;
      for (DType t : testing::all_types()) {
        if (type == dtype_name(t)) r.type = t;
      }
      records.push_back(r);
    } else if (tag == "values") {
      floats(records.back().values);
    } else if (tag == "wvalues") {
      floats(records.back().wvalues);
    } else if (tag == "bytes" || tag == "wbytes" || tag == "abytes") {
      ss >> word;
      Record& r = records.back();
      (tag == "bytes" ? r.bytes : tag == "wbytes" ? r.wbytes : r.abytes) = hex_bytes(word);
    } else if (tag == "dot") {
      ss >> word;
      records.back().dot = std::strtof(word.c_str(), nullptr);
    }
  }
  return records;
}

TEST(KernelsGgml, ActivationQuantizersMatchByteForByte) {
  int checked = 0;
  for (const Record& r : load()) {
    if (r.kind != "actquant") continue;
    for (SimdLevel level : runnable_levels()) {
      const KernelTable table = build_kernel_table(level);
      std::vector<uint8_t> got(row_bytes(r.type, r.n));
      table.type[static_cast<uint32_t>(r.type)].quantize_row(r.values.data(), got.data(), r.n);
      EXPECT_EQ(got, r.bytes) << dtype_name(r.type) << " at " << testing::level_name(level);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 9);
}

TEST(KernelsGgml, DotProductsOfGgmlBlocksTrackGgml) {
  int checked = 0;
  for (const Record& r : load()) {
    if (r.kind != "vecdot") continue;
    const DType at = vec_dot_type(r.type);
    ASSERT_EQ(r.wbytes.size(), row_bytes(r.type, r.n));
    ASSERT_EQ(r.abytes.size(), row_bytes(at, r.n));
    // GGML's quantizers make blocks we decode exactly as GGML does.
    const std::vector<float> w = testing::dequantize_ref(r.type, r.wbytes.data(), r.n);
    for (int64_t i = 0; i < r.n; ++i) ASSERT_EQ(bits_of(w[i]), bits_of(r.wvalues[i])) << dtype_name(r.type) << " " << i;
    const std::vector<float> a = testing::dequantize_ref(at, r.abytes.data(), r.n);
    double mag = 0;
    for (int64_t i = 0; i < r.n; ++i) mag += std::fabs(static_cast<double>(w[i]) * a[i]);
    // Same integer block math as GGML; only the float summation order differs.
    EXPECT_NEAR(ref::vec_dot(r.type, r.n, r.wbytes.data(), r.abytes.data()), r.dot, 1e-6 * mag)
        << dtype_name(r.type) << " n=" << r.n;
    for (SimdLevel level : runnable_levels()) {
      const KernelTable table = build_kernel_table(level);
      EXPECT_NEAR(table.type[static_cast<uint32_t>(r.type)].vec_dot(r.n, r.wbytes.data(), r.abytes.data()), r.dot, 1e-6 * mag)
          << dtype_name(r.type) << " n=" << r.n << " at " << testing::level_name(level);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 40);
}

}  // namespace
}  // namespace inferd::kernels
