// A 64-byte-aligned byte buffer, zeroed unless asked not to be (then its pages
// are committed only as they are first written). With huge_pages, it starts on
// a 2 MiB boundary and is advised to the kernel as transparent huge pages:
// buffers streamed every step (packed weights, the KV cache) then cost one TLB
// entry per 2 MiB instead of one per 4 KiB.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace inferd {

class AlignedBytes {
 public:
  AlignedBytes() = default;
  explicit AlignedBytes(size_t n, bool huge_pages = false, bool zeroed = true);
  uint8_t* data() { return p_.get(); }
  const uint8_t* data() const { return p_.get(); }
  size_t size() const { return n_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t[], Free> p_;
  size_t n_ = 0;
};

}  // namespace inferd
