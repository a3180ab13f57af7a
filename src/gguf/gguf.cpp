// GGUF reader: parses and validates the whole header up front (see gguf.h).
//
// Layout (all little-endian), versions 2 and 3:
//   magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count x  { string key | u32 value_type | value }
//   tensor_count x { string name | u32 n_dims | n_dims x u64 dim | u32 type | u64 offset }
//   padding to general.alignment (default 32)
//   tensor data section; each tensor's offset is relative to its start
// A string is u64 length + bytes (no terminator); an array value is
// u32 element_type + u64 count + elements.
//
// Every read is bounds-checked and every size computation overflow-checked:
// the input is untrusted (fuzzed), so nothing here may assert or invoke UB.
#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

namespace inferd::gguf {

static_assert(std::endian::native == std::endian::little,
              "the reader copies little-endian GGUF fields straight into host integers");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
constexpr uint32_t kMaxValueType = static_cast<uint32_t>(ValueType::FLOAT64);
// Smallest possible encodings, used to refuse counts that cannot fit in the
// bytes left before allocating anything for them.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;               // empty key, u32 type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, 1 dim

// Untrusted bytes rendered for an error message: printable ASCII kept, the
// rest escaped, long strings cut, so messages never echo raw file bytes.
std::string printable(std::string_view s) {
  constexpr size_t kMaxShown = 80;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (s.size() > kMaxShown) out += "...";
  return out;
}

std::string quoted(std::string_view s) { return "'" + printable(s) + "'"; }

bool is_integer_type(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::UINT16: case ValueType::INT16:
    case ValueType::UINT32: case ValueType::INT32: case ValueType::UINT64: case ValueType::INT64:
      return true;
    default:
      return false;
  }
}

bool is_unsigned_type(ValueType t) {
  return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 ||
         t == ValueType::UINT64;
}

bool is_float_type(ValueType t) { return t == ValueType::FLOAT32 || t == ValueType::FLOAT64; }

// Encoded size of one element; 0 for STRING (variable) and ARRAY.
uint64_t fixed_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    case ValueType::STRING: case ValueType::ARRAY: return 0;
  }
  return 0;
}

std::string describe(const Value& v) {
  if (v.is_array()) return std::string("an array of ") + value_type_name(v.elem_type);
  return value_type_name(v.type);
}

// value rounded up to a multiple of `align` (a power of two); false on overflow.
bool align_up(uint64_t value, uint64_t align, uint64_t* out) {
  uint64_t sum;
  if (__builtin_add_overflow(value, align - 1, &sum)) return false;
  *out = sum & ~(align - 1);
  return true;
}

