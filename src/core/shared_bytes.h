// A buffer on anonymous shared memory (a memfd), which another process of the
// same user on this host can map read-only through /proc/<pid>/fd/<fd>:
// a KV producer's pool, so that a consumer on the same host copies blocks out
// of its own mapping with memcpy instead of a system call per segment
// (docs/design.md, "Transports, measured"). Pages are committed as they are
// first written, as AlignedBytes's are when not zeroed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "core/result.h"

namespace inferd {

// Unmaps a mapping of n bytes.
struct Unmap {
  size_t n = 0;
  void operator()(const uint8_t* p) const;
};

class SharedBytes {
 public:
  // n bytes (n > 0) on a new memfd named `name` (what /proc shows as its link).
  static Result<SharedBytes> create(size_t n, const std::string& name);

  SharedBytes() = default;
  SharedBytes(SharedBytes&& other) noexcept : p_(std::move(other.p_)), fd_(std::exchange(other.fd_, -1)) {}
  // Swaps: what this held is released with `other`.
  SharedBytes& operator=(SharedBytes&& other) noexcept {
    std::swap(p_, other.p_);
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~SharedBytes();

  explicit operator bool() const { return p_ != nullptr; }
  uint8_t* data() { return p_.get(); }
  const uint8_t* data() const { return p_.get(); }
  size_t size() const { return p_.get_deleter().n; }
  // The memfd, open for as long as this buffer lives.
  int fd() const { return fd_; }

 private:
  std::unique_ptr<uint8_t, Unmap> p_;
  int fd_ = -1;
};

// Another process's SharedBytes mapped read-only, by its pid and fd. Fails
// (with the reason) where the kernel does not let this process open it, or the
// object there is not a memfd named `name` of at least `bytes` bytes.
class SharedMapping {
 public:
  static Result<SharedMapping> open(int pid, int fd, size_t bytes, const std::string& name);

  explicit operator bool() const { return p_ != nullptr; }
  const uint8_t* data() const { return p_.get(); }
  size_t size() const { return p_.get_deleter().n; }

 private:
  std::unique_ptr<const uint8_t, Unmap> p_;
};

}  // namespace inferd
