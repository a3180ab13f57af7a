// GGUF loader tests: real model files (skipped when absent), well-formed
// hand-built images, and one hand-crafted malformed image per validation rule,
// each checked for refusal and for a message that names the problem.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf_test_util.h"

namespace inferd::gguf {
namespace {

using testing::Bytes;
using testing::Writer;

std::string model_dir() {
  if (const char* d = std::getenv("INFERD_MODEL_DIR")) return d;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/inferd/models";
}

Result<std::unique_ptr<File>> load(const Bytes& b) { return File::from_memory(b.data(), b.size()); }

// Expects `b` to be refused with a message containing `needle`.
void expect_refused(const Bytes& b, const std::string& needle) {
  auto f = load(b);
  ASSERT_FALSE(f.ok()) << "expected refusal containing: " << needle;
  EXPECT_NE(f.error().message.find(needle), std::string::npos)
      << "message: " << f.error().message << "\nexpected to contain: " << needle;
}

// A small valid model-like image used as the base of many cases.
Writer base_writer() {
  Writer w;
  w.str("general.architecture", "llama")
      .u32("llama.block_count", 2)
      .string_array("tokenizer.ggml.tokens", {"a", "b", "c"})
      .array<float>("tokenizer.ggml.scores", ValueType::FLOAT32, {0.f, -1.f, -2.f})
      .array<int32_t>("tokenizer.ggml.token_type", ValueType::INT32, {1, 1, 3});
  w.tensor("token_embd.weight", DType::Q8_0, {64, 3})
      .tensor("output_norm.weight", DType::F32, {5})
      .tensor("blk.0.ffn.weight", DType::Q4_K, {256, 2});
  return w;
}

// ---- real model files ----------------------------------------------------

TEST(GgufRealModel, SmolLM2) {
  const std::string path = model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not found: " << path;
  auto f = File::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const File& file = **f;
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 32u);
  EXPECT_EQ(file.get_string("general.architecture").value(), "llama");
  EXPECT_EQ(file.tensors().size(), 272u);
  EXPECT_EQ(file.get_u32("llama.block_count").value(), 30u);
  EXPECT_EQ(file.get_i64("llama.embedding_length").value(), 576);
  EXPECT_NEAR(file.get_f32("llama.attention.layer_norm_rms_epsilon").value(), 1e-5f, 1e-9f);
  EXPECT_EQ(file.get_string("tokenizer.ggml.model").value(), "gpt2");
  EXPECT_EQ(file.get_string("tokenizer.ggml.pre").value(), "smollm");
  EXPECT_EQ(file.get_string_array("tokenizer.ggml.tokens").value().size(), 49152u);
  EXPECT_EQ(file.get_i32_array("tokenizer.ggml.token_type").value().size(), 49152u);
  EXPECT_EQ(file.get_string_array("tokenizer.ggml.merges").value().size(), 48900u);
  const TensorInfo* t = file.find_tensor("token_embd.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::Q8_0);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(t->n_bytes, 576u / 32 * 34 * 49152);
  EXPECT_EQ(t->rows(), 49152);
  // The data section ends at the file's end, and every tensor lies inside it.
  for (const TensorInfo& ti : file.tensors()) {
    EXPECT_LE(ti.offset + ti.n_bytes, file.data_section_size()) << ti.name;
    EXPECT_EQ(ti.offset % file.alignment(), 0u) << ti.name;
  }
  EXPECT_EQ(file.tensor_data(file.tensors()[0]), file.tensor_data(*file.find_tensor(file.tensors()[0].name)));
}

TEST(GgufRealModel, Gemma3) {
  const std::string path = model_dir() + "/gemma-3-270m-q4_k_m.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not found: " << path;
  auto f = File::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const File& file = **f;
  EXPECT_EQ(file.get_string("general.architecture").value(), "gemma3");
  EXPECT_EQ(file.tensors().size(), 236u);
  EXPECT_EQ(file.get_string_array("tokenizer.ggml.tokens").value().size(), 262144u);
  EXPECT_EQ(file.get_f32_array("tokenizer.ggml.scores").value().size(), 262144u);
  EXPECT_EQ(file.get_string("tokenizer.ggml.model").value(), "llama");
  EXPECT_TRUE(file.get_bool("tokenizer.ggml.add_bos_token").value());
  std::vector<DType> seen;
  for (const TensorInfo& t : file.tensors()) seen.push_back(t.dtype);
  for (DType d : {DType::F32, DType::Q5_0, DType::Q4_K, DType::Q8_0, DType::Q6_K}) {
    EXPECT_NE(std::find(seen.begin(), seen.end(), d), seen.end()) << dtype_name(d);
  }
}

TEST(GgufRealModel, PrefaultReportsProgress) {
  const std::string path = model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not found: " << path;
  auto f = File::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  std::vector<double> seen;
  (*f)->prefault([&](double x) { seen.push_back(x); });
  ASSERT_GE(seen.size(), 10u);  // about every 1% of ~96 MB
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_GE(seen.front(), 0.0);
  EXPECT_EQ(seen.back(), 1.0);
}

// The process's resident pages of mapped files, in KiB (/proc/self/status).
long rss_file_kib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  long value = 0;
  while (status >> key) {
    if (key == "RssFile:" && status >> value) return value;
    status.ignore(1 << 20, '\n');
  }
  return -1;
}

TEST(GgufRealModel, ReleasedPagesLeaveTheProcessAndStayReadable) {
  const std::string path = model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not found: " << path;
  auto f = File::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const File& file = **f;
  const TensorInfo* largest = &file.tensors().front();
  for (const TensorInfo& t : file.tensors()) {
    if (t.n_bytes > largest->n_bytes) largest = &t;
  }
  ASSERT_GT(largest->n_bytes, uint64_t{8} << 20);
  file.prefault(nullptr);
  const uint8_t* data = file.tensor_data(*largest);
  const std::vector<uint8_t> copy(data, data + largest->n_bytes);
  const long before = rss_file_kib();
  if (before < 0) GTEST_SKIP() << "no RssFile in /proc/self/status";
  file.release_pages(data, largest->n_bytes);
  const long after = rss_file_kib();
  // All but the two edge pages go (the threshold leaves room for other activity).
  EXPECT_LT(after, before - static_cast<long>(largest->n_bytes / 1024) * 3 / 4) << before << " -> " << after;
  EXPECT_EQ(0, std::memcmp(copy.data(), data, copy.size()));  // faulted back in from the file
}

// ---- well-formed images --------------------------------------------------

TEST(GgufGood, AllScalarTypesRoundTrip) {
  Writer w;
  w.u8("t.u8", 200).i8("t.i8", -100).u16("t.u16", 60000).i16("t.i16", -30000)
      .u32("t.u32", 4000000000u).i32("t.i32", -2000000000).f32("t.f32", 1.5f)
      .boolean("t.bool", true).str("t.str", "hello \xe2\x9c\x93")
      .array<uint8_t>("t.arr", ValueType::UINT8, {1, 2})
      .u64("t.u64", 18000000000000000000ull).i64("t.i64", -9000000000000000000ll)
      .f64("t.f64", 0.1);
  auto f = load(w.build());
  ASSERT_TRUE(f.ok()) << f.error().message;
  const File& file = **f;
  ASSERT_EQ(file.metadata().size(), 13u);
  // Every value type appears once, in file order.
  for (uint32_t t = 0; t <= 12; ++t) {
    EXPECT_EQ(static_cast<uint32_t>(file.metadata()[t].value.type), t);
  }
  EXPECT_EQ(file.get_u32("t.u8").value(), 200u);
  EXPECT_EQ(file.get_i64("t.i8").value(), -100);
  EXPECT_EQ(file.get_u32("t.u16").value(), 60000u);
  EXPECT_EQ(file.get_i64("t.i16").value(), -30000);
  EXPECT_EQ(file.get_u32("t.u32").value(), 4000000000u);
  EXPECT_EQ(file.get_i64("t.i32").value(), -2000000000);
  EXPECT_EQ(file.get_f32("t.f32").value(), 1.5f);
  EXPECT_TRUE(file.get_bool("t.bool").value());
  EXPECT_EQ(file.get_string("t.str").value(), "hello \xe2\x9c\x93");
  EXPECT_EQ(file.get_u64("t.u64").value(), 18000000000000000000ull);
  EXPECT_EQ(file.get_i64("t.i64").value(), -9000000000000000000ll);
  EXPECT_FLOAT_EQ(file.get_f32("t.f64").value(), 0.1f);
  EXPECT_EQ(file.find("t.f64")->floats.at(0), 0.1);  // kept as double
  const Value* arr = file.find("t.arr");
  ASSERT_NE(arr, nullptr);
  EXPECT_TRUE(arr->is_array());
  EXPECT_EQ(arr->elem_type, ValueType::UINT8);
  EXPECT_EQ(arr->uints, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(arr->size(), 2u);
  EXPECT_STREQ(value_type_name(ValueType::FLOAT64), "FLOAT64");
}

TEST(GgufGood, ArraysOfEveryElementType) {
  Writer w;
  w.array<uint8_t>("a.u8", ValueType::UINT8, {0, 255})
      .array<int8_t>("a.i8", ValueType::INT8, {-128, 127})
      .array<uint16_t>("a.u16", ValueType::UINT16, {65535})
      .array<int16_t>("a.i16", ValueType::INT16, {-32768})
      .array<uint32_t>("a.u32", ValueType::UINT32, {7, 4294967295u})
      .array<int32_t>("a.i32", ValueType::INT32, {-5, 5})
      .array<float>("a.f32", ValueType::FLOAT32, {0.25f, -8.f})
      .array<uint8_t>("a.bool", ValueType::BOOL, {1, 0, 1})
      .string_array("a.str", {"x", "", "longer string"})
      .array<uint64_t>("a.u64", ValueType::UINT64, {1ull << 40})
      .array<int64_t>("a.i64", ValueType::INT64, {-(1ll << 40), 3})
      .array<double>("a.f64", ValueType::FLOAT64, {1e-300, 2.5})
      .array<uint32_t>("a.empty", ValueType::UINT32, {});
  auto f = load(w.build());
  ASSERT_TRUE(f.ok()) << f.error().message;
  const File& file = **f;
  EXPECT_EQ(file.find("a.u8")->uints, (std::vector<uint64_t>{0, 255}));
  EXPECT_EQ(file.find("a.i8")->ints, (std::vector<int64_t>{-128, 127}));
  EXPECT_EQ(file.find("a.u16")->uints, (std::vector<uint64_t>{65535}));
  EXPECT_EQ(file.find("a.i16")->ints, (std::vector<int64_t>{-32768}));
  EXPECT_EQ(file.find("a.bool")->ints, (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(file.find("a.u64")->uints, (std::vector<uint64_t>{1ull << 40}));
  EXPECT_EQ(file.find("a.f64")->floats, (std::vector<double>{1e-300, 2.5}));
  EXPECT_EQ(file.get_string_array("a.str").value(),
            (std::vector<std::string>{"x", "", "longer string"}));
  EXPECT_EQ(file.get_f32_array("a.f32").value(), (std::vector<float>{0.25f, -8.f}));
  EXPECT_EQ(file.get_f32_array("a.f64").value().size(), 2u);  // FLOAT64 accepted
  EXPECT_EQ(file.get_i32_array("a.i32").value(), (std::vector<int32_t>{-5, 5}));
  // Any integer array whose values fit in int32.
  EXPECT_EQ(file.get_i32_array("a.u8").value(), (std::vector<int32_t>{0, 255}));
  EXPECT_EQ(file.get_i32_array("a.i64").ok(), false);
  EXPECT_NE(file.get_i32_array("a.i64").error().message.find("does not fit in int32"), std::string::npos);
  EXPECT_FALSE(file.get_i32_array("a.u32").ok());  // 4294967295 does not fit
  EXPECT_TRUE(file.get_i32_array("a.empty").value().empty());
  EXPECT_EQ(file.find("a.empty")->size(), 0u);
}

TEST(GgufGood, GettersCheckTypesAndRanges) {
  Writer w;
  w.i32("neg", -1).u64("big", 1ull << 40).u64("huge", ~0ull).str("s", "x").f32("f", 2.f)
      .f64("f64big", 1e300).boolean("b", false).array<int32_t>("arr", ValueType::INT32, {1});
  auto f = load(w.build());
  ASSERT_TRUE(f.ok()) << f.error().message;
  const File& file = **f;
  EXPECT_NE(file.get_u32("neg").error().message.find("does not fit in uint32"), std::string::npos);
  EXPECT_EQ(file.get_i64("neg").value(), -1);
  EXPECT_NE(file.get_u32("big").error().message.find("does not fit"), std::string::npos);
  EXPECT_EQ(file.get_i64("big").value(), 1ll << 40);
  EXPECT_NE(file.get_i64("huge").error().message.find("does not fit in int64"), std::string::npos);
  EXPECT_EQ(file.get_u64("huge").value(), ~0ull);
  EXPECT_NE(file.get_u32("s").error().message.find("expected an integer"), std::string::npos);
  EXPECT_NE(file.get_u32("f").error().message.find("expected an integer"), std::string::npos);
  EXPECT_NE(file.get_u32("b").error().message.find("expected an integer"), std::string::npos);
  EXPECT_NE(file.get_u32("arr").error().message.find("an array of INT32"), std::string::npos);
  EXPECT_NE(file.get_f32("neg").error().message.find("expected a FLOAT32"), std::string::npos);
  EXPECT_NE(file.get_f32("f64big").error().message.find("out of range"), std::string::npos);
  EXPECT_NE(file.get_string("f").error().message.find("expected a STRING"), std::string::npos);
  EXPECT_NE(file.get_bool("neg").error().message.find("expected a BOOL"), std::string::npos);
  EXPECT_FALSE(file.get_bool("b").value());
  EXPECT_NE(file.get_string_array("s").error().message.find("expected an array of STRING"),
            std::string::npos);
  EXPECT_NE(file.get_f32_array("arr").error().message.find("an array of FLOAT32"), std::string::npos);
  EXPECT_NE(file.get_i32_array("s").error().message.find("an array of integers"), std::string::npos);
  EXPECT_NE(file.get_string("nope").error().message.find("missing key 'nope'"), std::string::npos);
  EXPECT_EQ(file.find("nope"), nullptr);
  EXPECT_EQ(file.find_tensor("nope"), nullptr);
}

TEST(GgufGood, TensorsAndData) {
  Writer w = base_writer();
  const Bytes b = w.build();
  auto f = load(b);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const File& file = **f;
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 32u);
  EXPECT_EQ(file.file_size(), b.size());
  ASSERT_EQ(file.tensors().size(), 3u);
  const TensorInfo& emb = file.tensors()[0];
  EXPECT_EQ(emb.name, "token_embd.weight");
  EXPECT_EQ(emb.dtype, DType::Q8_0);
  EXPECT_EQ(emb.shape, (std::vector<int64_t>{64, 3}));
  EXPECT_EQ(emb.n_elements(), 192);
  EXPECT_EQ(emb.rows(), 3);
  EXPECT_EQ(emb.n_bytes, 2u * 34 * 3);
  EXPECT_EQ(emb.offset, 0u);
  const TensorInfo* norm = file.find_tensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->offset, 224u);  // 204 rounded up to 32
  EXPECT_EQ(norm->n_bytes, 20u);
  const TensorInfo* ffn = file.find_tensor("blk.0.ffn.weight");
  ASSERT_NE(ffn, nullptr);
  EXPECT_EQ(ffn->offset, 256u);
  EXPECT_EQ(ffn->n_bytes, 288u);
  // The data section starts at the aligned end of the header.
  const uint64_t data_start = file.file_size() - file.data_section_size();
  EXPECT_EQ(data_start % 32, 0u);
  EXPECT_EQ(file.data_section_size(), 544u);
  for (const TensorInfo& t : file.tensors()) {
    EXPECT_EQ(file.tensor_data(t), b.data() + data_start + t.offset);
    EXPECT_EQ(file.tensor_data(t)[0], Writer::data_byte(t.offset));
  }
  std::vector<double> progress;
  file.prefault([&](double x) { progress.push_back(x); });
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), 1.0);
  file.prefault(nullptr);  // no callback is fine
}

