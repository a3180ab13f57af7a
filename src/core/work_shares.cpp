#include "core/work_shares.h"

#include <cassert>

namespace inferd {

namespace {
uint64_t pack(uint64_t front, uint64_t back) { return front << 32 | back; }
}  // namespace

void WorkShares::resize(int n_slots, int n_threads) {
  n_slots_ = n_slots;
  n_threads_ = std::max(1, n_threads);
  shares_ = std::make_unique<Share[]>(static_cast<size_t>(n_slots_) * n_threads_);
}

void WorkShares::set(int slot, int ti, int64_t begin, int64_t end) {
  assert(slot >= 0 && slot < n_slots_ && ti >= 0 && ti < n_threads_);
  assert(begin >= 0 && end < (int64_t{1} << 32));
  const auto b = static_cast<uint64_t>(begin), e = static_cast<uint64_t>(std::max(begin, end));
  share(slot, ti).range.store(pack(b, e), std::memory_order_relaxed);
}

bool WorkShares::take_front(Share& s, int64_t* u0, int64_t* u1) {
  uint64_t v = s.range.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t front = v >> 32, back = v & 0xffffffffu;
    if (front >= back) return false;
    const uint64_t n = std::max<uint64_t>(1, (back - front) / 4);
    if (s.range.compare_exchange_weak(v, pack(front + n, back), std::memory_order_relaxed)) {
      *u0 = static_cast<int64_t>(front);
      *u1 = static_cast<int64_t>(front + n);
      return true;
    }
  }
}

bool WorkShares::take_all(Share& s, int64_t* u0, int64_t* u1) {
  const uint64_t v = s.range.load(std::memory_order_relaxed);
  const uint64_t front = v >> 32, back = v & 0xffffffffu;
  *u0 = static_cast<int64_t>(front);
  *u1 = static_cast<int64_t>(back);
  return front < back;
}

bool WorkShares::take_back(Share& s, int64_t* u0, int64_t* u1) {
  uint64_t v = s.range.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t front = v >> 32, back = v & 0xffffffffu;
    if (front >= back) return false;
    const uint64_t n = std::max<uint64_t>(1, (back - front) / 2);
    if (s.range.compare_exchange_weak(v, pack(front, back - n), std::memory_order_relaxed)) {
      *u0 = static_cast<int64_t>(back - n);
      *u1 = static_cast<int64_t>(back);
      return true;
    }
  }
}

}  // namespace inferd
