#include "kv/state_slot_pool.h"

#include "kv/check.h"

namespace inferd::kv {

StateSlotPool::StateSlotPool(int32_t n_slots) {
  INFERD_KV_CHECK(n_slots >= 0, "a negative number of state slots");
  holder_.resize(static_cast<size_t>(n_slots));
}

std::optional<int32_t> StateSlotPool::allocate(const std::string& request_id) {
  INFERD_KV_CHECK(!request_id.empty(), "a state slot for a request without an id");
  INFERD_KV_CHECK(slot_of_.count(request_id) == 0, "a request takes a second state slot");
  for (int32_t s = 0; s < num_slots(); ++s) {
    if (holder_[s].empty()) {
      holder_[s] = request_id;
      slot_of_.emplace(request_id, s);
      return s;
    }
  }
  return std::nullopt;
}

void StateSlotPool::free(const std::string& request_id) {
  auto it = slot_of_.find(request_id);
  if (it == slot_of_.end()) return;
  holder_[it->second].clear();
  slot_of_.erase(it);
}

std::optional<int32_t> StateSlotPool::slot_of(const std::string& request_id) const {
  auto it = slot_of_.find(request_id);
  if (it == slot_of_.end()) return std::nullopt;
  return it->second;
}

Status StateSlotPool::check_invariants() const {
  int32_t held = 0;
  for (int32_t s = 0; s < num_slots(); ++s) {
    if (holder_[s].empty()) continue;
    ++held;
    auto it = slot_of_.find(holder_[s]);
    if (it == slot_of_.end() || it->second != s)
      return Status(make_error("StateSlotPool: slot " + std::to_string(s) + " is held by '" + holder_[s] +
                               "', which the pool does not list there"));
  }
  if (held != static_cast<int32_t>(slot_of_.size()))
    return Status(make_error("StateSlotPool: " + std::to_string(slot_of_.size()) + " requests hold slots but " +
                             std::to_string(held) + " slots are held"));
  return {};
}

}  // namespace inferd::kv
