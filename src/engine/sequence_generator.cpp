#include "engine/sequence_generator.h"

#include "engine/scheduler_output.h"

#include <algorithm>

namespace inferd {

namespace {
constexpr int64_t kBlockSize = 16;
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

SequenceGenerator::SequenceGenerator(Model& model, int64_t max_context, DType kv_dtype, bool skip_sliding_window)
    : model_(model),
      max_context_(max_context),
      cache_(KVLayout::plan(model.config(), kBlockSize, kv_dtype, skip_sliding_window),
             KVLayout::plan(model.config(), kBlockSize, kv_dtype, skip_sliding_window)
                 .blocks_for_request(max_context, kBlockSize)) {
  // One sequence owns every block: each KV group its own run, in order.
  const int32_t n_groups = cache_.layout().num_groups();
  const int32_t per_group = static_cast<int32_t>(cache_.n_blocks() / n_groups);
  block_tables_.resize(n_groups);
  for (int32_t g = 0; g < n_groups; ++g)
    for (int32_t b = 0; b < per_group; ++b) block_tables_[g].push_back(g * per_group + b);
}

void SequenceGenerator::run(const std::vector<int32_t>& tokens, int64_t from, int64_t to, int64_t first_logit,
                            int64_t last_logit, std::vector<float>& logits) {
  batch_.clear();
  const size_t n_groups = block_tables_.size();
  batch_.slots.resize(n_groups);
  for (int64_t p = from; p < to; ++p) {
    batch_.tokens.push_back(tokens[p]);
    batch_.positions.push_back(static_cast<int32_t>(p));
    for (size_t g = 0; g < n_groups; ++g) batch_.slots[g].push_back(kv_slot(block_tables_[g], kBlockSize, p));
    if (p >= first_logit && p < last_logit) batch_.logit_rows.push_back(static_cast<int32_t>(p - from));
  }
  SequenceSlice s;
  s.first_token = 0;
  s.n_tokens = static_cast<int32_t>(to - from);
  for (const std::vector<int32_t>& table : block_tables_)
    s.block_tables.emplace_back(table.begin(), table.begin() + (to + kBlockSize - 1) / kBlockSize);
  batch_.sequences.push_back(std::move(s));
  model_.forward(batch_, cache_, logits);
}

void SequenceGenerator::feed(const std::vector<int32_t>& tokens, int64_t from, int64_t to, int64_t first_logit,
                             int64_t last_logit, std::vector<float>& logits) {
  cached_.clear();
  run(tokens, from, to, first_logit, last_logit, logits);
}

Result<std::vector<float>> SequenceGenerator::prompt_logits(const std::vector<int32_t>& prompt) {
  GenerationOptions o;
  o.max_tokens = 0;
  auto r = generate(prompt, o, [](int32_t) { return true; });
  if (!r) return r.error();
  return logits_;
}

Result<std::vector<int32_t>> SequenceGenerator::generate(
    const std::vector<int32_t>& prompt, const GenerationOptions& options,
    const std::function<bool(int32_t)>& on_token) {
  const int64_t n_vocab = model_.config().n_vocab;
  if (prompt.empty()) return make_error("the prompt is empty");
  for (int32_t t : prompt)
    if (t < 0 || t >= n_vocab)
      return make_error("token id " + std::to_string(t) + " is outside the vocabulary");
  if (static_cast<int64_t>(prompt.size()) + options.max_tokens > max_context_)
    return make_error("the prompt (" + std::to_string(prompt.size()) + " tokens) plus " +
                      std::to_string(options.max_tokens) + " new tokens exceeds the context of " +
                      std::to_string(max_context_) + " tokens");
  if (auto st = options.sampling.validate(); !st) return st.error();

  stats_ = {};
  stats_.prompt_tokens = static_cast<int64_t>(prompt.size());
  // Reuse the cached prefix, but always recompute the last prompt token so
  // there are logits to sample from.
  int64_t reuse = 0;
  while (reuse < static_cast<int64_t>(cached_.size()) &&
         reuse + 1 < static_cast<int64_t>(prompt.size()) && cached_[reuse] == prompt[reuse])
    ++reuse;
  stats_.reused_prompt_tokens = reuse;
  cached_.assign(prompt.begin(), prompt.begin() + reuse);

  auto t0 = std::chrono::steady_clock::now();
  const int64_t n = static_cast<int64_t>(prompt.size());
  for (int64_t from = reuse; from < n; from += options.prefill_chunk) {
    const int64_t to = std::min(n, from + options.prefill_chunk);
    run(prompt, from, to, n - 1, to == n ? n : n - 1, logits_);
  }
  cached_ = prompt;
  stats_.prefill_seconds = seconds_since(t0);
  if (options.prompt_logits) *options.prompt_logits = logits_;

  Sampler sampler(options.sampling);
  std::vector<int32_t> out;
  t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < options.max_tokens; ++i) {
    const int32_t tok = sampler.sample(logits_.data(), n_vocab, prompt, out);
    out.push_back(tok);
    const bool keep_going = on_token(tok);
    if (!keep_going) break;
    if (options.stop_at_end_of_generation && model_.tokenizer().is_eog(tok)) break;
    if (i + 1 == options.max_tokens) break;
    cached_.push_back(tok);
    const int64_t last = static_cast<int64_t>(cached_.size());
    run(cached_, last - 1, last, last - 1, last, logits_);
  }
  stats_.generated_tokens = static_cast<int64_t>(out.size());
  stats_.decode_seconds = seconds_since(t0);
  return out;
}

}  // namespace inferd
