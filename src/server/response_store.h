// The Responses API's stored responses (`store`, the default): each response
// with the conversation's input items that led to it, so that a request
// naming it as `previous_response_id` continues the conversation, and
// GET/DELETE /v1/responses/{id} find it. Bounded in count (the oldest go
// first) and in time (a response expires `ttl` after it was stored), as the
// store lives in memory. Thread-safe.
#pragma once
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace inferd::server {

struct StoredResponse {
  nlohmann::ordered_json response;                  // the Response object
  std::vector<nlohmann::ordered_json> input_items;  // every input item of its conversation, oldest first
};

class ResponseStore {
 public:
  using Clock = std::chrono::steady_clock;
  ResponseStore(size_t max_responses, std::chrono::seconds ttl) : max_(max_responses), ttl_(ttl) {}

  void put(const std::string& id, StoredResponse stored, Clock::time_point now = Clock::now());
  std::optional<StoredResponse> get(const std::string& id, Clock::time_point now = Clock::now());
  // False when there was no such (unexpired) response.
  bool erase(const std::string& id, Clock::time_point now = Clock::now());
  size_t size() const;

 private:
  struct Entry {
    StoredResponse stored;
    Clock::time_point expires;
    std::list<std::string>::iterator order;  // its place in order_
  };
  void expire(Clock::time_point now);  // under mu_

  const size_t max_;
  const std::chrono::seconds ttl_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> order_;  // ids, oldest first (stored with one ttl, so also by expiry)
};

}  // namespace inferd::server
