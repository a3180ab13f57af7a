// libFuzzer target for the GGUF reader: any input must be either refused
// with an Error or accepted with every promise of gguf.h holding (all tensor
// data inside the image, getters never crash). Built with ASan+UBSan.
//
//   fuzz/run_gguf_fuzz.sh 180     (builds build-fuzz, runs with the seed corpus)
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "gguf/gguf.h"

using inferd::gguf::File;

namespace {

// A broken promise is a bug in the reader: crash so libFuzzer records it.
void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "gguf invariant violated: %s\n", what);
    std::abort();
  }
}

void exercise(const File& f, const uint8_t* data, size_t size) {
  require(f.version() == 2 || f.version() == 3, "version");
  require(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0, "alignment");
  require(f.data_section_size() <= size, "data section size");

  for (const auto& kv : f.metadata()) {
    require(f.find(kv.key) == &kv.value, "find returns the entry");
    // Each getter either succeeds or reports an error; none may crash.
    (void)f.get_string(kv.key);
    (void)f.get_u32(kv.key);
    (void)f.get_u64(kv.key);
    (void)f.get_i64(kv.key);
    (void)f.get_f32(kv.key);
    (void)f.get_bool(kv.key);
    (void)f.get_string_array(kv.key);
    (void)f.get_f32_array(kv.key);
    (void)f.get_i32_array(kv.key);
    require(kv.value.is_array() || kv.value.size() == 1, "scalar holds one element");
  }

  const uint8_t* end = data + size;
  for (const auto& t : f.tensors()) {
    require(f.find_tensor(t.name) == &t, "find_tensor returns the entry");
    require(!t.shape.empty() && t.shape.size() <= 4, "n_dims");
    require(t.n_elements() > 0, "element count");
    require(t.offset % f.alignment() == 0, "offset alignment");
    require(t.offset <= f.data_section_size() && t.n_bytes <= f.data_section_size() - t.offset,
            "tensor inside data section");
    require(t.n_bytes == inferd::row_bytes(t.dtype, t.shape[0]) * static_cast<uint64_t>(t.rows()),
            "n_bytes matches shape");
    const uint8_t* p = f.tensor_data(t);
    require(p >= data && p + t.n_bytes <= end, "tensor data inside the image");
    // Touch the first and last byte: ASan flags any read outside the input.
    volatile uint8_t sink = p[0];
    sink = p[t.n_bytes - 1];
    (void)sink;
  }
  f.prefault(nullptr);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = File::from_memory(data, size);
  if (f.ok()) {
    exercise(**f, data, size);
  } else {
    require(!f.error().message.empty(), "errors carry a message");
  }
  return 0;
}
