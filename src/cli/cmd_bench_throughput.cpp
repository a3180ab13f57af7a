// `inferd bench throughput`: offline throughput of the engine, after vLLM's
// `vllm bench throughput` with its random dataset. N requests of random token
// ids (given or randomly spread input/output lengths, ignore_eos so every
// request produces exactly its output length) are all added at once and
// stepped until done; prints requests/s, total tokens/s and output tokens/s,
// and optionally writes them with the engine's stats as JSON.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/parallel.h"
#include "engine/engine.h"
#include "kv/kv_cache_dtype.h"
#include "engine/stats_json.h"

namespace inferd::cli {

namespace {

struct BenchThroughputFlags {
  std::string model;
  int64_t num_prompts = 100;
  int64_t input_len = 128;
  int64_t output_len = 128;
  double random_range_ratio = 0.0;
  int64_t prefix_len = 0;
  EngineFlags engine;
  float temperature = 1.0f;
  int threads = default_threads();
  int64_t seed = 0;
  std::string output_json;
  ParallelFlags parallel;
};

// Length spread uniformly over [len * (1 - r), len * (1 + r)], at least 1 (vLLM's random dataset).
int64_t spread(int64_t len, double r, std::mt19937_64& rng) {
  const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(len * (1.0 - r)));
  const int64_t hi = std::max(lo, static_cast<int64_t>(len * (1.0 + r)));
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

int bench_throughput_on(const BenchThroughputFlags& f, const ParallelRun& run) {
  auto ec = f.engine.config();
  if (!ec) {
    std::fprintf(stderr, "error: %s\n", ec.error().message.c_str());
    return 1;
  }
  auto model = load_model_part(run, f.model, false, f.threads, kernels::native_ggml_flavour(), ec->numerics);
  if (!model) return 1;
  if (!model->can_generate()) {
    std::fprintf(stderr, "error: %s\n", unsupported_architecture_message(model->config().architecture).c_str());
    return 1;
  }
  run.attach(*ec);
  auto engine = Engine::create(*model, *ec);
  if (!engine) {
    std::fprintf(stderr, "error: %s\n", engine.error().message.c_str());
    return 1;
  }

  // Random prompts of ordinary tokens (no control tokens), all made before timing.
  const Tokenizer& tok = model->tokenizer();
  std::mt19937_64 rng(static_cast<uint64_t>(f.seed));
  std::uniform_int_distribution<int32_t> any_token(0, tok.n_vocab() - 1);
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> t;
    while (static_cast<int64_t>(t.size()) < n) {
      const int32_t id = any_token(rng);
      if (!tok.is_control(id)) t.push_back(id);
    }
    return t;
  };
  const std::vector<int32_t> prefix = random_tokens(f.prefix_len);
  std::vector<GenerationParams> requests;
  int64_t total_prompt = 0, total_output = 0;
  for (int64_t i = 0; i < f.num_prompts; ++i) {
    GenerationParams p;
    p.prompt_token_ids = prefix;
    const std::vector<int32_t> rest = random_tokens(spread(f.input_len, f.random_range_ratio, rng));
    p.prompt_token_ids.insert(p.prompt_token_ids.end(), rest.begin(), rest.end());
    p.max_tokens = spread(f.output_len, f.random_range_ratio, rng);
    p.ignore_eos = true;
    p.sampling.temperature = f.temperature;
    p.sampling.top_k = 0;
    p.sampling.top_p = 1.0f;
    p.sampling.seed = static_cast<uint64_t>(f.seed) + static_cast<uint64_t>(i);
    total_prompt += static_cast<int64_t>(p.prompt_token_ids.size());
    total_output += p.max_tokens;
    requests.push_back(std::move(p));
  }

