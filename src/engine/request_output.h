// What the engine tells a client about its request: a stream of deltas (new
// tokens, new text, logprobs, timestamps), the last of which says why it
// finished and carries the request's metrics. The stream is a thread-safe
// queue: the engine loop pushes, the client pops.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "engine/speculative.h"
#include "sampling/sampler.h"

namespace inferd {

// Logprobs of one sampled token, from the model's raw distribution (before
// temperature and penalties): the token's own and the `n` most likely ones.
struct SampledLogprobs {
  int32_t token = 0;
  float logprob = 0.0f;
  int32_t rank = 0;               // 1 + the tokens more likely than it (sampler.h: token_rank)
  std::vector<TokenLogprob> top;  // most likely first
};

// Timestamps are seconds on the steady clock (as Request::arrival_time); 0: not yet.
struct RequestMetrics {
  double arrival_time = 0.0;          // add_request was called
  double first_scheduled_time = 0.0;  // first step that computed any of its tokens
  double first_token_time = 0.0;
  double last_token_time = 0.0;
  double finished_time = 0.0;
  std::vector<double> token_times;  // when each output token was sampled
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens served by the prefix cache
  int64_t num_output_tokens = 0;
  int32_t num_preemptions = 0;
  SpeculativeStats speculative;  // this request's verifications, drafts and accepted drafts

  double queue_time() const { return first_scheduled_time - arrival_time; }
  double time_to_first_token() const { return first_token_time - arrival_time; }
  double e2e_latency() const { return finished_time - arrival_time; }

  std::vector<double> inter_token_latencies() const {
    std::vector<double> d;
    for (size_t i = 1; i < token_times.size(); ++i) d.push_back(token_times[i] - token_times[i - 1]);
    return d;
  }
};

// One beam of a beam search (GenerationParams::beam_search), as the
// request's final output lists them.
struct BeamOutput {
  std::vector<int32_t> token_ids;  // a stop token that ended it included
  // The text a request with these tokens would have: stop tokens left out,
  // cut before a stop string.
  std::string text;
  double cumulative_logprob = 0.0;  // of its tokens, by the log-softmax of the raw logits
  RequestStatus status = RequestStatus::kFinishedLength;  // stopped (stop token or string) or length
  std::string stop_string;                                // the stop string that ended it, if one did
};

struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> token_ids;  // sampled since the previous output (stop tokens included)
  // New text since the previous output: whole UTF-8 characters only, never a
  // stop string, and text that could still become one is held back until it
  // cannot.
  std::string text;
  std::vector<SampledLogprobs> logprobs;  // one per new token, if the request asked
  // Prompt logprobs, if the request asked (GenerationParams::prompt_logprobs):
  // entry i scores prompt token i + 1 (the first prompt token has none) from
  // the logits of position i. They come before the first token's output, in
  // the output of the step that computed them or a later one.
  std::vector<SampledLogprobs> prompt_logprobs;
  std::vector<double> token_times;        // when each new token was sampled
  bool finished = false;
  RequestStatus status = RequestStatus::kRunning;  // the finished status when finished
  std::string stop_string;  // the stop string that ended it, if one did
  std::string error;        // why the engine refused or gave up on it (status: aborted)
  RequestMetrics metrics;   // filled in the final output
  // Beam search: the final output alone carries the beams, best score first
  // (its token_ids, text, status and stop_string are the best beam's); no
  // output comes before it.
  std::vector<BeamOutput> beams;
  // A pooled request's output (Request::pooled), in its final output: the
  // embedding as the model pools it (not normalized), or a reranker's scores.
  std::vector<float> embedding;
  // Prefill for a remote decode (GenerationParams::kv_hold_for_remote_decode):
  // the final output names the lease holding the prompt's full blocks and
  // those blocks per KV group (lease 0: none held).
  uint64_t kv_lease_id = 0;
  std::vector<std::vector<int32_t>> kv_lease_blocks;

  const char* finish_reason() const { return inferd::finish_reason(status); }
};

// Folds the next output of a request into `whole`, the request's outputs so
// far: tokens, text, logprobs and token times appended; the final output's
// status, stop string, error, metrics and beams taken.
inline void accumulate(RequestOutput& whole, RequestOutput&& delta) {
  whole.request_id = std::move(delta.request_id);
  whole.token_ids.insert(whole.token_ids.end(), delta.token_ids.begin(), delta.token_ids.end());
  whole.text += delta.text;
  for (SampledLogprobs& lp : delta.logprobs) whole.logprobs.push_back(std::move(lp));
  for (SampledLogprobs& lp : delta.prompt_logprobs) whole.prompt_logprobs.push_back(std::move(lp));
  whole.token_times.insert(whole.token_times.end(), delta.token_times.begin(), delta.token_times.end());
  if (!delta.finished) return;
  whole.finished = true;
  whole.status = delta.status;
  whole.stop_string = std::move(delta.stop_string);
  whole.error = std::move(delta.error);
  whole.metrics = std::move(delta.metrics);
  whole.beams = std::move(delta.beams);
  whole.embedding = std::move(delta.embedding);
}

class RequestStream {
 public:
  explicit RequestStream(std::string request_id) : id_(std::move(request_id)) {}

  const std::string& request_id() const { return id_; }

  // Blocks until an output is ready. nullopt once the final output was taken.
  std::optional<RequestOutput> next() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty() || closed_; });
    return take_locked();
  }
  // Like next(), giving up after `timeout` (nullopt then too; see finished()).
  template <class Rep, class Period>
  std::optional<RequestOutput> next_for(std::chrono::duration<Rep, Period> timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || closed_; });
    return take_locked();
  }
  std::optional<RequestOutput> try_next() {
    std::lock_guard<std::mutex> lock(mu_);
    return take_locked();
  }
  // The final output has been pushed (it may not have been taken yet).
  bool finished() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }

  // Called (on the engine's thread, without the stream's lock) after each
  // push: lets an event-driven consumer (the HTTP server) wake up instead of
  // blocking a thread in next(). Outputs pushed before it was set are not
  // announced: drain with try_next() after setting it.
  void set_listener(std::function<void()> listener) {
    std::lock_guard<std::mutex> lock(mu_);
    listener_ = std::move(listener);
  }

  // Engine side: queues an output; a finished one closes the stream.
  void push(RequestOutput out) {
    std::function<void()> listener;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = out.finished;
      queue_.push_back(std::move(out));
      listener = listener_;
    }
    cv_.notify_all();
    if (listener) listener();
  }

 private:
  std::optional<RequestOutput> take_locked() {
    if (queue_.empty()) return std::nullopt;
    RequestOutput out = std::move(queue_.front());
    queue_.pop_front();
    return out;
  }

  const std::string id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  bool closed_ = false;
  std::function<void()> listener_;
};

}  // namespace inferd
