// Which instance a request goes to (the router's policy, no I/O): decode
// instances by load, prefill instances by the longest prompt prefix they are
// likely to hold in their prefix cache, then by load (Mooncake's cache-aware
// scheduling, simplified).
//
// The router sees text, not tokens, so "the prefix an instance holds" is
// approximated on text: the prompt is cut into chunks of kPrefixChunkBytes
// bytes and each chunk gets a chained hash (the hash of everything up to its
// end), as the engine chains the hashes of 16-token blocks. A completion's
// prompt is its text; a chat's is its messages, each as role and content with
// separators, so the chunks follow the conversation as the chat template
// would. 64 bytes is about 16 tokens of English with the default model's
// tokenizer: a text prefix shared by two prompts covers about as many full
// blocks as its chunks. Each prefill instance keeps an LRU of the hashes of
// prompts recently sent to it; the prompts it was sent are the ones it caches.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace inferd::router {

inline constexpr size_t kPrefixChunkBytes = 64;

// The chained hashes of a text's whole chunks (a partial last chunk is left
// out, as the engine leaves out a partial block). `salt` starts the chain:
// prompts of different models or cache salts never share a prefix.
std::vector<uint64_t> chunk_hashes(std::string_view text, std::string_view salt);

// The text a request's prefix is judged on: a completion's prompt (a string,
// or the first of several; token ids as their decimal text), or a chat's
// messages. Empty when the body has neither in a known shape.
std::string prompt_text(const nlohmann::ordered_json& body, bool chat);

// A bounded set of prefix hashes, least recently used first out.
class PrefixLru {
 public:
  explicit PrefixLru(size_t capacity) : capacity_(capacity) {}
  // How many of `hashes`, from the first, are present (the prefix held).
  size_t matched(const std::vector<uint64_t>& hashes) const;
  // Adds (or refreshes) every hash, evicting the oldest beyond the capacity.
  void insert(const std::vector<uint64_t>& hashes);
  size_t size() const { return index_.size(); }

 private:
  size_t capacity_;
  std::list<uint64_t> order_;  // most recent at the front
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> index_;
};

enum class Role { kPrefill, kDecode };

struct ChoiceConfig {
  size_t prefix_capacity = 65536;  // hashes remembered per prefill instance (~4 MiB of text)
  // A prefill instance with this many more requests in flight than the least
  // loaded one loses its prefix preference: a shared system prompt must not
  // send every request to one instance while the others idle.
  int64_t max_prefix_imbalance = 8;
  // After a connection to it fails, an instance is passed over for this long
  // (unless every instance of its role is).
  std::chrono::milliseconds cooldown{2000};
};

// The instances of both roles, their load (requests the router has in flight
// there) and the prefill instances' prefix sets. Thread-safe.
class InstanceChooser {
 public:
  using Clock = std::chrono::steady_clock;

  InstanceChooser(std::vector<std::string> prefill, std::vector<std::string> decode, ChoiceConfig config = {});

  // The prefill instance for a prompt with these chunk hashes; nullopt when
  // there is none. The hashes are recorded as that instance's.
  std::optional<size_t> pick_prefill(const std::vector<uint64_t>& hashes, Clock::time_point now = Clock::now());
  // Decode instances in the order to try them: least loaded first, those in
  // cooldown last.
  std::vector<size_t> decode_order(Clock::time_point now = Clock::now());

  void begin(Role role, size_t index);  // a request goes there
  void end(Role role, size_t index);    // it is over
  // A connection to it failed: pass it over for the cooldown. Returns
  // whether it was up until now (for logging once per outage).
  bool mark_down(Role role, size_t index, Clock::time_point now = Clock::now());

  const std::string& url(Role role, size_t index) const;
  size_t count(Role role) const;
  int64_t in_flight(Role role, size_t index) const;

 private:
  struct Instance {
    std::string url;
    int64_t in_flight = 0;
    Clock::time_point down_until{};
    PrefixLru prefixes;
  };
  std::vector<Instance>& of(Role role) { return role == Role::kPrefill ? prefill_ : decode_; }
  const std::vector<Instance>& of(Role role) const { return role == Role::kPrefill ? prefill_ : decode_; }

  ChoiceConfig config_;
  mutable std::mutex mu_;
  std::vector<Instance> prefill_, decode_;
  size_t rotation_ = 0;  // ties go round the instances, not always to the first
};

// Holds a request's place in an instance's load for its lifetime.
class InFlight {
 public:
  InFlight(InstanceChooser& chooser, Role role, size_t index) : chooser_(&chooser), role_(role), index_(index) {
    chooser_->begin(role_, index_);
  }
  ~InFlight() {
    if (chooser_) chooser_->end(role_, index_);
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  InstanceChooser* chooser_;
  Role role_;
  size_t index_;
};

}  // namespace inferd::router