TEST(GgufGood, Version2) {
  Writer w = base_writer();
  w.version = 2;
  auto f = load(w.build());
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->version(), 2u);
  EXPECT_EQ((*f)->tensors().size(), 3u);
}

TEST(GgufGood, CustomAlignment) {
  Writer w = base_writer();
  w.alignment = 256;
  w.u32("general.alignment", 256);
  const Bytes b = w.build();
  auto f = load(b);
  ASSERT_TRUE(f.ok()) << f.error().message;
  const File& file = **f;
  EXPECT_EQ(file.alignment(), 256u);
  EXPECT_EQ((file.file_size() - file.data_section_size()) % 256, 0u);
  EXPECT_EQ(file.find_tensor("output_norm.weight")->offset, 256u);
  EXPECT_EQ(file.find_tensor("blk.0.ffn.weight")->offset, 512u);
}

TEST(GgufGood, UnpaddedEndAndNoTensors) {
  Writer w;
  w.tensor("norm", DType::F32, {5});
  w.pad_end = false;  // the last tensor ends exactly at the end of the file
  auto f = load(w.build());
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->data_section_size(), 20u);
  w.pad_end = true;  // or is padded to the alignment
  f = load(w.build());
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->data_section_size(), 32u);

  Writer empty;
  empty.str("general.architecture", "llama");
  auto g = load(empty.build());
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE((*g)->tensors().empty());
  EXPECT_EQ((*g)->data_section_size(), 0u);
  (*g)->prefault(nullptr);

  Writer bare;  // header only
  auto h = load(bare.build());
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_TRUE((*h)->metadata().empty());
}

