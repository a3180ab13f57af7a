#include "server/response_store.h"

namespace inferd::server {

void ResponseStore::expire(Clock::time_point now) {
  while (!order_.empty()) {
    auto it = entries_.find(order_.front());
    if (it != entries_.end() && it->second.expires > now) break;
    if (it != entries_.end()) entries_.erase(it);
    order_.pop_front();
  }
}

void ResponseStore::put(const std::string& id, StoredResponse stored, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  expire(now);
  if (max_ == 0) return;
  if (auto it = entries_.find(id); it != entries_.end()) {
    order_.erase(it->second.order);
    entries_.erase(it);
  }
  while (entries_.size() >= max_) {
    entries_.erase(order_.front());
    order_.pop_front();
  }
  order_.push_back(id);
  entries_[id] = Entry{std::move(stored), now + ttl_, std::prev(order_.end())};
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  expire(now);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.stored;
}

bool ResponseStore::erase(const std::string& id, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  expire(now);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  order_.erase(it->second.order);
  entries_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace inferd::server
