#include "distributed/step_codec.h"

#include <cstring>
#include <type_traits>

namespace inferd::distributed {

namespace {

class Writer {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  template <typename T>
  void put_array(const T* data, size_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    put<uint64_t>(n);
    const auto* p = reinterpret_cast<const uint8_t*>(data);
    bytes_.insert(bytes_.end(), p, p + n * sizeof(T));
  }
  template <typename T>
  void put_vector(const std::vector<T>& v) { put_array(v.data(), v.size()); }
  void put_string(const std::string& s) { put_array(s.data(), s.size()); }
  std::vector<uint8_t> take() { return std::move(bytes_); }

 private:
  std::vector<uint8_t> bytes_;
};

// Reads what Writer wrote; a short or malformed message sets failed() and
// reads zeros from then on (the caller checks once, at the end).
class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& bytes) : bytes_(bytes) {}
  template <typename T>
  T get() {
    T v{};
    if (!take(&v, sizeof(T))) return T{};
    return v;
  }
  template <typename T>
  void get_vector(std::vector<T>& v) {
    const uint64_t n = get<uint64_t>();
    if (failed_ || n > (bytes_.size() - at_) / sizeof(T)) {
      failed_ = true;
      v.clear();
      return;
    }
    v.resize(n);
    take(v.data(), n * sizeof(T));
  }
  std::string get_string() {
    std::vector<char> chars;
    get_vector(chars);
    return {chars.begin(), chars.end()};
  }
  bool failed() const { return failed_; }
  bool complete() const { return !failed_ && at_ == bytes_.size(); }

 private:
  bool take(void* dst, size_t n) {
    if (failed_ || n > bytes_.size() - at_) {
      failed_ = true;
      return false;
    }
    if (n > 0) std::memcpy(dst, bytes_.data() + at_, n);
    at_ += n;
    return true;
  }
  const std::vector<uint8_t>& bytes_;
  size_t at_ = 0;
  bool failed_ = false;
};

void put_sampling_request(Writer& w, const SamplingRequest& r) {
  w.put(r.kind);
  const SamplingParams& p = r.params;
  w.put(p.temperature);
  w.put(p.top_k);
  w.put(p.top_p);
  w.put(p.min_p);
  w.put(p.repetition_penalty);
  w.put(p.frequency_penalty);
  w.put(p.presence_penalty);
  w.put<uint8_t>(p.seed.has_value());
  w.put<uint64_t>(p.seed.value_or(0));
  w.put_vector(r.prompt_token_ids);
  w.put(r.logprobs);
  w.put(r.prompt_logprobs);
  w.put(r.beam_candidates);
  w.put<uint8_t>(r.constrained);
}

SamplingRequest get_sampling_request(Reader& rd) {
  SamplingRequest r;
  r.kind = rd.get<SamplingRequest::Kind>();
  SamplingParams& p = r.params;
  p.temperature = rd.get<float>();
  p.top_k = rd.get<int32_t>();
  p.top_p = rd.get<float>();
  p.min_p = rd.get<float>();
  p.repetition_penalty = rd.get<float>();
  p.frequency_penalty = rd.get<float>();
  p.presence_penalty = rd.get<float>();
  const bool seeded = rd.get<uint8_t>() != 0;
  const uint64_t seed = rd.get<uint64_t>();
  if (seeded) p.seed = seed;
  rd.get_vector(r.prompt_token_ids);
  r.logprobs = rd.get<int32_t>();
  r.prompt_logprobs = rd.get<int32_t>();
  r.beam_candidates = rd.get<int32_t>();
  r.constrained = rd.get<uint8_t>() != 0;
  return r;
}

void put_strings(Writer& w, const std::vector<std::string>& v) {
  w.put<uint64_t>(v.size());
  for (const std::string& s : v) w.put_string(s);
}

void get_strings(Reader& rd, std::vector<std::string>& v) {
  const uint64_t n = rd.get<uint64_t>();
  v.clear();
  for (uint64_t i = 0; i < n && !rd.failed(); ++i) v.push_back(rd.get_string());
}

void put_logprobs(Writer& w, const std::vector<SampledLogprobs>& v) {
  w.put<uint64_t>(v.size());
  for (const SampledLogprobs& l : v) {
    w.put(l.token);
    w.put(l.logprob);
    w.put(l.rank);
    w.put_vector(l.top);
  }
}

void get_logprobs(Reader& rd, std::vector<SampledLogprobs>& v) {
  const uint64_t n = rd.get<uint64_t>();
  v.clear();
  for (uint64_t i = 0; i < n && !rd.failed(); ++i) {
    SampledLogprobs& l = v.emplace_back();
    l.token = rd.get<int32_t>();
    l.logprob = rd.get<float>();
    l.rank = rd.get<int32_t>();
    rd.get_vector(l.top);
  }
}

}  // namespace

StepSamplingInputs StepMessage::sampling_inputs() const {
  StepSamplingInputs inputs;
  for (size_t i = 0; i < masks.size(); ++i) inputs.allowed.push_back({masks[i], mask_vocab[i]});
  return inputs;
}