TEST(GgufGood, TensorInfosNeedNotBeInOffsetOrder) {
  Writer w;
  Writer::Tensor a{"a", 0, {8}, {}, uint64_t{32}, {}};
  Writer::Tensor b{"b", 0, {8}, {}, uint64_t{0}, {}};
  w.tensor(a).tensor(b);
  auto f = load(w.build());
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->find_tensor("a")->offset, 32u);
}

TEST(GgufGood, TypesWithoutKernelsAreReadAndNamed) {
  // gpt-oss's MXFP4 experts (3-D) and an IQ4_XS matrix: a file holding them is
  // read and described (inferd info); a type no kernel runs (IQ4_XS) is refused
  // when the model is loaded to run (model/weights.cpp), not by the reader.
  Writer w;
  w.tensor({"experts", static_cast<uint32_t>(DType::MXFP4), {64, 4, 2}, {}, {}, {}})
      .tensor({"m", static_cast<uint32_t>(DType::IQ4_XS), {256, 2}, {}, {}, {}});
  auto f = load(w.build());
  ASSERT_TRUE(f.ok()) << f.error().message;
  const TensorInfo* experts = (*f)->find_tensor("experts");
  ASSERT_NE(experts, nullptr);
  EXPECT_EQ(experts->dtype, DType::MXFP4);
  EXPECT_EQ(experts->n_bytes, 2u * 4u * 2u * 17u);  // 2 blocks of 32 per row, 17 bytes each
  EXPECT_STREQ(dtype_name(experts->dtype), "MXFP4");
  EXPECT_EQ((*f)->find_tensor("m")->n_bytes, 2u * 136u);
}

