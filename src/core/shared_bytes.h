// A buffer on anonymous shared memory (a memfd), which another process of the
// same user on this host can map read-only through /proc/<pid>/fd/<fd>:
// a KV producer's pool, so that a consumer on the same host copies blocks out
// of its own mapping with memcpy instead of a system call per segment
// (docs/design.md, "Transports, measured"). Pages are committed as they are
// first written, as AlignedBytes's are when not zeroed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/result.h"

namespace inferd {

class SharedBytes {
 public:
  // n bytes (n > 0) on a new memfd named `name` (what /proc shows as its link).
  static Result<SharedBytes> create(size_t n, const std::string& name);

  SharedBytes() = default;
  SharedBytes(SharedBytes&& other) noexcept { *this = std::move(other); }
  SharedBytes& operator=(SharedBytes&& other) noexcept;
  SharedBytes(const SharedBytes&) = delete;
  SharedBytes& operator=(const SharedBytes&) = delete;
  ~SharedBytes() { reset(); }

  explicit operator bool() const { return p_ != nullptr; }
  uint8_t* data() { return p_; }
  const uint8_t* data() const { return p_; }
  size_t size() const { return n_; }
  // The memfd, open for as long as this buffer lives.
  int fd() const { return fd_; }

 private:
  void reset();
  uint8_t* p_ = nullptr;
  size_t n_ = 0, mapped_ = 0;
  int fd_ = -1;
};

// Another process's SharedBytes mapped read-only, by its pid and fd. Fails
// (with the reason) where the kernel does not let this process open it, or the
// object there is not a memfd named `name` of at least `bytes` bytes.
class SharedMapping {
 public:
  static Result<SharedMapping> open(int pid, int fd, size_t bytes, const std::string& name);

  SharedMapping() = default;
  SharedMapping(SharedMapping&& other) noexcept { *this = std::move(other); }
  SharedMapping& operator=(SharedMapping&& other) noexcept;
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  ~SharedMapping() { reset(); }

  explicit operator bool() const { return p_ != nullptr; }
  const uint8_t* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  void reset();
  const uint8_t* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace inferd