// Bounds-checked little-endian cursor over the image.
class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }
  uint64_t remaining() const { return size_ - pos_; }

  template <class T>
  bool read(T* out) {
    if (sizeof(T) > remaining()) return false;
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // The caller has checked n <= remaining().
  std::string_view take(uint64_t n) {
    std::string_view s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// Header parsing with error messages that say what was being read. `Ctx` is
// a callable returning a description ("key 'x'"), built only on failure so the
// 262144-entry vocabulary arrays parse without string churn.
class Parser {
 public:
  explicit Parser(Reader& r) : r_(r) {}

  Error truncated(const std::string& what) const {
    return make_error("file truncated while reading " + what + " (at byte " +
                      std::to_string(r_.pos()) + " of " + std::to_string(r_.size()) + ")");
  }

  template <class T, class Ctx>
  Status read(T* out, Ctx&& what) {
    if (!r_.read(out)) return truncated(what());
    return {};
  }

  template <class Ctx>
  Status read_string(std::string* out, Ctx&& what) {
    uint64_t len = 0;
    if (!r_.read(&len)) return truncated("the length of " + what());
    if (len > r_.remaining()) {
      return make_error("string length " + std::to_string(len) + " of " + what() +
                        " exceeds the " + std::to_string(r_.remaining()) +
                        " bytes left in the file");
    }
    out->assign(r_.take(len));
    return {};
  }

  // One element of type t appended to v. `what` names the key (and index).
  template <class Ctx>
  Status read_element(ValueType t, Value* v, Ctx&& what) {
    switch (t) {
      case ValueType::UINT8: return read_uint<uint8_t>(v, what);
      case ValueType::UINT16: return read_uint<uint16_t>(v, what);
      case ValueType::UINT32: return read_uint<uint32_t>(v, what);
      case ValueType::UINT64: return read_uint<uint64_t>(v, what);
      case ValueType::INT8: return read_int<int8_t>(v, what);
      case ValueType::INT16: return read_int<int16_t>(v, what);
      case ValueType::INT32: return read_int<int32_t>(v, what);
      case ValueType::INT64: return read_int<int64_t>(v, what);
      case ValueType::FLOAT32: {
        float f;
        if (!r_.read(&f)) return truncated(what());
        v->floats.push_back(f);
        return {};
      }
      case ValueType::FLOAT64: {
        double d;
        if (!r_.read(&d)) return truncated(what());
        v->floats.push_back(d);
        return {};
      }
      case ValueType::BOOL: {
        uint8_t b;
        if (!r_.read(&b)) return truncated(what());
        if (b > 1) {
          return make_error("invalid bool value " + std::to_string(b) + " in " + what() +
                            " (must be 0 or 1)");
        }
        v->ints.push_back(b);
        return {};
      }
      case ValueType::STRING: {
        v->strings.emplace_back();
        return read_string(&v->strings.back(), what);
      }
      case ValueType::ARRAY:
        break;
    }
    return make_error("nested arrays are not supported (" + what() + ")");
  }

  // A whole metadata value of type `type` for key `key`.
  Status read_value(ValueType type, const std::string& key, Value* v) {
    auto key_ctx = [&] { return "the value of key " + quoted(key); };
    v->type = type;
    v->elem_type = type;
    if (type != ValueType::ARRAY) return read_element(type, v, key_ctx);

    uint32_t raw_elem = 0;
    if (Status s = read(&raw_elem, [&] { return "the array element type of key " + quoted(key); });
        !s) {
      return s;
    }
    if (raw_elem > kMaxValueType) {
      return make_error("invalid array element type " + std::to_string(raw_elem) + " for key " +
                        quoted(key));
    }
    const auto elem = static_cast<ValueType>(raw_elem);
    if (elem == ValueType::ARRAY) {
      return make_error("nested arrays are not supported (key " + quoted(key) + ")");
    }
    v->elem_type = elem;
    uint64_t count = 0;
    if (Status s = read(&count, [&] { return "the array length of key " + quoted(key); }); !s) {
      return s;
    }
    // A string element takes at least its 8-byte length.
    const uint64_t min_elem = elem == ValueType::STRING ? 8 : fixed_size(elem);
    if (count > r_.remaining() / min_elem) {
      return make_error("array length " + std::to_string(count) + " of key " + quoted(key) +
                        " exceeds the " + std::to_string(r_.remaining()) +
                        " bytes left in the file");
    }
    if (elem == ValueType::STRING) {
      v->strings.reserve(count);
    } else if (is_float_type(elem)) {
      v->floats.reserve(count);
    } else if (is_unsigned_type(elem)) {
      v->uints.reserve(count);
    } else {
      v->ints.reserve(count);
    }
    for (uint64_t i = 0; i < count; ++i) {
      Status s = read_element(elem, v, [&] {
        return "element " + std::to_string(i) + " of array key " + quoted(key);
      });
      if (!s) return s;
    }
    return {};
  }

 private:
  template <class T, class Ctx>
  Status read_uint(Value* v, Ctx&& what) {
    T x;
    if (!r_.read(&x)) return truncated(what());
    v->uints.push_back(x);
    return {};
  }
  template <class T, class Ctx>
  Status read_int(Value* v, Ctx&& what) {
    T x;
    if (!r_.read(&x)) return truncated(what());
    v->ints.push_back(x);
    return {};
  }

  Reader& r_;
};

// ---- types expected for well-known keys ------------------------------------
// A wrongly typed well-known key would otherwise surface later as a confusing
// "missing key" or a silently wrong default; refuse it at load time instead.
enum class Want { kString, kUint32, kInteger, kIntegerOrArray, kFloat, kBool,
                  kStringArray, kF32Array, kI32Array };

struct KeyRule {
  std::string_view name;
  Want want;
};

constexpr KeyRule kExactKeys[] = {
    {"general.architecture", Want::kString},
    {"general.alignment", Want::kUint32},
    {"general.name", Want::kString},
    {"general.file_type", Want::kInteger},
    {"general.quantization_version", Want::kInteger},
    {"tokenizer.ggml.model", Want::kString},
    {"tokenizer.ggml.pre", Want::kString},
    {"tokenizer.ggml.tokens", Want::kStringArray},
    {"tokenizer.ggml.scores", Want::kF32Array},
    {"tokenizer.ggml.token_type", Want::kI32Array},
    {"tokenizer.ggml.merges", Want::kStringArray},
    {"tokenizer.ggml.bos_token_id", Want::kInteger},
    {"tokenizer.ggml.eos_token_id", Want::kInteger},
    {"tokenizer.ggml.unknown_token_id", Want::kInteger},
    {"tokenizer.ggml.padding_token_id", Want::kInteger},
    {"tokenizer.ggml.separator_token_id", Want::kInteger},
    {"tokenizer.ggml.eot_token_id", Want::kInteger},
    {"tokenizer.ggml.eom_token_id", Want::kInteger},
    {"tokenizer.ggml.add_bos_token", Want::kBool},
    {"tokenizer.ggml.add_eos_token", Want::kBool},
    {"tokenizer.ggml.add_sep_token", Want::kBool},
    {"tokenizer.ggml.add_space_prefix", Want::kBool},
    {"tokenizer.chat_template", Want::kString},
};

// Matched as "<arch>.<name>" where <arch> is a single dotted segment. Head
// counts and feed-forward sizes may be per-layer arrays in some architectures.
constexpr KeyRule kArchKeys[] = {
    {"context_length", Want::kInteger},
    {"block_count", Want::kInteger},
    {"embedding_length", Want::kInteger},
    {"vocab_size", Want::kInteger},
    {"feed_forward_length", Want::kIntegerOrArray},
    {"attention.head_count", Want::kIntegerOrArray},
    {"attention.head_count_kv", Want::kIntegerOrArray},
    {"attention.key_length", Want::kInteger},
    {"attention.value_length", Want::kInteger},
    {"attention.layer_norm_rms_epsilon", Want::kFloat},
    {"attention.layer_norm_epsilon", Want::kFloat},
    {"rope.freq_base", Want::kFloat},
    {"rope.dimension_count", Want::kInteger},
};

const char* want_name(Want w) {
  switch (w) {
    case Want::kString: return "a STRING";
    case Want::kUint32: return "a UINT32";
    case Want::kInteger: return "an integer";
    case Want::kIntegerOrArray: return "an integer or an array of integers";
    case Want::kFloat: return "a FLOAT32 or FLOAT64";
    case Want::kBool: return "a BOOL";
    case Want::kStringArray: return "an array of STRING";
    case Want::kF32Array: return "an array of FLOAT32";
    case Want::kI32Array: return "an array of INT32";
  }
  return "?";
}

bool satisfies(const Value& v, Want w) {
  const bool arr = v.is_array();
  switch (w) {
    case Want::kString: return !arr && v.type == ValueType::STRING;
    case Want::kUint32: return !arr && v.type == ValueType::UINT32;
    case Want::kInteger: return !arr && is_integer_type(v.type);
    case Want::kIntegerOrArray: return is_integer_type(v.elem_type);
    case Want::kFloat: return !arr && is_float_type(v.type);
    case Want::kBool: return !arr && v.type == ValueType::BOOL;
    case Want::kStringArray: return arr && v.elem_type == ValueType::STRING;
    case Want::kF32Array: return arr && v.elem_type == ValueType::FLOAT32;
    case Want::kI32Array: return arr && v.elem_type == ValueType::INT32;
  }
  return false;
}

const KeyRule* rule_for(std::string_view key) {
  for (const KeyRule& r : kExactKeys) {
    if (r.name == key) return &r;
  }
  const size_t dot = key.find('.');
  if (dot == std::string_view::npos || dot == 0) return nullptr;
  const std::string_view prefix = key.substr(0, dot);
  if (prefix == "general" || prefix == "tokenizer") return nullptr;
  const std::string_view rest = key.substr(dot + 1);
  for (const KeyRule& r : kArchKeys) {
    if (r.name == rest) return &r;
  }
  return nullptr;
}

// Integer element i of v as T, or nullopt if v is not integer-typed or the
// value does not fit.
template <class T>
std::optional<T> int_as(const Value& v, size_t i) {
  if (!is_integer_type(v.elem_type)) return std::nullopt;
  if (is_unsigned_type(v.elem_type)) {
    if (i >= v.uints.size() || !std::in_range<T>(v.uints[i])) return std::nullopt;
    return static_cast<T>(v.uints[i]);
  }
  if (i >= v.ints.size() || !std::in_range<T>(v.ints[i])) return std::nullopt;
  return static_cast<T>(v.ints[i]);
}

std::string element_to_string(const Value& v, size_t i) {
  if (is_unsigned_type(v.elem_type)) return std::to_string(v.uints[i]);
  return std::to_string(v.ints[i]);
}

}  // namespace

// ---- small public helpers ---------------------------------------------------

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "UINT8";
    case ValueType::INT8: return "INT8";
    case ValueType::UINT16: return "UINT16";
    case ValueType::INT16: return "INT16";
    case ValueType::UINT32: return "UINT32";
    case ValueType::INT32: return "INT32";
    case ValueType::FLOAT32: return "FLOAT32";
    case ValueType::BOOL: return "BOOL";
    case ValueType::STRING: return "STRING";
    case ValueType::ARRAY: return "ARRAY";
    case ValueType::UINT64: return "UINT64";
    case ValueType::INT64: return "INT64";
    case ValueType::FLOAT64: return "FLOAT64";
  }
  return "INVALID";
}

