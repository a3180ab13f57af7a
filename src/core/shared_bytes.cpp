#include "core/shared_bytes.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace inferd {

namespace {
std::string errno_text() { return std::strerror(errno); }
}  // namespace

void Unmap::operator()(const uint8_t* p) const {
  if (p) munmap(const_cast<uint8_t*>(p), n);
}

Result<SharedBytes> SharedBytes::create(size_t n, const std::string& name) {
  if (n == 0) return Error{"shared memory of 0 bytes"};
  SharedBytes b;
  b.fd_ = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (b.fd_ < 0) return Error{"memfd_create: " + errno_text()};
  if (ftruncate(b.fd_, static_cast<off_t>(n)) != 0) return Error{"ftruncate of shared memory: " + errno_text()};
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd_, 0);
  if (p == MAP_FAILED) return Error{"mmap of shared memory: " + errno_text()};
  b.p_ = std::unique_ptr<uint8_t, Unmap>(static_cast<uint8_t*>(p), Unmap{n});
  return b;
}

SharedBytes::~SharedBytes() {
  p_.reset();
  if (fd_ >= 0) close(fd_);
}

Result<SharedMapping> SharedMapping::open(int pid, int fd, size_t bytes, const std::string& name) {
  if (pid <= 0 || fd < 0 || bytes == 0) return Error{"no shared memory was offered"};
  const std::string link = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  // What the descriptor is: a memfd shows as "/memfd:NAME (deleted)".
  char target[256] = {};
  const ssize_t len = readlink(link.c_str(), target, sizeof target - 1);
  if (len < 0) return Error{"readlink " + link + ": " + errno_text()};
  const std::string want = "/memfd:" + name;
  if (std::string(target, static_cast<size_t>(len)).rfind(want, 0) != 0)
    return Error{link + " is '" + std::string(target, static_cast<size_t>(len)) + "', not " + want};
  const int own = ::open(link.c_str(), O_RDONLY | O_CLOEXEC);
  if (own < 0) return Error{"open " + link + ": " + errno_text()};
  struct stat st {};
  if (fstat(own, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    close(own);
    return Error{link + " holds fewer bytes than the pool"};
  }
  // Mapped, not populated: pages are found on first read (populating a
  // memfd's holes would commit memory the producer never used).
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, own, 0);
  close(own);
  if (p == MAP_FAILED) return Error{"mmap " + link + ": " + errno_text()};
  SharedMapping m;
  m.p_ = std::unique_ptr<const uint8_t, Unmap>(static_cast<const uint8_t*>(p), Unmap{bytes});
  return m;
}

}  // namespace inferd
