#include "model/weight_prefetch.h"

#include <algorithm>

namespace inferd {

namespace {
constexpr size_t kLine = 64;
}

void WeightPrefetcher::clear() {
  ranges_.clear();
  restart();
}

void WeightPrefetcher::restart() { next_range_ = next_offset_ = first_unread_ = ahead_ = 0; }

void WeightPrefetcher::add(const void* p, size_t n) { ranges_.push_back({static_cast<const uint8_t*>(p), n}); }

void WeightPrefetcher::read_first(size_t n) {
  for (; first_unread_ < n && first_unread_ < ranges_.size(); ++first_unread_) {
    if (first_unread_ < next_range_) {
      ahead_ -= ranges_[first_unread_].n;
    } else if (first_unread_ == next_range_) {
      ahead_ -= next_offset_;
    }
  }
  if (next_range_ < first_unread_) {  // the cursor fell behind the reading: skip what is read
    next_range_ = first_unread_;
    next_offset_ = 0;
  }
}

bool WeightPrefetcher::advance(int lines, size_t lead) {
  int issued = 0;
  while (issued < lines && ahead_ < lead && next_range_ < ranges_.size()) {
    const Range& r = ranges_[next_range_];
    if (next_offset_ >= r.n) {
      ++next_range_;
      next_offset_ = 0;
      continue;
    }
    __builtin_prefetch(r.p + next_offset_, /*rw=*/0, /*locality=*/2);  // prefetcht1: into L2
    const size_t step = std::min(kLine, r.n - next_offset_);
    next_offset_ += step;
    ahead_ += step;
    ++issued;
  }
  return issued > 0;
}

}  // namespace inferd