TEST(GgufGood, PerLayerHeadCountsMayBeArrays) {
  Writer w;
  w.str("general.architecture", "openelm")
      .array<int32_t>("openelm.attention.head_count", ValueType::INT32, {3, 4})
      .array<uint32_t>("openelm.feed_forward_length", ValueType::UINT32, {5, 6})
      .f64("openelm.rope.freq_base", 10000.0);
  auto f = load(w.build());
  ASSERT_TRUE(f.ok()) << f.error().message;
}

TEST(GgufGood, OpensFromDiskAndRefusesMissingFiles) {
  const Bytes b = base_writer().build();
  const std::string path = ::testing::TempDir() + "/gguf_loader_test_" + std::to_string(::getpid()) + ".gguf";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }
  auto f = File::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->tensors().size(), 3u);
  EXPECT_EQ((*f)->tensor_data((*f)->tensors()[1])[0], Writer::data_byte(224));
  (*f)->prefault(nullptr);
  f = File::open(path + ".missing");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("cannot open"), std::string::npos);
  f = File::open(::testing::TempDir());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("not a regular file"), std::string::npos);
  { std::ofstream truncate_it(path, std::ios::binary | std::ios::trunc); }
  f = File::open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("empty"), std::string::npos);
  std::remove(path.c_str());
}

