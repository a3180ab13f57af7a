// GGUF model file reader (versions 2 and 3).
//
// The file is memory-mapped; metadata and tensor infos are parsed and fully
// validated up front, so every accessor afterwards can trust what it returns.
// A bad file is refused with an Error that names the problem.
//
// Beyond the format itself, validation enforces: tensor types known to DType,
// rows a whole number of blocks, offsets aligned, tensors tiling the data
// section in offset order (each padded to the alignment; no gaps, overlaps or
// bytes past the end), and the expected types of well-known keys (e.g.
// tokenizer.ggml.tokens is an array of STRING, <arch>.block_count an integer,
// general.alignment a power-of-two UINT32). Nested arrays are refused.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/result.h"

namespace inferd::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Scalars hold one element; arrays hold many of elem_type.
// Integer kinds are widened into `ints` (int64) or `uints` (uint64), floats
// into `floats`, so callers do not juggle twelve vector types.
struct Value {
  ValueType type = ValueType::UINT8;       // ARRAY for arrays
  ValueType elem_type = ValueType::UINT8;  // element type (== type for scalars)
  std::vector<int64_t> ints;               // INT8/16/32/64, BOOL (0/1)
  std::vector<uint64_t> uints;             // UINT8/16/32/64
  std::vector<double> floats;              // FLOAT32/64
  std::vector<std::string> strings;        // STRING
  bool is_array() const { return type == ValueType::ARRAY; }
  size_t size() const;                     // number of elements
};

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // GGML order: shape[0] is the innermost (row) dimension
  uint64_t offset = 0;         // relative to the start of the tensor data section
  uint64_t n_bytes = 0;
  int64_t n_elements() const;
  int64_t rows() const { return shape.empty() ? 0 : n_elements() / shape[0]; }
};

using ProgressFn = std::function<void(double fraction)>;

class File {
 public:
  // Opens and validates a file, memory-mapping it read-only.
  static Result<std::unique_ptr<File>> open(const std::string& path);
  // Validates a GGUF image already in memory (tests, fuzzing). The bytes must
  // outlive the File; nothing is copied.
  static Result<std::unique_ptr<File>> from_memory(const uint8_t* data, size_t size);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::vector<KeyValue>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;

  // Typed getters: Error if the key is missing or of an incompatible type.
  // Integer getters accept any integer type whose value fits.
  Result<std::string> get_string(std::string_view key) const;
  Result<uint32_t> get_u32(std::string_view key) const;
  Result<uint64_t> get_u64(std::string_view key) const;
  Result<int64_t> get_i64(std::string_view key) const;
  Result<float> get_f32(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::vector<std::string>> get_string_array(std::string_view key) const;
  Result<std::vector<float>> get_f32_array(std::string_view key) const;
  Result<std::vector<int32_t>> get_i32_array(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  const uint8_t* tensor_data(const TensorInfo& t) const { return data_ + t.offset; }
  uint64_t data_section_size() const { return data_size_; }
  uint64_t file_size() const { return size_; }
  // The whole file's bytes (what identifies it, e.g. for a content hash).
  const uint8_t* image() const { return base_; }

  // Touches every page of the tensor data (so the first forward pass does not
  // fault), reporting progress.
  void prefault(const ProgressFn& progress) const;
  // The same for the tensors `wanted` names only: a pipeline stage pages in
  // its own layers' weights, and the rest of the mapping stays untouched
  // (and takes no memory).
  void prefault(const ProgressFn& progress, const std::function<bool(const TensorInfo&)>& wanted) const;
  // The same for byte ranges of the mapping (a tensor-parallel rank's rows).
  void prefault(const ProgressFn& progress, const std::vector<std::pair<const void*, uint64_t>>& ranges) const;
  // Drops the mapped file pages wholly inside [p, p + n) from this process
  // (a copy of those bytes now lives elsewhere, e.g. repacked weights). They
  // stay readable: a later read faults them back in from the file. Nothing
  // happens when the file was read into memory rather than mapped, or to a
  // range outside the file's mapping.
  void release_pages(const void* p, uint64_t n) const;

 private:
  File() = default;
  Status parse();

  const uint8_t* base_ = nullptr;  // whole file
  uint64_t size_ = 0;
  const uint8_t* data_ = nullptr;  // tensor data section
  uint64_t data_size_ = 0;
  bool mapped_ = false;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<KeyValue> kv_;
  std::vector<TensorInfo> tensors_;
  // name -> index into kv_ / tensors_ (std::less<> allows string_view lookups).
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace inferd::gguf
