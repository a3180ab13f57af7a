#include "engine/draft_model_proposer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <unordered_set>

#include "model/kv_cache.h"
#include "sampling/sampler.h"

namespace inferd {

std::string draft_vocabulary_mismatch(const Tokenizer& target, const Tokenizer& draft) {
  if (target.model_name() != draft.model_name())
    return "the tokenizers differ (target " + target.model_name() + ", draft " + draft.model_name() + ")";
  // (Whether each adds a BOS does not matter: the draft is fed the target's token ids.)
  if (target.bos_id() != draft.bos_id())
    return "the BOS tokens differ (target " + std::to_string(target.bos_id()) + ", draft " +
           std::to_string(draft.bos_id()) + ")";
  if (target.eos_id() != draft.eos_id())
    return "the EOS tokens differ (target " + std::to_string(target.eos_id()) + ", draft " +
           std::to_string(draft.eos_id()) + ")";
  // A few more or fewer added tokens at the end (padding rows) are harmless:
  // a draft outside the target's vocabulary is never proposed.
  if (std::abs(target.n_vocab() - draft.n_vocab()) > 128)
    return "the vocabularies have " + std::to_string(target.n_vocab()) + " and " + std::to_string(draft.n_vocab()) +
           " tokens";
  // Ids below 5 are often control tokens a fine-tune renamed.
  const int32_t n = std::min(target.n_vocab(), draft.n_vocab());
  for (int32_t id = 5; id < n; ++id)
    if (target.token_text(id) != draft.token_text(id))
      return "token " + std::to_string(id) + " is '" + target.token_text(id) + "' in the target and '" +
             draft.token_text(id) + "' in the draft";
  return {};
}

Result<std::unique_ptr<DraftModelProposer>> DraftModelProposer::create(const Model& target,
                                                                      std::unique_ptr<Model> draft,
                                                                      const DraftProposerConfig& config) {
  if (!draft->can_generate())
    return make_error("the draft model cannot generate: " + unsupported_architecture_message(draft->config().architecture));
  if (std::string why = draft_vocabulary_mismatch(target.tokenizer(), draft->tokenizer()); !why.empty())
    return make_error("the draft model's vocabulary does not match the target's: " + why);
  if (config.n_blocks < 2) return make_error("the draft model's KV cache needs at least 2 blocks");
  // The draft's KV cache stays in the default dtype (f16) whatever the
  // target's --kv-cache-dtype: it is a small model's, and what it proposes the
  // target verifies, so quantizing it would save little and cost acceptance.
  ModelRunnerConfig rc;
  rc.block_size = config.block_size;
  rc.kv_cache_dtype = kv::kDefaultKVCacheDType;
  rc.kv_cache_bytes = int64_t{config.n_blocks} * static_cast<int64_t>(KVCache::block_bytes(draft->config(), config.block_size, rc.kv_cache_dtype));
  rc.warm_up = config.warm_up;
  auto runner = ModelRunner::create(*draft, rc);
  if (!runner) return make_error("the draft model: " + runner.error().message);
  const kv::KVCacheConfig kv{.n_blocks = (*runner)->n_blocks(),
                             .block_size = config.block_size,
                             .enable_prefix_caching = config.enable_prefix_caching,
                             .group_windows = KVLayout::plan(draft->config(), config.block_size, rc.kv_cache_dtype).group_windows};
  auto proposer = std::unique_ptr<DraftModelProposer>(
      new DraftModelProposer(std::move(draft), std::move(*runner), config, kv));
  proposer->n_target_vocab_ = static_cast<int32_t>(target.config().n_vocab);
  return proposer;
}

DraftModelProposer::DraftModelProposer(std::unique_ptr<Model> draft, std::unique_ptr<ModelRunner> runner,
                                       const DraftProposerConfig& config, const kv::KVCacheConfig& kv_config)
    : model_(std::move(draft)), runner_(std::move(runner)), config_(config), kv_(kv_config) {}

void DraftModelProposer::forget(const std::string& request_id) {
  kv_.free(request_id);
  seqs_.erase(request_id);
}

std::vector<std::string> DraftModelProposer::sequence_ids() const {
  std::vector<std::string> ids;
  for (const auto& [id, tokens] : seqs_) ids.push_back(id);
  return ids;
}

Status DraftModelProposer::check_invariants() const {
  if (Status s = kv_.check_invariants(); !s) return s;
  if (kv_.num_requests() > static_cast<int64_t>(seqs_.size()))
    return make_error(std::to_string(kv_.num_requests()) + " requests hold draft blocks but " +
                      std::to_string(seqs_.size()) + " sequences are kept");
  return {};
}

bool DraftModelProposer::reserve(Work& w, std::span<const DraftInput> inputs) {
  const DraftInput& in = *w.input;
  const std::string& id = *in.request_id;
  // Slots for the tokens and every draft but the last, which is never fed.
  const int64_t total = static_cast<int64_t>(in.tokens.size()) + in.max_drafts - 1;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!kv_.holds_blocks(id)) {
      w.cached->clear();
      const kv::PrefixHit hit = config_.enable_prefix_caching ? kv_.get_computed_blocks(in.tokens, in.cache_key)
                                                              : kv::PrefixHit{};
      if (kv_.allocate_slots(id, 0, total - hit.num_tokens, hit)) {
        w.cached->assign(in.tokens.begin(), in.tokens.begin() + hit.num_tokens);
        w.fed = hit.num_tokens;
        return true;
      }
    } else if (kv_.allocate_slots(id, w.fed, total - w.fed)) {
      return true;
    }
    if (attempt > 0) break;
    // Full: drop the sequences of requests that do not draft now (preempted,
    // pausing, or gone without a forget), then try once more.
    std::unordered_set<std::string> wanted;
    for (const DraftInput& other : inputs) wanted.insert(*other.request_id);
    std::vector<std::string> idle;
    for (const auto& [seq_id, tokens] : seqs_)
      if (!wanted.count(seq_id)) idle.push_back(seq_id);
    if (idle.empty()) break;
    for (const std::string& seq_id : idle) forget(seq_id);
  }
  return false;
}