// ---- header ----------------------------------------------------------------

TEST(GgufBad, BadMagic) {
  Writer w = base_writer();
  w.magic = 0x46554746;
  expect_refused(w.build(), "bad magic");
  expect_refused(Bytes{'G', 'G'}, "too small");
  expect_refused(Bytes{}, "too small");
}

TEST(GgufBad, UnsupportedVersion) {
  Writer w = base_writer();
  w.version = 1;
  expect_refused(w.build(), "unsupported GGUF version 1");
  w.version = 4;
  expect_refused(w.build(), "unsupported GGUF version 4");
  w.version = 0x03000000;  // a big-endian v3 file read as little-endian
  expect_refused(w.build(), "big-endian");
}

TEST(GgufBad, TruncatedAnywhere) {
  const Bytes full = base_writer().build();
  // Every strict prefix is refused (the loop also proves no crash/UB under ASan).
  for (size_t n = 0; n < full.size(); ++n) {
    Bytes cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_FALSE(load(cut).ok()) << "prefix of " << n << " bytes accepted";
  }
  // A few cut points with their specific messages.
  Writer w;
  w.u32("k", 7);
  Bytes b = w.build();
  b.resize(b.size() - 2);  // inside the value
  expect_refused(b, "file truncated while reading the value of key 'k'");
  b.resize(4 + 4 + 4);  // inside the tensor count
  expect_refused(b, "file truncated while reading the tensor count");
  Bytes t = base_writer().build();
  t.resize(t.size() - 300);  // inside the data section
  expect_refused(t, "extends past the end of the file");
}

TEST(GgufBad, CountsThatOverflowOrCannotFit) {
  Writer w = base_writer();
  w.tensor_count = (1ull << 63) + 5;
  expect_refused(w.build(), "tensor count 9223372036854775813 overflows");
  w.tensor_count = 1000;
  expect_refused(w.build(), "tensor count 1000 cannot fit");
  w.tensor_count.reset();
  w.kv_count = ~0ull;
  expect_refused(w.build(), "metadata count 18446744073709551615 overflows");
  w.kv_count = 1ull << 40;
  expect_refused(w.build(), "metadata count 1099511627776 cannot fit");
}

// ---- metadata ----------------------------------------------------------------

TEST(GgufBad, StringLengthTooLong) {
  Writer w;
  testing::Bytes p;
  testing::put<uint64_t>(p, ~0ull);  // length that would overflow any pointer arithmetic
  w.raw_kv("k", static_cast<uint32_t>(ValueType::STRING), p);
  expect_refused(w.build(), "string length 18446744073709551615 of the value of key 'k' exceeds");
  Writer w2;
  p.clear();
  testing::put<uint64_t>(p, 100);
  p.push_back('x');
  w2.raw_kv("k", static_cast<uint32_t>(ValueType::STRING), p);
  expect_refused(w2.build(), "string length 100 of the value of key 'k' exceeds");
  // A key whose own length is bad.
  Bytes b = Writer().build();
  b[16] = 1;  // kv_count = 1
  testing::put<uint64_t>(b, 1ull << 62);
  b.resize(b.size() + 16, 'a');
  expect_refused(b, "of the key of metadata entry 0 exceeds");
}

TEST(GgufBad, ArrayLengthTooLong) {
  for (uint64_t n : {~0ull, 1ull << 61, 1000ull}) {
    Writer w;
    testing::Bytes p;
    testing::put<uint32_t>(p, static_cast<uint32_t>(ValueType::UINT64));
    testing::put<uint64_t>(p, n);
    testing::put<uint64_t>(p, 1);
    w.raw_kv("arr", static_cast<uint32_t>(ValueType::ARRAY), p);
    expect_refused(w.build(), "array length " + std::to_string(n) + " of key 'arr' exceeds");
  }
  Writer w;
  testing::Bytes p;
  testing::put<uint32_t>(p, static_cast<uint32_t>(ValueType::STRING));
  testing::put<uint64_t>(p, 1ull << 60);
  w.raw_kv("strs", static_cast<uint32_t>(ValueType::ARRAY), p);
  expect_refused(w.build(), "array length 1152921504606846976 of key 'strs' exceeds");
}