size_t Value::size() const {
  if (elem_type == ValueType::STRING) return strings.size();
  if (is_float_type(elem_type)) return floats.size();
  if (is_unsigned_type(elem_type)) return uints.size();
  return ints.size();
}

int64_t TensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return -1;  // never for a validated tensor
  }
  return n;
}

// ---- opening ----------------------------------------------------------------

Result<std::unique_ptr<File>> File::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error("cannot stat " + path + ": " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(path + " is not a regular file");
  }
  if (st.st_size <= 0) {
    ::close(fd);
    return make_error(path + ": file is empty, not a GGUF file");
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) return make_error("cannot mmap " + path + ": " + std::strerror(map_err));

  std::unique_ptr<File> f(new File());
  f->base_ = static_cast<const uint8_t*>(map);
  f->size_ = size;
  f->mapped_ = true;  // from here on the destructor unmaps
  if (Status s = f->parse(); !s) return make_error(path + ": " + s.error().message);
  return f;
}

Result<std::unique_ptr<File>> File::from_memory(const uint8_t* data, size_t size) {
  if (data == nullptr && size != 0) return make_error("GGUF image pointer is null");
  std::unique_ptr<File> f(new File());
  f->base_ = data;
  f->size_ = size;
  if (Status s = f->parse(); !s) return s.error();
  return f;
}