std::vector<float>& DraftModelProposer::run(SchedulerOutput& out) {
  out.step = ++steps_;
  for (const ScheduledRequest& s : out.scheduled) out.total_num_scheduled_tokens += s.num_new_tokens;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float>& logits = runner_->compute_logits(out);
  forward_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return logits;
}

void DraftModelProposer::take_draft(Work& w, const float* logits) {
  const int64_t n_vocab = runner_->n_vocab();
  const int64_t best = argmax(logits, n_vocab);  // the target verifies drafts against its own argmax
  if (config_.p_min > 0.0) {
    // p(best) = 1 / sum_i exp(l_i - l_best). Logits more than 30 below the
    // best add less than 1e-13 each (under 1e-7 for 10^6 of them): skipped,
    // a confident row costs comparisons, not exponentials.
    float sum = 0.0f;
    const float top = logits[best], floor = top - 30.0f;
    for (int64_t i = 0; i < n_vocab; ++i)
      if (logits[i] > floor) sum += std::exp(logits[i] - top);
    if (1.0 / sum < config_.p_min) {
      w.drafting = false;
      return;
    }
  }
  if (best >= n_target_vocab_) {  // a padding row of the draft's: not a token of the target
    w.drafting = false;
    return;
  }
  w.drafts.push_back(static_cast<int32_t>(best));
  if (static_cast<int32_t>(w.drafts.size()) >= w.input->max_drafts) w.drafting = false;
}