TEST(GgufBad, InvalidValueType) {
  Writer w;
  w.raw_kv("weird", 13, {0, 0, 0, 0});
  expect_refused(w.build(), "invalid value type 13 for key 'weird'");
  Writer w2;
  w2.raw_kv("weird", 0xffffffffu, {0, 0, 0, 0});
  expect_refused(w2.build(), "invalid value type 4294967295 for key 'weird'");
}

TEST(GgufBad, InvalidArrayElementType) {
  Writer w;
  w.array<uint8_t>("arr", static_cast<ValueType>(13), {1});
  expect_refused(w.build(), "invalid array element type 13 for key 'arr'");
}

TEST(GgufBad, NestedArray) {
  Writer w;
  testing::Bytes p;
  testing::put<uint32_t>(p, static_cast<uint32_t>(ValueType::ARRAY));
  testing::put<uint64_t>(p, 1);
  testing::put<uint32_t>(p, static_cast<uint32_t>(ValueType::UINT8));
  testing::put<uint64_t>(p, 1);
  p.push_back(1);
  w.raw_kv("nest", static_cast<uint32_t>(ValueType::ARRAY), p);
  expect_refused(w.build(), "nested arrays are not supported (key 'nest')");
}

TEST(GgufBad, InvalidBool) {
  Writer w;
  w.scalar<uint8_t>("flag", ValueType::BOOL, 2);
  expect_refused(w.build(), "invalid bool value 2 in the value of key 'flag'");
  Writer w2;
  w2.array<uint8_t>("flags", ValueType::BOOL, {0, 1, 7});
  expect_refused(w2.build(), "invalid bool value 7 in element 2 of array key 'flags'");
}

TEST(GgufBad, DuplicateKey) {
  Writer w = base_writer();
  w.u32("llama.block_count", 3);
  expect_refused(w.build(), "duplicate key 'llama.block_count'");
}

TEST(GgufBad, EmptyKey) {
  Writer w;
  w.u32("", 3);
  expect_refused(w.build(), "metadata entry 0 has an empty key");
}

TEST(GgufBad, KeysInMessagesAreEscaped) {
  Writer w;
  w.raw_kv(std::string("bad\n\x01key", 8), 99, {});
  expect_refused(w.build(), "invalid value type 99 for key 'bad\\x0a\\x01key'");
}

TEST(GgufBad, Alignment) {
  Writer w = base_writer();
  w.u32("general.alignment", 0);
  expect_refused(w.build(), "general.alignment is 0");
  Writer w2 = base_writer();
  w2.u32("general.alignment", 48);
  expect_refused(w2.build(), "general.alignment 48 is not a power of two");
  Writer w3 = base_writer();
  w3.u64("general.alignment", 32);
  expect_refused(w3.build(), "key 'general.alignment' must be a UINT32, but is UINT64");
  Writer w4 = base_writer();
  w4.i32("general.alignment", 32);
  expect_refused(w4.build(), "key 'general.alignment' must be a UINT32, but is INT32");
}

// ---- well-known keys ---------------------------------------------------------

struct WrongTypeCase {
  const char* name;
  void (*add)(Writer&);
  const char* message;
};

class GgufKnownKeys : public ::testing::TestWithParam<WrongTypeCase> {};

TEST_P(GgufKnownKeys, WrongTypeIsRefused) {
  Writer w;
  GetParam().add(w);
  expect_refused(w.build(), GetParam().message);
}

