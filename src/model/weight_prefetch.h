// The weight bytes one thread reads in a decode step, in the order it reads
// them, and a cursor that prefetches them into its L2 cache while the thread
// would otherwise wait (at a barrier, say).
//
// Why: a decode step streams every weight once, so it is bound by memory
// bandwidth only while memory is kept busy. Between two projections (barriers,
// norms, RoPE, attention) nothing is read and the bandwidth is lost; a thread
// that spends that time prefetching its next weights finds them in L2 and its
// matmul then runs at the kernel's speed, not memory's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace inferd {

class WeightPrefetcher {
 public:
  // Forgets the ranges (keeps the memory).
  void clear();
  // Back to the first range with nothing prefetched or read: a new step that
  // reads the same ranges.
  void restart();
  // Appends bytes [p, p + n) to the thread's reading order (n may be 0: a
  // projection of which the thread has no share still counts as a range).
  void add(const void* p, size_t n);
  // The thread has read its first n ranges.
  void read_first(size_t n);
  // Prefetches up to `lines` more 64-byte lines, staying at most `lead` bytes
  // ahead of what has been read. False when it has nothing to do.
  bool advance(int lines, size_t lead);

  size_t size() const { return ranges_.size(); }
  // Bytes prefetched in ranges not read yet.
  size_t ahead() const { return ahead_; }

 private:
  struct Range {
    const uint8_t* p;
    size_t n;
  };
  std::vector<Range> ranges_;
  size_t next_range_ = 0;  // the next line to prefetch: ranges_[next_range_].p + next_offset_
  size_t next_offset_ = 0;
  size_t first_unread_ = 0;  // ranges before this one have been read
  size_t ahead_ = 0;         // bytes prefetched in ranges not yet read
};

}  // namespace inferd
