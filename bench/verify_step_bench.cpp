// What a step that verifies speculative drafts costs: one request's forward
// pass over 1 + k tokens (the last real token and k drafts, each computed as
// a one-token decode, as the engine verifies them), against a one-token
// decode, on a real model. A speculative method pays off only when its
// accepted tokens outweigh this cost plus its proposer's.
//
//   ./build/verify_step_bench MODEL.gguf [--reps 10] [--threads 2] [--max-drafts 4]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/model_runner.h"
#include "model/kv_cache.h"
#include "model/model.h"

using namespace inferd;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [--reps N] [--threads N] [--max-drafts K]\n", argv[0]);
    return 2;
  }
  int reps = 10, threads = 2, max_drafts = 4;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--max-drafts")) max_drafts = std::atoi(argv[i + 1]);
  }
  LoadOptions options;
  options.n_threads = threads;
  auto model = Model::load(argv[1], options);
  if (!model) {
    std::fprintf(stderr, "error: %s\n", model.error().message.c_str());
    return 1;
  }
  ModelRunnerConfig rc;
  rc.kv_cache_bytes = int64_t{64} << 20;
  auto runner = ModelRunner::create(**model, rc);
  if (!runner) {
    std::fprintf(stderr, "error: %s\n", runner.error().message.c_str());
    return 1;
  }
  const int32_t n_blocks = (*runner)->n_blocks(), block_size = (*runner)->block_size();
  double decode_ms = 0.0;
  std::printf("%s, %d threads, %d reps, after 100 cached tokens\n", argv[1], threads, reps);
  for (int k = 0; k <= max_drafts; ++k) {
    SchedulerOutput out;
    ScheduledRequest s;
    s.request_id = "verify";
    s.num_computed_tokens = 100;
    s.num_new_tokens = k + 1;
    for (int i = 0; i <= k; ++i) s.token_ids.push_back(1000 + i);
    // Each KV group (sliding-window layers have their own) its own blocks.
    const int32_t n_groups = KVLayout::plan((*runner)->model().config()).num_groups();
    const int32_t per_group = (100 + k + block_size) / block_size;
    if (1 + n_groups * per_group > n_blocks) {
      std::fprintf(stderr, "error: the KV cache is too small\n");
      return 1;
    }
    s.block_tables.resize(n_groups);
    for (int32_t g = 0; g < n_groups; ++g)
      for (int32_t b = 0; b < per_group; ++b) s.block_tables[g].push_back(1 + g * per_group + b);
    s.sample = true;
    s.num_draft_tokens = k;
    out.scheduled.push_back(s);
    (*runner)->compute_logits(out);  // warm
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) (*runner)->compute_logits(out);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
    if (k == 0) decode_ms = ms;
    std::printf("k = %d drafts: %.2f ms (%.2f one-token decodes)\n", k, ms, ms / decode_ms);
  }
  return 0;
}