const WrongTypeCase kWrongTypeCases[] = {
    {"tokens_not_strings", [](Writer& w) { w.array<int32_t>("tokenizer.ggml.tokens", ValueType::INT32, {1}); },
     "key 'tokenizer.ggml.tokens' must be an array of STRING, but is an array of INT32"},
    {"tokens_scalar", [](Writer& w) { w.str("tokenizer.ggml.tokens", "a"); },
     "key 'tokenizer.ggml.tokens' must be an array of STRING, but is STRING"},
    {"scores_f64", [](Writer& w) { w.array<double>("tokenizer.ggml.scores", ValueType::FLOAT64, {1.0}); },
     "key 'tokenizer.ggml.scores' must be an array of FLOAT32, but is an array of FLOAT64"},
    {"token_type_u32", [](Writer& w) { w.array<uint32_t>("tokenizer.ggml.token_type", ValueType::UINT32, {1}); },
     "key 'tokenizer.ggml.token_type' must be an array of INT32, but is an array of UINT32"},
    {"merges_ints", [](Writer& w) { w.array<int32_t>("tokenizer.ggml.merges", ValueType::INT32, {1}); },
     "key 'tokenizer.ggml.merges' must be an array of STRING"},
    {"architecture_int", [](Writer& w) { w.u32("general.architecture", 1); },
     "key 'general.architecture' must be a STRING, but is UINT32"},
    {"tokenizer_model_array", [](Writer& w) { w.string_array("tokenizer.ggml.model", {"gpt2"}); },
     "key 'tokenizer.ggml.model' must be a STRING, but is an array of STRING"},
    {"context_length_float", [](Writer& w) { w.f32("llama.context_length", 2048.f); },
     "key 'llama.context_length' must be an integer, but is FLOAT32"},
    {"block_count_string", [](Writer& w) { w.str("gemma3.block_count", "30"); },
     "key 'gemma3.block_count' must be an integer, but is STRING"},
    {"embedding_length_bool", [](Writer& w) { w.boolean("llama.embedding_length", true); },
     "key 'llama.embedding_length' must be an integer, but is BOOL"},
    {"ffn_float_array", [](Writer& w) { w.array<float>("llama.feed_forward_length", ValueType::FLOAT32, {1.f}); },
     "key 'llama.feed_forward_length' must be an integer or an array of integers"},
    {"head_count_float", [](Writer& w) { w.f32("llama.attention.head_count", 9.f); },
     "key 'llama.attention.head_count' must be an integer or an array of integers, but is FLOAT32"},
    {"head_count_kv_string", [](Writer& w) { w.str("llama.attention.head_count_kv", "3"); },
     "key 'llama.attention.head_count_kv' must be an integer or an array of integers"},
    {"freq_base_int", [](Writer& w) { w.u32("llama.rope.freq_base", 10000); },
     "key 'llama.rope.freq_base' must be a FLOAT32 or FLOAT64, but is UINT32"},
    {"rms_eps_string", [](Writer& w) { w.str("gemma3.attention.layer_norm_rms_epsilon", "1e-6"); },
     "key 'gemma3.attention.layer_norm_rms_epsilon' must be a FLOAT32 or FLOAT64, but is STRING"},
    {"bos_float", [](Writer& w) { w.f32("tokenizer.ggml.bos_token_id", 1.f); },
     "key 'tokenizer.ggml.bos_token_id' must be an integer, but is FLOAT32"},
    {"eos_string", [](Writer& w) { w.str("tokenizer.ggml.eos_token_id", "2"); },
     "key 'tokenizer.ggml.eos_token_id' must be an integer, but is STRING"},
    {"add_bos_u8", [](Writer& w) { w.u8("tokenizer.ggml.add_bos_token", 1); },
     "key 'tokenizer.ggml.add_bos_token' must be a BOOL, but is UINT8"},
    {"add_eos_int", [](Writer& w) { w.i32("tokenizer.ggml.add_eos_token", 0); },
     "key 'tokenizer.ggml.add_eos_token' must be a BOOL, but is INT32"},
};

