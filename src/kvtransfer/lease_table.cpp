#include "kvtransfer/lease_table.h"

#include <iterator>
#include <utility>

namespace inferd::kvtransfer {

void LeaseTable::add(uint64_t id, double deadline) {
  std::lock_guard lock(mu_);
  held_[id] = deadline;
  stats_.held = static_cast<int64_t>(held_.size());
}

bool LeaseTable::release(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = held_.find(id);
  if (it == held_.end()) return false;
  held_.erase(it);
  ended_.push_back(id);
  ++stats_.released;
  stats_.held = static_cast<int64_t>(held_.size());
  return true;
}

std::vector<uint64_t> LeaseTable::take_ended(double now) {
  std::lock_guard lock(mu_);
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second <= now) {
      ended_.push_back(it->first);
      ++stats_.expired;
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  stats_.held = static_cast<int64_t>(held_.size());
  return std::exchange(ended_, {});
}

std::vector<uint64_t> LeaseTable::take_all() {
  std::lock_guard lock(mu_);
  for (const auto& [id, deadline] : held_) ended_.push_back(id);
  held_.clear();
  stats_.held = 0;
  return std::exchange(ended_, {});
}

LeaseStats LeaseTable::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace inferd::kvtransfer