File::~File() {
  if (mapped_ && base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

// ---- parsing ----------------------------------------------------------------

Status File::parse() {
  Reader r(base_, size_);
  Parser p(r);

  // Header.
  uint32_t magic = 0;
  if (!r.read(&magic)) {
    return make_error("file too small to be GGUF (" + std::to_string(size_) + " bytes)");
  }
  if (magic != kMagic) return make_error("bad magic: not a GGUF file");
  if (Status s = p.read(&version_, [] { return std::string("the version"); }); !s) return s;
  if (version_ != 2 && version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(version_);
    if (swapped == 2 || swapped == 3) {
      return make_error("big-endian GGUF files are not supported");
    }
    return make_error("unsupported GGUF version " + std::to_string(version_) +
                      " (only versions 2 and 3 are supported)");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  if (Status s = p.read(&n_tensors, [] { return std::string("the tensor count"); }); !s) return s;
  if (Status s = p.read(&n_kv, [] { return std::string("the metadata count"); }); !s) return s;
  if (n_tensors > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return make_error("tensor count " + std::to_string(n_tensors) + " overflows int64");
  }
  if (n_kv > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return make_error("metadata count " + std::to_string(n_kv) + " overflows int64");
  }
  // Both counts bounded by the bytes left, so the sum cannot overflow.
  if (n_kv > r.remaining() / kMinKvBytes) {
    return make_error("metadata count " + std::to_string(n_kv) + " cannot fit in the " +
                      std::to_string(r.remaining()) + " bytes left in the file");
  }
  if (n_tensors > r.remaining() / kMinTensorInfoBytes ||
      n_kv * kMinKvBytes + n_tensors * kMinTensorInfoBytes > r.remaining()) {
    return make_error("tensor count " + std::to_string(n_tensors) + " cannot fit in the " +
                      std::to_string(r.remaining()) + " bytes left in the file");
  }

  // Metadata.
  kv_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    KeyValue kv;
    Status s = p.read_string(&kv.key, [&] { return "the key of metadata entry " + std::to_string(i); });
    if (!s) return s;
    if (kv.key.empty()) return make_error("metadata entry " + std::to_string(i) + " has an empty key");
    uint32_t raw_type = 0;
    s = p.read(&raw_type, [&] { return "the value type of key " + quoted(kv.key); });
    if (!s) return s;
    if (raw_type > kMaxValueType) {
      return make_error("invalid value type " + std::to_string(raw_type) + " for key " +
                        quoted(kv.key));
    }
    if (s = p.read_value(static_cast<ValueType>(raw_type), kv.key, &kv.value); !s) return s;
    if (kv_index_.count(kv.key) != 0) return make_error("duplicate key " + quoted(kv.key));
    kv_index_.emplace(kv.key, kv_.size());
    kv_.push_back(std::move(kv));
  }

  // Well-known keys must have the types their readers expect.
  for (const KeyValue& kv : kv_) {
    const KeyRule* rule = rule_for(kv.key);
    if (rule != nullptr && !satisfies(kv.value, rule->want)) {
      return make_error("key " + quoted(kv.key) + " must be " + want_name(rule->want) +
                        ", but is " + describe(kv.value));
    }
  }
  if (const Value* tokens = find("tokenizer.ggml.tokens")) {
    for (const char* key : {"tokenizer.ggml.scores", "tokenizer.ggml.token_type"}) {
      const Value* v = find(key);
      if (v != nullptr && v->size() != tokens->size()) {
        return make_error(std::string("key '") + key + "' has " + std::to_string(v->size()) +
                          " entries but tokenizer.ggml.tokens has " +
                          std::to_string(tokens->size()));
      }
    }
  }
  if (const Value* a = find("general.alignment")) {
    const uint64_t align = a->uints.at(0);  // UINT32, checked above
    if (align == 0) return make_error("general.alignment is 0");
    if (!std::has_single_bit(align)) {
      return make_error("general.alignment " + std::to_string(align) + " is not a power of two");
    }
    alignment_ = align;
  } else {
    alignment_ = kDefaultAlignment;
  }

  // Tensor infos.
  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    const std::string idx = std::to_string(i);
    Status s = p.read_string(&t.name, [&] { return "the name of tensor " + idx; });
    if (!s) return s;
    if (t.name.empty()) return make_error("tensor " + idx + " has an empty name");
    const std::string tname = "tensor " + quoted(t.name);
    uint32_t n_dims = 0;
    if (s = p.read(&n_dims, [&] { return "the n_dims of " + tname; }); !s) return s;
    if (n_dims == 0 || n_dims > kMaxDims) {
      return make_error(tname + ": n_dims " + std::to_string(n_dims) + " is out of range 1.." +
                        std::to_string(kMaxDims));
    }
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      int64_t dim = 0;
      if (s = p.read(&dim, [&] { return "the shape of " + tname; }); !s) return s;
      if (dim <= 0) {
        return make_error(tname + ": dimension " + std::to_string(d) + " is " +
                          std::to_string(dim) + " (must be positive)");
      }
      if (__builtin_mul_overflow(n_elements, dim, &n_elements)) {
        return make_error(tname + ": element count overflows int64");
      }
      t.shape.push_back(dim);
    }
    uint32_t raw_type = 0;
    if (s = p.read(&raw_type, [&] { return "the type of " + tname; }); !s) return s;
    const DTypeInfo* ti = dtype_info(raw_type);
    if (ti == nullptr || raw_type == static_cast<uint32_t>(DType::F8_E4M3)) {  // F8_E4M3: inferd's, not GGML's
      return make_error(tname + ": unknown or unsupported tensor type " + std::to_string(raw_type));
    }
    t.dtype = static_cast<DType>(raw_type);
    if (t.shape[0] % ti->block_size != 0) {
      return make_error(tname + ": row size " + std::to_string(t.shape[0]) +
                        " is not a multiple of the block size " + std::to_string(ti->block_size) +
                        " of type " + ti->name);
    }
    int64_t n_bytes;
    if (__builtin_mul_overflow(n_elements / ti->block_size, ti->block_bytes, &n_bytes)) {
      return make_error(tname + ": byte size overflows int64");
    }
    t.n_bytes = static_cast<uint64_t>(n_bytes);
    if (s = p.read(&t.offset, [&] { return "the data offset of " + tname; }); !s) return s;
    if (t.offset % alignment_ != 0) {
      return make_error(tname + ": offset " + std::to_string(t.offset) +
                        " is not a multiple of the alignment " + std::to_string(alignment_));
    }
    if (tensor_index_.count(t.name) != 0) return make_error("duplicate tensor name " + quoted(t.name));
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // Data section: starts at the next multiple of the alignment.
  uint64_t data_offset;
  if (!align_up(r.pos(), alignment_, &data_offset)) {
    return make_error("tensor data offset overflows with alignment " + std::to_string(alignment_));
  }
  if (data_offset > size_) {
    if (!tensors_.empty()) {
      return make_error("file truncated: the tensor data section starts at byte " +
                        std::to_string(data_offset) + " but the file has " +
                        std::to_string(size_) + " bytes");
    }
    data_offset = size_;  // no tensors: an unpadded end is fine
  }
  data_ = base_ + data_offset;
  data_size_ = size_ - data_offset;

  // Tensors must tile the data section in offset order, each padded to the
  // alignment: no overlaps (one write would corrupt another) and no gaps
  // (bytes nobody accounts for). Writers pad after the last tensor too, or not.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors_[a].offset < tensors_[b].offset;
  });
  uint64_t expected = 0;       // where the next tensor must start
  const TensorInfo* prev = nullptr;
  for (size_t i : order) {
    const TensorInfo& t = tensors_[i];
    uint64_t end;
    if (__builtin_add_overflow(t.offset, t.n_bytes, &end) || end > data_size_) {
      return make_error("tensor " + quoted(t.name) + ": data at offset " + std::to_string(t.offset) +
                        " (" + std::to_string(t.n_bytes) + " bytes) extends past the end of the file " +
                        "(data section has " + std::to_string(data_size_) + " bytes)");
    }
    if (t.offset < expected) {
      return make_error("tensor " + quoted(t.name) + " at offset " + std::to_string(t.offset) +
                        " overlaps tensor " + quoted(prev->name) + " which ends at " +
                        std::to_string(prev->offset + prev->n_bytes));
    }
    if (t.offset > expected) {
      return make_error("gap of " + std::to_string(t.offset - expected) +
                        " unused bytes before tensor " + quoted(t.name) + " at offset " +
                        std::to_string(t.offset) + " (tensors must be contiguous)");
    }
    if (!align_up(end, alignment_, &expected)) expected = end;  // end <= size_: cannot overflow in practice
    prev = &t;
  }
  if (data_size_ > expected) {
    return make_error(std::to_string(data_size_ - expected) + " unused bytes after " +
                      (prev ? "the last tensor " + quoted(prev->name) : std::string("the header")));
  }
  return {};
}