std::vector<std::vector<int32_t>> DraftModelProposer::propose(std::span<const DraftInput> inputs) {
  std::vector<std::vector<int32_t>> drafts(inputs.size());
  std::vector<Work> work;
  std::vector<size_t> work_input;  // work[j] is for inputs[work_input[j]]
  work.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DraftInput& in = inputs[i];
    if (in.max_drafts < 1 || in.tokens.empty()) continue;
    std::vector<int32_t>& cached = seqs_[*in.request_id];
    // What the cache holds beyond the request's tokens are drafts the target
    // rejected (or did not verify): move back to the common prefix. The last
    // token is always fed, so that its row gives the first draft.
    const size_t common = static_cast<size_t>(
        std::mismatch(cached.begin(), cached.end(), in.tokens.begin(), in.tokens.end()).first - cached.begin());
    cached.resize(std::min(common, in.tokens.size() - 1));
    Work w{&in, &cached, static_cast<int64_t>(cached.size()), {}, true};
    if (!reserve(w, inputs)) {
      forget(*in.request_id);
      continue;
    }
    work.push_back(std::move(w));
    work_input.push_back(i);
  }
  const int32_t n_groups = kv_.num_groups();
  auto schedule = [&](SchedulerOutput& out, Work& w, std::span<const int32_t> tokens, bool sample) {
    ScheduledRequest& s = out.scheduled.emplace_back();
    s.request_id = *w.input->request_id;
    s.num_computed_tokens = w.fed;
    s.num_new_tokens = static_cast<int64_t>(tokens.size());
    s.token_ids.assign(tokens.begin(), tokens.end());
    s.block_tables.resize(n_groups);
    for (int32_t g = 0; g < n_groups; ++g) {
      const std::span<const int32_t> table = kv_.block_table(s.request_id, g);
      s.block_tables[g].assign(table.begin(), table.end());
    }
    s.sample = sample;
  };
  const int64_t n_vocab = runner_->n_vocab();

  // Catch up with the target: feed what the cache lacks, at most
  // max_batch_tokens per pass; a request's first draft comes from the row of
  // its last token.
  for (;;) {
    SchedulerOutput out;
    std::vector<Work*> fed;
    int64_t budget = config_.max_batch_tokens;
    for (Work& w : work) {
      const int64_t len = static_cast<int64_t>(w.input->tokens.size());
      if (w.fed >= len || budget <= 0) continue;
      const int64_t n = std::min(len - w.fed, budget);
      budget -= n;
      schedule(out, w, w.input->tokens.subspan(w.fed, n), w.fed + n == len);
      fed.push_back(&w);
    }
    if (fed.empty()) break;
    const std::vector<float>& logits = run(out);
    int64_t row = 0;
    for (size_t j = 0; j < fed.size(); ++j) {
      Work& w = *fed[j];
      const ScheduledRequest& s = out.scheduled[j];
      w.cached->insert(w.cached->end(), s.token_ids.begin(), s.token_ids.end());
      w.fed += s.num_new_tokens;
      if (!s.sample) continue;
      // Only the target's tokens (never a draft) go into the prefix cache.
      if (config_.enable_prefix_caching)
        kv_.cache_full_blocks(s.request_id, w.input->tokens, w.fed, w.input->cache_key);
      take_draft(w, logits.data() + row++ * n_vocab);
    }
  }

  // Then one pass per draft: each request still drafting feeds its latest.
  for (;;) {
    SchedulerOutput out;
    std::vector<Work*> fed;
    for (Work& w : work) {
      if (!w.drafting) continue;
      const int32_t last = w.drafts.back();
      schedule(out, w, std::span<const int32_t>(&last, 1), true);
      fed.push_back(&w);
    }
    if (fed.empty()) break;
    const std::vector<float>& logits = run(out);
    for (size_t j = 0; j < fed.size(); ++j) {
      Work& w = *fed[j];
      w.cached->push_back(w.drafts.back());
      ++w.fed;
      take_draft(w, logits.data() + static_cast<int64_t>(j) * n_vocab);
    }
  }
  for (size_t j = 0; j < work.size(); ++j) drafts[work_input[j]] = std::move(work[j].drafts);
  return drafts;
}

}  // namespace inferd
