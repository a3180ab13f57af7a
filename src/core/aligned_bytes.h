// A 64-byte-aligned byte buffer, zeroed unless asked not to be (then its pages
// are committed only as they are first written). With huge_pages, it starts on
// a 2 MiB boundary and is advised to the kernel as transparent huge pages:
// buffers streamed every step (packed weights, the KV cache) then cost one TLB
// entry per 2 MiB instead of one per 4 KiB. Such a buffer is mapped from the
// kernel on its own: zeroed either way, and committed only as first written.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace inferd {

// AlignedBytes' deleter: munmap for a mapping of its own, free otherwise.
struct AlignedBytesFree {
  size_t mapped = 0;  // the length of its own mapping, or 0 if from aligned_alloc
  void operator()(uint8_t* p) const;
};

class AlignedBytes {
 public:
  AlignedBytes() = default;
  explicit AlignedBytes(size_t n, bool huge_pages = false, bool zeroed = true);
  uint8_t* data() { return p_.get(); }
  const uint8_t* data() const { return p_.get(); }
  size_t size() const { return n_; }

 private:
  std::unique_ptr<uint8_t[], AlignedBytesFree> p_;
  size_t n_ = 0;
};

}  // namespace inferd