// ---- lookups ----------------------------------------------------------------

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].value;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

Result<const Value*> lookup(const File& f, std::string_view key) {
  const Value* v = f.find(key);
  if (v == nullptr) return make_error("missing key " + quoted(key));
  return v;
}

Error wrong_type(std::string_view key, const Value& v, const char* wanted) {
  return make_error("key " + quoted(key) + " is " + describe(v) + ", expected " + wanted);
}

template <class T>
Result<T> get_int(const File& f, std::string_view key, const char* type_name) {
  auto v = lookup(f, key);
  if (!v) return v.error();
  const Value& val = **v;
  if (val.is_array() || !is_integer_type(val.type)) return wrong_type(key, val, "an integer");
  std::optional<T> x = int_as<T>(val, 0);
  if (!x) {
    return make_error("key " + quoted(key) + " value " + element_to_string(val, 0) +
                      " does not fit in " + type_name);
  }
  return *x;
}

}  // namespace

Result<std::string> File::get_string(std::string_view key) const {
  auto v = lookup(*this, key);
  if (!v) return v.error();
  if ((*v)->is_array() || (*v)->type != ValueType::STRING) return wrong_type(key, **v, "a STRING");
  return (*v)->strings.at(0);
}

Result<uint32_t> File::get_u32(std::string_view key) const {
  return get_int<uint32_t>(*this, key, "uint32");
}