  const auto t0 = std::chrono::steady_clock::now();
  for (GenerationParams& p : requests) {
    auto h = (*engine)->add_request(std::move(p));
    if (!h) {
      std::fprintf(stderr, "error: %s\n", h.error().message.c_str());
      return 1;
    }
  }
  int64_t generated = 0, finished = 0;
  std::vector<double> ttft, tpot, e2e;
  // Paged-KV waste: slots allocated but holding no token, sampled after every
  // step and weighted by the slots allocated (so busy steps count more).
  double allocated_slot_steps = 0, held_token_steps = 0;
  while ((*engine)->has_pending_work()) {
    const std::vector<RequestOutput> outputs = (*engine)->step();
    {
      const SchedulerStats ss = (*engine)->stats().scheduler;
      allocated_slot_steps += static_cast<double>(ss.kv_used_blocks) * ec->block_size;
      held_token_steps += static_cast<double>(ss.kv_held_tokens);
    }
    for (const RequestOutput& o : outputs) {
      generated += static_cast<int64_t>(o.token_ids.size());
      if (!o.finished) continue;
      ++finished;
      if (o.status != RequestStatus::kFinishedLength)
        std::fprintf(stderr, "warning: request %s finished with '%s'%s%s\n", o.request_id.c_str(),
                     o.finish_reason(), o.error.empty() ? "" : ": ", o.error.c_str());
      const RequestMetrics& m = o.metrics;
      ttft.push_back(m.time_to_first_token());
      e2e.push_back(m.e2e_latency());
      if (m.num_output_tokens > 1)
        tpot.push_back((m.last_token_time - m.first_token_time) / (m.num_output_tokens - 1));
    }
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineStats st = (*engine)->stats();

  const double rps = finished / elapsed;
  const double total_tps = (total_prompt + generated) / elapsed;
  const double output_tps = generated / elapsed;
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0.0 : s / static_cast<double>(v.size());
  };
  const auto& pc = st.scheduler.prefix_cache;
  std::printf("Throughput: %.2f requests/s, %.2f total tokens/s, %.2f output tokens/s\n", rps,
              total_tps, output_tps);
  std::printf("Total num prompt tokens:  %lld\n", static_cast<long long>(total_prompt));
  std::printf("Total num output tokens:  %lld\n", static_cast<long long>(generated));
  std::printf("Elapsed: %.2f s (forward passes %.2f s); %lld steps, %.1f tokens/step; "
              "%lld preemptions; prefix cache hits %lld of %lld tokens; KV cache %d blocks of %lld tokens "
              "(%lld tokens of %s)\n",
              elapsed, st.forward_seconds, static_cast<long long>(st.scheduler.steps),
              st.mean_tokens_per_step(), static_cast<long long>(st.scheduler.preemptions),
              static_cast<long long>(pc.hit_tokens), static_cast<long long>(pc.queried_tokens),
              st.kv_total_blocks, static_cast<long long>(f.engine.block_size),
              static_cast<long long>(st.kv_capacity_tokens), kv::kv_cache_dtype_name(st.kv_cache_dtype).c_str());
  // Shared prefix blocks hold tokens for several requests, so with prefix
  // hits "held" can exceed "allocated"; clamp the waste at zero.
  const double kv_waste =
      allocated_slot_steps > 0 ? std::max(0.0, 1.0 - held_token_steps / allocated_slot_steps) : 0.0;
  std::printf("KV cache: %.2f%% of allocated slots held no token (averaged over steps)\n",
              100.0 * kv_waste);
  std::printf("Mean TTFT %.1f ms, mean time per output token %.1f ms, mean e2e latency %.1f ms\n",
              1e3 * mean(ttft), 1e3 * mean(tpot), 1e3 * mean(e2e));
  const SpeculativeStats& spec = st.speculative;
  if (spec.drafts > 0)
    std::printf("Speculation: %lld of %lld drafts accepted, mean acceptance length %.2f\n",
                static_cast<long long>(spec.accepted_tokens), static_cast<long long>(spec.draft_tokens),
                spec.mean_acceptance_length());
  print_collectives(st.collectives);
  if (!ranks_note(f.parallel).empty())
    std::printf("Ran with %d threads%s\n", f.threads, ranks_note(f.parallel).c_str());
  if (total_output != generated)
    std::fprintf(stderr, "warning: %lld output tokens expected, %lld generated\n",
                 static_cast<long long>(total_output), static_cast<long long>(generated));

