#include "router/instance_choice.h"

#include <xxhash.h>

#include <algorithm>
#include <limits>

namespace inferd::router {

std::vector<uint64_t> chunk_hashes(std::string_view text, std::string_view salt) {
  std::vector<uint64_t> out;
  uint64_t parent = XXH3_64bits(salt.data(), salt.size());
  for (size_t at = 0; at + kPrefixChunkBytes <= text.size(); at += kPrefixChunkBytes) {
    parent = XXH3_64bits_withSeed(text.data() + at, kPrefixChunkBytes, parent);
    out.push_back(parent);
  }
  return out;
}

std::string prompt_text(const nlohmann::ordered_json& body, bool chat) {
  std::string text;
  if (chat) {
    auto messages = body.find("messages");
    if (messages == body.end() || !messages->is_array()) return {};
    for (const auto& m : *messages) {
      if (!m.is_object()) continue;
      // Unit and record separators: no message text can shift a boundary.
      if (auto role = m.find("role"); role != m.end() && role->is_string()) text += role->get<std::string>();
      text += '\x1f';
      if (auto content = m.find("content"); content != m.end()) {
        if (content->is_string()) text += content->get<std::string>();
        else if (!content->is_null()) text += content->dump();  // content parts, tool calls: their JSON
      }
      text += '\x1e';
    }
    return text;
  }
  auto prompt = body.find("prompt");
  if (prompt == body.end()) return {};
  const nlohmann::ordered_json* p = &*prompt;
  // Several prompts: the first stands for the request (they go to one instance).
  if (p->is_array() && !p->empty() && !(*p)[0].is_number()) p = &(*p)[0];
  if (p->is_string()) return p->get<std::string>();
  if (p->is_array())
    for (const auto& id : *p) text += id.dump() + ",";
  return text;
}

size_t PrefixLru::matched(const std::vector<uint64_t>& hashes) const {
  size_t n = 0;
  while (n < hashes.size() && index_.count(hashes[n])) ++n;
  return n;
}

void PrefixLru::insert(const std::vector<uint64_t>& hashes) {
  for (uint64_t h : hashes) {
    if (auto it = index_.find(h); it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      continue;
    }
    order_.push_front(h);
    index_[h] = order_.begin();
    if (index_.size() > capacity_) {
      index_.erase(order_.back());
      order_.pop_back();
    }
  }
}

InstanceChooser::InstanceChooser(std::vector<std::string> prefill, std::vector<std::string> decode,
                                 ChoiceConfig config)
    : config_(config) {
  for (std::string& url : prefill) prefill_.push_back(Instance{std::move(url), 0, {}, PrefixLru(config.prefix_capacity)});
  for (std::string& url : decode) decode_.push_back(Instance{std::move(url), 0, {}, PrefixLru(0)});
}

std::optional<size_t> InstanceChooser::pick_prefill(const std::vector<uint64_t>& hashes, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (prefill_.empty()) return std::nullopt;
  const size_t n = prefill_.size();
  bool any_up = false;
  int64_t least = std::numeric_limits<int64_t>::max();
  for (const Instance& p : prefill_) {
    if (p.down_until > now) continue;
    any_up = true;
    least = std::min(least, p.in_flight);
  }
  std::optional<size_t> best;
  size_t best_match = 0;
  const size_t start = rotation_++;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (start + k) % n;
    const Instance& p = prefill_[i];
    if (any_up && p.down_until > now) continue;
    // Past the imbalance bound, its prefix counts for nothing: it competes on load alone.
    const bool overloaded = p.in_flight >= least + config_.max_prefix_imbalance;
    const size_t match = overloaded ? 0 : p.prefixes.matched(hashes);
    if (!best || match > best_match || (match == best_match && p.in_flight < prefill_[*best].in_flight)) {
      best = i;
      best_match = match;
    }
  }
  prefill_[*best].prefixes.insert(hashes);
  return best;
}

std::vector<size_t> InstanceChooser::decode_order(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = decode_.size();
  std::vector<size_t> order;
  const size_t start = rotation_++;
  for (size_t k = 0; k < n; ++k) order.push_back((start + k) % n);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const bool a_down = decode_[a].down_until > now, b_down = decode_[b].down_until > now;
    if (a_down != b_down) return b_down;
    return decode_[a].in_flight < decode_[b].in_flight;
  });
  return order;
}

void InstanceChooser::begin(Role role, size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  ++of(role)[index].in_flight;
}

void InstanceChooser::end(Role role, size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  --of(role)[index].in_flight;
}

bool InstanceChooser::mark_down(Role role, size_t index, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  Instance& instance = of(role)[index];
  const bool was_up = instance.down_until <= now;
  instance.down_until = now + config_.cooldown;
  return was_up;
}

const std::string& InstanceChooser::url(Role role, size_t index) const { return of(role)[index].url; }

size_t InstanceChooser::count(Role role) const { return of(role).size(); }

int64_t InstanceChooser::in_flight(Role role, size_t index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return of(role)[index].in_flight;
}

}  // namespace inferd::router