Result<uint64_t> File::get_u64(std::string_view key) const {
  return get_int<uint64_t>(*this, key, "uint64");
}

Result<int64_t> File::get_i64(std::string_view key) const {
  return get_int<int64_t>(*this, key, "int64");
}

Result<float> File::get_f32(std::string_view key) const {
  auto v = lookup(*this, key);
  if (!v) return v.error();
  const Value& val = **v;
  if (val.is_array() || !is_float_type(val.type)) return wrong_type(key, val, "a FLOAT32 or FLOAT64");
  const double d = val.floats.at(0);
  if (std::isfinite(d) && std::fabs(d) > std::numeric_limits<float>::max()) {
    return make_error("key " + quoted(key) + " value " + std::to_string(d) +
                      " is out of range for float32");
  }
  return static_cast<float>(d);
}

Result<bool> File::get_bool(std::string_view key) const {
  auto v = lookup(*this, key);
  if (!v) return v.error();
  if ((*v)->is_array() || (*v)->type != ValueType::BOOL) return wrong_type(key, **v, "a BOOL");
  return (*v)->ints.at(0) != 0;
}

Result<std::vector<std::string>> File::get_string_array(std::string_view key) const {
  auto v = lookup(*this, key);
  if (!v) return v.error();
  if (!(*v)->is_array() || (*v)->elem_type != ValueType::STRING) {
    return wrong_type(key, **v, "an array of STRING");
  }
  return (*v)->strings;
}