  if (!f.output_json.empty()) {
    nlohmann::json j;
    j["elapsed_time"] = elapsed;
    j["num_requests"] = finished;
    j["total_num_tokens"] = total_prompt + generated;
    j["total_prompt_tokens"] = total_prompt;
    j["total_output_tokens"] = generated;
    j["requests_per_second"] = rps;
    j["tokens_per_second"] = total_tps;
    j["output_tokens_per_second"] = output_tps;
    j["mean_ttft_ms"] = 1e3 * mean(ttft);
    j["mean_tpot_ms"] = 1e3 * mean(tpot);
    j["mean_e2e_latency_ms"] = 1e3 * mean(e2e);
    j["engine"] = engine_stats_json(st);
    j["engine"]["kv_allocated_slot_waste"] = kv_waste;
    j["config"] = {{"model", f.model},
                   {"num_prompts", f.num_prompts},
                   {"input_len", f.input_len},
                   {"output_len", f.output_len},
                   {"random_range_ratio", f.random_range_ratio},
                   {"prefix_len", f.prefix_len},
                   {"max_num_seqs", f.engine.max_num_seqs},
                   {"max_num_batched_tokens", f.engine.max_num_batched_tokens},
                   {"max_model_len", (*engine)->config().max_model_len},
                   {"block_size", f.engine.block_size},
                   {"kv_cache_dtype", kv::kv_cache_dtype_name(st.kv_cache_dtype)},
                   {"enable_prefix_caching", f.engine.enable_prefix_caching},
                   {"temperature", f.temperature},
                   {"threads", f.threads},
                   {"tensor_parallel_size", f.parallel.tensor_parallel_size},
                   {"pipeline_parallel_size", f.parallel.pipeline_parallel_size},
                   {"seed", f.seed}};
    if (!write_json_file(f.output_json, j)) return 1;
  }
  return 0;
}

int run_bench_throughput(const BenchThroughputFlags& f) {
  auto config = f.engine.config();
  return run_command_on_ranks(
      f.parallel, f.model, f.threads, config ? std::optional(config->numerics) : std::nullopt,
      [&config](const Model&) { return config ? std::optional(*config) : std::nullopt; },
      [&f](const ParallelRun& run) { return bench_throughput_on(f, run); });
}

}  // namespace

void register_bench_throughput(CLI::App& bench, int& exit_code) {
  auto flags = std::make_shared<BenchThroughputFlags>();
  flags->model = default_model_path();
  CLI::App* sub = bench.add_subcommand("throughput", "Offline throughput with random prompts");
  sub->add_option("-m,--model", flags->model, "GGUF model file")->capture_default_str();
  sub->add_option("--num-prompts", flags->num_prompts, "Number of requests")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--input-len", flags->input_len, "Prompt tokens per request")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--output-len", flags->output_len, "Output tokens per request")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--random-range-ratio", flags->random_range_ratio,
                  "Lengths uniform in [len*(1-r), len*(1+r)]")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  sub->add_option("--prefix-len", flags->prefix_len, "Random tokens shared by every prompt's start")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  flags->engine.add_to(*sub);
  sub->add_option("--temp,--temperature", flags->temperature, "Sampling temperature; 0 = greedy")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("-t,--threads", flags->threads, "Threads")->capture_default_str()->check(CLI::Range(1, 1024));
  sub->add_option("--seed", flags->seed, "Seed for prompts, lengths and sampling")->capture_default_str();
  sub->add_option("--output-json", flags->output_json, "Write the results as JSON to this file");
  flags->parallel.add_to(*sub);
  sub->callback([flags, sub, &exit_code] {
    flags->parallel.default_step_budget(*sub, flags->engine.max_num_batched_tokens);
    exit_code = run_bench_throughput(*flags);
  });
}

}  // namespace inferd::cli
