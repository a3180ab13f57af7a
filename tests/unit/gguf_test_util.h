// In-memory GGUF image writer for tests and fuzz seeds.
//
// It writes exactly what it is told, including nonsense, so each malformed
// case can be hand-crafted: header fields, counts, raw value-type ids, tensor
// shapes, types and offsets can all be overridden.
#pragma once
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"

namespace inferd::gguf::testing {

using Bytes = std::vector<uint8_t>;

template <class T>
void put(Bytes& b, T v) {
  uint8_t raw[sizeof(T)];
  std::memcpy(raw, &v, sizeof(T));
  b.insert(b.end(), raw, raw + sizeof(T));
}

inline void put_string(Bytes& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}

inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

class Writer {
 public:
  struct Tensor {
    std::string name;
    uint32_t type = 0;                 // raw GGML type id
    std::vector<int64_t> dims;
    std::optional<uint32_t> n_dims;    // override the written n_dims (dims.size() otherwise)
    std::optional<uint64_t> offset;    // default: packed after the previous tensor
    std::optional<uint64_t> n_bytes;   // default: computed from type and dims
  };

  // Header fields.
  uint32_t magic = 0x46554747;  // "GGUF"
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count;  // override the counts written
  std::optional<uint64_t> kv_count;
  // Alignment used to lay out the data section. It does not write
  // general.alignment; add that key yourself to change the file's alignment.
  uint64_t alignment = 32;
  bool pad_end = true;   // pad the data section after the last tensor
  std::optional<uint64_t> data_size;  // override the data section's size
  Bytes trailing;        // raw bytes appended at the very end

  // ---- metadata ----
  Writer& raw_kv(const std::string& key, uint32_t type, const Bytes& payload) {
    put_string(kv_bytes_, key);
    put<uint32_t>(kv_bytes_, type);
    kv_bytes_.insert(kv_bytes_.end(), payload.begin(), payload.end());
    ++n_kv_;
    return *this;
  }
  template <class T>
  Writer& scalar(const std::string& key, ValueType t, T v) {
    Bytes p;
    put<T>(p, v);
    return raw_kv(key, static_cast<uint32_t>(t), p);
  }
  Writer& u8(const std::string& k, uint8_t v) { return scalar(k, ValueType::UINT8, v); }
  Writer& i8(const std::string& k, int8_t v) { return scalar(k, ValueType::INT8, v); }
  Writer& u16(const std::string& k, uint16_t v) { return scalar(k, ValueType::UINT16, v); }
  Writer& i16(const std::string& k, int16_t v) { return scalar(k, ValueType::INT16, v); }
  Writer& u32(const std::string& k, uint32_t v) { return scalar(k, ValueType::UINT32, v); }
  Writer& i32(const std::string& k, int32_t v) { return scalar(k, ValueType::INT32, v); }
  Writer& u64(const std::string& k, uint64_t v) { return scalar(k, ValueType::UINT64, v); }
  Writer& i64(const std::string& k, int64_t v) { return scalar(k, ValueType::INT64, v); }
  Writer& f32(const std::string& k, float v) { return scalar(k, ValueType::FLOAT32, v); }
  Writer& f64(const std::string& k, double v) { return scalar(k, ValueType::FLOAT64, v); }
  Writer& boolean(const std::string& k, bool v) {
    return scalar<uint8_t>(k, ValueType::BOOL, v ? 1 : 0);
  }
  Writer& str(const std::string& k, const std::string& v) {
    Bytes p;
    put_string(p, v);
    return raw_kv(k, static_cast<uint32_t>(ValueType::STRING), p);
  }
  // Array of fixed-size elements of C++ type T written as GGUF type `elem`.
  template <class T>
  Writer& array(const std::string& k, ValueType elem, const std::vector<T>& v) {
    Bytes p;
    put<uint32_t>(p, static_cast<uint32_t>(elem));
    put<uint64_t>(p, v.size());
    for (const T& x : v) put<T>(p, x);
    return raw_kv(k, static_cast<uint32_t>(ValueType::ARRAY), p);
  }
  Writer& string_array(const std::string& k, const std::vector<std::string>& v) {
    Bytes p;
    put<uint32_t>(p, static_cast<uint32_t>(ValueType::STRING));
    put<uint64_t>(p, v.size());
    for (const std::string& s : v) put_string(p, s);
    return raw_kv(k, static_cast<uint32_t>(ValueType::ARRAY), p);
  }

  // ---- tensors ----
  Writer& tensor(Tensor t) {
    tensors_.push_back(std::move(t));
    return *this;
  }
  Writer& tensor(const std::string& name, DType type, std::vector<int64_t> dims) {
    Tensor t;
    t.name = name;
    t.type = static_cast<uint32_t>(type);
    t.dims = std::move(dims);
    return tensor(std::move(t));
  }

  // Bytes of a tensor of this type/shape, 0 when the type or shape is invalid
  // (so malformed tensors never make build() allocate absurd data sections).
  static uint64_t tensor_bytes(uint32_t type, const std::vector<int64_t>& dims) {
    const DTypeInfo* info = dtype_info(type);
    if (info == nullptr || dims.empty()) return 0;
    uint64_t n = 1;
    for (int64_t d : dims) {
      if (d <= 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return 0;
    }
    if (n > (uint64_t{1} << 32)) return 0;
    return n / static_cast<uint64_t>(info->block_size) * static_cast<uint64_t>(info->block_bytes);
  }

  // Deterministic content of data-section byte `i`, to check tensor_data().
  static uint8_t data_byte(uint64_t i) { return static_cast<uint8_t>((i * 31 + 7) % 251); }

  // Offsets that build() will write, in insertion order.
  std::vector<uint64_t> offsets() const {
    std::vector<uint64_t> out;
    uint64_t cursor = 0;
    for (const Tensor& t : tensors_) {
      const uint64_t off = t.offset ? *t.offset : align_up(cursor, alignment);
      out.push_back(off);
      cursor = off + size_of(t);
    }
    return out;
  }

  Bytes build() const {
    Bytes b;
    put<uint32_t>(b, magic);
    put<uint32_t>(b, version);
    put<uint64_t>(b, tensor_count ? *tensor_count : tensors_.size());
    put<uint64_t>(b, kv_count ? *kv_count : n_kv_);
    b.insert(b.end(), kv_bytes_.begin(), kv_bytes_.end());

    const std::vector<uint64_t> offs = offsets();
    uint64_t data_end = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      put_string(b, t.name);
      put<uint32_t>(b, t.n_dims ? *t.n_dims : static_cast<uint32_t>(t.dims.size()));
      for (int64_t d : t.dims) put<int64_t>(b, d);
      put<uint32_t>(b, t.type);
      put<uint64_t>(b, offs[i]);
      data_end = std::max(data_end, offs[i] + size_of(t));
    }
    if (!tensors_.empty()) {
      b.resize(align_up(b.size(), alignment), 0);
      const uint64_t data_start = b.size();
      const uint64_t n_data =
          data_size ? *data_size : pad_end ? align_up(data_end, alignment) : data_end;
      b.resize(data_start + n_data);
      for (uint64_t i = 0; i < n_data; ++i) b[data_start + i] = data_byte(i);
    }
    b.insert(b.end(), trailing.begin(), trailing.end());
    return b;
  }

 private:
  static uint64_t size_of(const Tensor& t) {
    return t.n_bytes ? *t.n_bytes : tensor_bytes(t.type, t.dims);
  }

  Bytes kv_bytes_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace inferd::gguf::testing