Result<std::vector<float>> File::get_f32_array(std::string_view key) const {
  auto v = lookup(*this, key);
  if (!v) return v.error();
  const Value& val = **v;
  if (!val.is_array() || !is_float_type(val.elem_type)) {
    return wrong_type(key, val, "an array of FLOAT32 or FLOAT64");
  }
  std::vector<float> out;
  out.reserve(val.floats.size());
  for (size_t i = 0; i < val.floats.size(); ++i) {
    const double d = val.floats[i];
    if (std::isfinite(d) && std::fabs(d) > std::numeric_limits<float>::max()) {
      return make_error("element " + std::to_string(i) + " of key " + quoted(key) +
                        " is out of range for float32");
    }
    out.push_back(static_cast<float>(d));
  }
  return out;
}

Result<std::vector<int32_t>> File::get_i32_array(std::string_view key) const {
  auto v = lookup(*this, key);
  if (!v) return v.error();
  const Value& val = **v;
  if (!val.is_array() || !is_integer_type(val.elem_type)) {
    return wrong_type(key, val, "an array of integers");
  }
  std::vector<int32_t> out;
  const size_t n = val.size();
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    std::optional<int32_t> x = int_as<int32_t>(val, i);
    if (!x) {
      return make_error("element " + std::to_string(i) + " of key " + quoted(key) + " (" +
                        element_to_string(val, i) + ") does not fit in int32");
    }
    out.push_back(*x);
  }
  return out;
}