INSTANTIATE_TEST_SUITE_P(All, GgufKnownKeys, ::testing::ValuesIn(kWrongTypeCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(GgufBad, TokenArrayLengthsDisagree) {
  Writer w;
  w.string_array("tokenizer.ggml.tokens", {"a", "b"})
      .array<float>("tokenizer.ggml.scores", ValueType::FLOAT32, {0.f});
  expect_refused(w.build(), "key 'tokenizer.ggml.scores' has 1 entries but tokenizer.ggml.tokens has 2");
  Writer w2;
  w2.string_array("tokenizer.ggml.tokens", {"a", "b"})
      .array<int32_t>("tokenizer.ggml.token_type", ValueType::INT32, {1, 1, 1});
  expect_refused(w2.build(), "key 'tokenizer.ggml.token_type' has 3 entries but tokenizer.ggml.tokens has 2");
}

// ---- tensor infos -----------------------------------------------------------

Writer with_tensor(Writer::Tensor t) {
  Writer w;
  w.tensor("first", DType::F32, {8});
  w.tensor(std::move(t));
  return w;
}

TEST(GgufBad, DuplicateTensorName) {
  Writer w = base_writer();
  w.tensor("output_norm.weight", DType::F32, {5});
  expect_refused(w.build(), "duplicate tensor name 'output_norm.weight'");
}

TEST(GgufBad, EmptyTensorName) {
  expect_refused(with_tensor({"", 0, {8}, {}, {}, {}}).build(), "tensor 1 has an empty name");
}

TEST(GgufBad, NDimsOutOfRange) {
  expect_refused(with_tensor({"t", 0, {}, {}, {}, {}}).build(), "tensor 't': n_dims 0 is out of range 1..4");
  expect_refused(with_tensor({"t", 0, {1, 1, 1, 1, 1}, {}, {}, {}}).build(),
                 "tensor 't': n_dims 5 is out of range 1..4");
  expect_refused(with_tensor({"t", 0, {8}, 0xffffffffu, {}, {}}).build(),
                 "tensor 't': n_dims 4294967295 is out of range");
}

TEST(GgufBad, NonPositiveDimension) {
  expect_refused(with_tensor({"t", 0, {8, 0}, {}, {}, {}}).build(),
                 "tensor 't': dimension 1 is 0 (must be positive)");
  expect_refused(with_tensor({"t", 0, {-8}, {}, {}, {}}).build(),
                 "tensor 't': dimension 0 is -8 (must be positive)");
  expect_refused(with_tensor({"t", 0, {8, 1, 1, std::numeric_limits<int64_t>::min()}, {}, {}, {}}).build(),
                 "tensor 't': dimension 3 is -9223372036854775808");
}

TEST(GgufBad, ElementCountOverflow) {
  expect_refused(with_tensor({"t", 0, {1ll << 32, 1ll << 31}, {}, {}, {}}).build(),
                 "tensor 't': element count overflows int64");
  expect_refused(with_tensor({"t", 0, {1ll << 20, 1ll << 20, 1ll << 20, 1ll << 20}, {}, {}, {}}).build(),
                 "tensor 't': element count overflows int64");
}

TEST(GgufBad, ByteSizeOverflow) {
  // 2^62 F32 elements fit int64, but their 2^64 bytes do not.
  expect_refused(with_tensor({"t", 0, {1ll << 31, 1ll << 31}, {}, {}, {}}).build(),
                 "tensor 't': byte size overflows int64");
  // Nor do (2^58 - 2^27) Q8_0 blocks of 34 bytes.
  expect_refused(with_tensor({"t", 8, {1ll << 32, (1ll << 31) - 1}, {}, {}, {}}).build(),
                 "tensor 't': byte size overflows int64");
}

TEST(GgufBad, UnknownTensorType) {
  expect_refused(with_tensor({"t", 4, {32}, {}, {}, {}}).build(),
                 "tensor 't': unknown or unsupported tensor type 4");
  expect_refused(with_tensor({"t", 0xffffffffu, {32}, {}, {}, {}}).build(),
                 "tensor 't': unknown or unsupported tensor type 4294967295");
}

TEST(GgufBad, RowNotMultipleOfBlock) {
  expect_refused(with_tensor({"t", static_cast<uint32_t>(DType::Q4_K), {128, 2}, {}, {}, {}}).build(),
                 "tensor 't': row size 128 is not a multiple of the block size 256 of type Q4_K");
  expect_refused(with_tensor({"t", static_cast<uint32_t>(DType::Q8_0), {33}, {}, {}, {}}).build(),
                 "row size 33 is not a multiple of the block size 32 of type Q8_0");
}

TEST(GgufBad, OffsetNotAligned) {
  expect_refused(with_tensor({"t", 0, {8}, {}, uint64_t{40}, {}}).build(),
                 "tensor 't': offset 40 is not a multiple of the alignment 32");
}

TEST(GgufBad, OverlappingTensors) {
  Writer w;
  w.tensor("big", DType::F32, {16});                  // bytes [0, 64)
  w.tensor({"small", 0, {8}, {}, uint64_t{32}, {}});  // starts inside "big"
  expect_refused(w.build(), "tensor 'small' at offset 32 overlaps tensor 'big' which ends at 64");
  Writer same;
  same.tensor({"a", 0, {8}, {}, uint64_t{0}, {}}).tensor({"b", 0, {8}, {}, uint64_t{0}, {}});
  expect_refused(same.build(), "overlaps tensor");
}

TEST(GgufBad, GapsBetweenTensors) {
  expect_refused(with_tensor({"t", 0, {8}, {}, uint64_t{64}, {}}).build(),
                 "gap of 32 unused bytes before tensor 't' at offset 64");
  Writer w;
  w.tensor({"late", 0, {8}, {}, uint64_t{32}, {}});
  expect_refused(w.build(), "gap of 32 unused bytes before tensor 'late'");
}

TEST(GgufBad, TrailingBytes) {
  Writer w = base_writer();
  w.trailing.assign(64, 0);
  expect_refused(w.build(), "64 unused bytes after the last tensor 'blk.0.ffn.weight'");
  Writer empty;
  empty.u32("k", 1);
  empty.trailing.assign(100, 0);
  expect_refused(empty.build(), "unused bytes after the header");
}

TEST(GgufBad, TensorPastEndOfFile) {
  Writer w;
  w.tensor({"t", 0, {8}, {}, {}, uint64_t{0}});  // claims 32 bytes but the writer writes none
  expect_refused(w.build(), "tensor 't': data at offset 0 (32 bytes) extends past the end of the file");
  Writer far;
  far.tensor("first", DType::F32, {8});
  far.tensor({"t", 0, {8}, {}, (~0ull) & ~31ull, uint64_t{0}});
  far.data_size = 32;
  expect_refused(far.build(), "extends past the end of the file");
}

TEST(GgufBad, DataSectionStartsPastEndOfFile) {
  Writer w;
  w.tensor({"t", 0, {8}, {}, {}, uint64_t{0}});
  Bytes b = w.build();
  // Drop the padding too: the header ends mid-way through an alignment unit.
  while (b.size() % 32 == 0) b.pop_back();
  expect_refused(b, "the tensor data section starts at byte");
}

}  // namespace
}  // namespace inferd::gguf