std::vector<uint8_t> encode_step(StepMessage::Kind kind, const std::vector<SamplingEvent>& events,
                                 const SchedulerOutput& out, const StepSamplingInputs& inputs) {
  Writer w;
  w.put(kind);
  w.put<uint64_t>(events.size());
  for (const SamplingEvent& e : events) {
    w.put_string(e.request_id);
    w.put<uint8_t>(e.add);
    if (e.add) put_sampling_request(w, e.request);
  }
  w.put(out.step);
  w.put(out.total_num_scheduled_tokens);
  w.put<uint64_t>(out.scheduled.size());
  for (const ScheduledRequest& s : out.scheduled) {
    w.put_string(s.request_id);
    w.put(s.num_computed_tokens);
    w.put(s.num_new_tokens);
    w.put_vector(s.token_ids);
    w.put<uint64_t>(s.block_tables.size());
    for (const std::vector<int32_t>& table : s.block_tables) w.put_vector(table);
    w.put_vector(s.new_block_ids);
    w.put(s.state_slot);
    w.put(s.state_source);
    w.put<uint64_t>(s.state_saves.size());
    for (const kv::StateSave& save : s.state_saves) {
      w.put(save.position);
      w.put(save.slot);
    }
    w.put<uint8_t>(s.is_new);
    w.put<uint8_t>(s.resumed);
    w.put<uint8_t>(s.sample);
    w.put(s.num_draft_tokens);
    w.put<uint8_t>(s.prompt_logits);
    w.put(s.num_prompt_tokens);
    w.put(s.num_cached_tokens);
  }
  w.put_vector(out.block_copies);
  put_strings(w, out.preempted_request_ids);
  put_strings(w, out.finished_request_ids);
  w.put<uint64_t>(inputs.allowed.size());
  for (const AllowedTokens& a : inputs.allowed) {
    w.put_array(a.mask.data(), a.mask.size());
    w.put(a.mask_vocab);
  }
  return w.take();
}

Result<StepMessage> decode_step(const std::vector<uint8_t>& bytes) {
  Reader rd(bytes);
  StepMessage m;
  m.kind = rd.get<StepMessage::Kind>();
  const uint64_t n_events = rd.get<uint64_t>();
  for (uint64_t i = 0; i < n_events && !rd.failed(); ++i) {
    SamplingEvent& e = m.events.emplace_back();
    e.request_id = rd.get_string();
    e.add = rd.get<uint8_t>() != 0;
    if (e.add) e.request = get_sampling_request(rd);
  }
  SchedulerOutput& out = m.out;
  out.step = rd.get<int64_t>();
  out.total_num_scheduled_tokens = rd.get<int64_t>();
  const uint64_t n_scheduled = rd.get<uint64_t>();
  for (uint64_t i = 0; i < n_scheduled && !rd.failed(); ++i) {
    ScheduledRequest& s = out.scheduled.emplace_back();
    s.request_id = rd.get_string();
    s.num_computed_tokens = rd.get<int64_t>();
    s.num_new_tokens = rd.get<int64_t>();
    rd.get_vector(s.token_ids);
    const uint64_t n_groups = rd.get<uint64_t>();
    for (uint64_t g = 0; g < n_groups && !rd.failed(); ++g) rd.get_vector(s.block_tables.emplace_back());
    rd.get_vector(s.new_block_ids);
    s.state_slot = rd.get<int32_t>();
    s.state_source = rd.get<int32_t>();
    const uint64_t n_saves = rd.get<uint64_t>();
    for (uint64_t k = 0; k < n_saves && !rd.failed(); ++k) {
      kv::StateSave& save = s.state_saves.emplace_back();
      save.position = rd.get<int64_t>();
      save.slot = rd.get<int32_t>();
    }
    s.is_new = rd.get<uint8_t>() != 0;
    s.resumed = rd.get<uint8_t>() != 0;
    s.sample = rd.get<uint8_t>() != 0;
    s.num_draft_tokens = rd.get<int64_t>();
    s.prompt_logits = rd.get<uint8_t>() != 0;
    s.num_prompt_tokens = rd.get<int64_t>();
    s.num_cached_tokens = rd.get<int64_t>();
  }
  rd.get_vector(out.block_copies);
  get_strings(rd, out.preempted_request_ids);
  get_strings(rd, out.finished_request_ids);
  const uint64_t n_masks = rd.get<uint64_t>();
  for (uint64_t i = 0; i < n_masks && !rd.failed(); ++i) {
    rd.get_vector(m.masks.emplace_back());
    m.mask_vocab.push_back(rd.get<int32_t>());
  }
  if (!rd.complete()) return make_error("a pipeline step message of " + std::to_string(bytes.size()) +
                                     " bytes does not decode (ranks running different builds?)");
  return m;
}

std::vector<uint8_t> encode_output(const ModelRunnerOutput& output) {
  Writer w;
  w.put<uint64_t>(output.requests.size());
  for (const SampledRequest& r : output.requests) {
    w.put_vector(r.tokens);
    put_logprobs(w, r.logprobs);
    put_logprobs(w, r.prompt_logprobs);
    w.put_vector(r.beam_candidates);
    w.put_vector(r.pooled);
  }
  return w.take();
}

Status decode_output(const std::vector<uint8_t>& bytes, ModelRunnerOutput& output) {
  Reader rd(bytes);
  const uint64_t n = rd.get<uint64_t>();
  if (n > bytes.size()) return make_error("the last pipeline stage's output does not decode");
  output.requests.resize(n);
  for (SampledRequest& r : output.requests) {
    rd.get_vector(r.tokens);
    get_logprobs(rd, r.logprobs);
    get_logprobs(rd, r.prompt_logprobs);
    rd.get_vector(r.beam_candidates);
    rd.get_vector(r.pooled);
  }
  if (!rd.complete())
    return make_error("the last pipeline stage's output of " + std::to_string(bytes.size()) + " bytes does not decode");
  return {};
}

}  // namespace inferd::distributed