// ---- prefault and release ---------------------------------------------------

void File::release_pages(const void* p, uint64_t n) const {
  // Only the file's own pages: weights derived at load (a split attn_kv_b)
  // live in ordinary memory, which MADV_DONTNEED would zero.
  const auto* b = static_cast<const uint8_t*>(p);
  if (!mapped_ || n == 0 || b < base_ || b + n > base_ + size_) return;
  const long sys_page = ::sysconf(_SC_PAGESIZE);
  const uintptr_t page = sys_page > 0 ? static_cast<uintptr_t>(sys_page) : 4096;
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + page - 1) & ~(page - 1);  // whole pages only: a
  const uintptr_t last = (begin + n) & ~(page - 1);          // neighbour may share the edges
  if (last <= first) return;
  // The mapping is private and read-only, so its pages are clean copies of the
  // file: MADV_DONTNEED only unmaps them.
  ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void File::prefault(const ProgressFn& progress) const {
  if (data_size_ == 0) {
    if (progress) progress(1.0);
    return;
  }
  const long sys_page = ::sysconf(_SC_PAGESIZE);
  const uint64_t page = sys_page > 0 ? static_cast<uint64_t>(sys_page) : 4096;
  if (mapped_) {
    // Ask the kernel to start reading ahead; the loop below then mostly hits
    // pages already in flight. madvise needs a page-aligned start.
    const auto addr = reinterpret_cast<uintptr_t>(data_);
    const uintptr_t start = addr & ~static_cast<uintptr_t>(page - 1);
    ::madvise(reinterpret_cast<void*>(start), data_size_ + (addr - start), MADV_WILLNEED);
  }
  // Report about every 1% (at least every page).
  const uint64_t report_step = std::max<uint64_t>(page, data_size_ / 100);
  uint64_t next_report = report_step;
  uint8_t acc = 0;
  for (uint64_t off = 0; off < data_size_; off += page) {
    acc ^= data_[off];
    if (progress && off >= next_report) {
      progress(static_cast<double>(off) / static_cast<double>(data_size_));
      next_report += report_step;
    }
  }
  acc ^= data_[data_size_ - 1];  // the last page may start after the last stride
  // Keep the reads from being optimized away.
  volatile uint8_t sink = acc;
  (void)sink;
  if (progress) progress(1.0);
}

void File::prefault(const ProgressFn& progress, const std::function<bool(const TensorInfo&)>& wanted) const {
  std::vector<std::pair<const void*, uint64_t>> ranges;
  for (const TensorInfo& t : tensors_)
    if (wanted(t)) ranges.emplace_back(data_ + t.offset, t.n_bytes);
  prefault(progress, ranges);
}

void File::prefault(const ProgressFn& progress, const std::vector<std::pair<const void*, uint64_t>>& ranges) const {
  const long sys_page = ::sysconf(_SC_PAGESIZE);
  const uint64_t page = sys_page > 0 ? static_cast<uint64_t>(sys_page) : 4096;
  uint64_t total = 0, done = 0;
  for (const auto& [p, n] : ranges) total += n;
  uint8_t acc = 0;
  for (const auto& [start_p, n_bytes] : ranges) {
    if (n_bytes == 0) continue;
    const auto* p = static_cast<const uint8_t*>(start_p);
    if (mapped_) {
      const auto addr = reinterpret_cast<uintptr_t>(p);
      const uintptr_t start = addr & ~static_cast<uintptr_t>(page - 1);
      ::madvise(reinterpret_cast<void*>(start), n_bytes + (addr - start), MADV_WILLNEED);
    }
    for (uint64_t off = 0; off < n_bytes; off += page) acc ^= p[off];
    acc ^= p[n_bytes - 1];
    done += n_bytes;
    if (progress && total > 0) progress(static_cast<double>(done) / static_cast<double>(total));
  }
  volatile uint8_t sink = acc;
  (void)sink;
  if (progress) progress(1.0);
}

}  // namespace inferd::gguf
