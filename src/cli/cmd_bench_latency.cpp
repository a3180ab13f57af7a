// `inferd bench latency`: one request at a time through the engine (no HTTP),
// after vLLM's `vllm bench latency` at batch size 1. Each iteration sends a
// fresh random prompt of --input-len tokens and generates exactly
// --output-len tokens (ignore_eos); reports time to first token, prompt
// tokens/s (input length / TTFT), decode tokens/s (output tokens after the
// first / the time they took) and end-to-end latency, each as mean, median,
// p90, p99 and standard deviation over the timed iterations.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "bench/dataset.h"
#include "bench/stats.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/parallel.h"
#include "engine/engine.h"
#include "kv/kv_cache_dtype.h"

namespace inferd::cli {

namespace {

struct BenchLatencyFlags {
  std::string model;
  int64_t input_len = 32;
  int64_t output_len = 128;
  int64_t num_iters = 30;
  int64_t num_iters_warmup = 10;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 0;
  std::string kv_cache_memory = "256M";
  int64_t num_gpu_blocks_override = 0;
  std::string kv_cache_dtype = "auto", cache_type_k, cache_type_v;  // resolve_kv_cache_dtype
  std::string numerics = kernels::numerics_name(kernels::kDefaultNumerics);  // resolve_numerics
  bool enable_prefix_caching = false;
  bool warm_up = true;
  float temperature = 0.0f;
  int threads = default_threads();
  int64_t seed = 0;
  std::string output_json;
  ParallelFlags parallel;
};

struct Iteration {
  double ttft = 0;        // s
  double decode_tps = 0;  // output tokens after the first / their time
  double e2e = 0;         // s
  int64_t peak_kv_blocks = 0;  // the most KV blocks the request held at once
  int64_t last_kv_blocks = 0;  // the blocks it held after its last step but one
};

const std::vector<double> kPercentiles = {90, 99};

nlohmann::json summary_json(const bench::Summary& s) {
  nlohmann::json j = {{"mean", s.mean}, {"median", s.median}, {"stddev", s.stddev}, {"min", s.min}, {"max", s.max}};
  for (const auto& [p, v] : s.percentiles) j["p" + std::to_string(static_cast<int>(p))] = v;
  return j;
}

void print_row(const char* name, const char* unit, const bench::Summary& s, double scale) {
  std::printf("%-22s %10.2f %10.2f %10.2f %10.2f %10.2f  %s\n", name, scale * s.mean, scale * s.median,
              scale * s.at(90), scale * s.at(99), scale * s.stddev, unit);
}

// The engine config of a run (every rank makes the same one from the flags).
Result<EngineConfig> latency_engine_config(const BenchLatencyFlags& f) {
  const auto kv_dtype = resolve_kv_cache_dtype(f.kv_cache_dtype, f.cache_type_k, f.cache_type_v);
  if (!kv_dtype) return kv_dtype.error();
  EngineConfig ec;
  ec.max_num_seqs = 1;
  ec.max_num_batched_tokens = f.max_num_batched_tokens;
  ec.max_model_len = f.max_model_len;
  ec.enable_prefix_caching = f.enable_prefix_caching;
  ec.warm_up = f.warm_up;
  ec.kv_cache_dtype = *kv_dtype;
  ec.kv_cache_bytes = parse_bytes(f.kv_cache_memory);
  if (ec.kv_cache_bytes <= 0) return make_error("--kv-cache-memory: expected a size such as 256M or 1G");
  ec.num_gpu_blocks_override = f.num_gpu_blocks_override;
  return ec;
}

int bench_latency_on(const BenchLatencyFlags& f, const ParallelRun& run) {
  auto config = latency_engine_config(f);
  if (!config) {
    std::fprintf(stderr, "error: %s\n", config.error().message.c_str());
    return 1;
  }
  EngineConfig& ec = *config;
  const auto numerics = resolve_numerics(f.numerics);
  if (!numerics) {
    std::fprintf(stderr, "error: %s\n", numerics.error().message.c_str());
    return 1;
  }
  auto model = load_model_part(run, f.model, false, f.threads, kernels::native_ggml_flavour(), *numerics);
  if (!model) return 1;
  if (!model->can_generate()) {
    std::fprintf(stderr, "error: %s\n", unsupported_architecture_message(model->config().architecture).c_str());
    return 1;
  }
  run.attach(ec);
  auto engine = Engine::create(*model, ec);
  if (!engine) {
    std::fprintf(stderr, "error: %s\n", engine.error().message.c_str());
    return 1;
  }

  // A fresh prompt per iteration (made before timing), so a prefix cache
  // turned on by --enable-prefix-caching would only see chance overlaps.
  const Tokenizer& tok = model->tokenizer();
  std::vector<int32_t> pool_ids;
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    if (!tok.is_control(id) && !tok.is_eog(id)) pool_ids.push_back(id);
  bench::RandomDatasetOptions d;
  d.num_prompts = f.num_iters_warmup + f.num_iters;
  d.input_len = f.input_len;
  d.output_len = f.output_len;
  d.seed = static_cast<uint64_t>(f.seed);
  const std::vector<bench::SampleRequest> prompts = bench::make_random_dataset(d, pool_ids);

  auto run_one = [&](const bench::SampleRequest& sample, int64_t i) -> std::optional<Iteration> {
    GenerationParams p;
    p.prompt_token_ids = std::get<std::vector<int32_t>>(sample.prompt);
    p.max_tokens = f.output_len;
    p.ignore_eos = true;
    p.sampling.temperature = f.temperature;
    p.sampling.top_k = 0;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    p.sampling.seed = static_cast<uint64_t>(f.seed + i);
    auto h = (*engine)->add_request(std::move(p));
    if (!h) {
      std::fprintf(stderr, "error: %s\n", h.error().message.c_str());
      return std::nullopt;
    }
    std::optional<RequestMetrics> metrics;
    int64_t peak_kv_blocks = 0, last_kv_blocks = 0;
    while ((*engine)->has_pending_work()) {
      const std::vector<RequestOutput> outputs = (*engine)->step();
      const SchedulerStats st = (*engine)->stats().scheduler;
      peak_kv_blocks = std::max<int64_t>(peak_kv_blocks, st.kv_used_blocks);
      if (st.num_running > 0) last_kv_blocks = st.kv_used_blocks;
      for (const RequestOutput& o : outputs)
        if (o.finished) {
          if (o.status != RequestStatus::kFinishedLength) {
            std::fprintf(stderr, "error: request finished with '%s'%s%s\n", o.finish_reason(),
                         o.error.empty() ? "" : ": ", o.error.c_str());
            return std::nullopt;
          }
          metrics = o.metrics;
        }
    }
    if (!metrics) return std::nullopt;
    Iteration it;
    it.peak_kv_blocks = peak_kv_blocks;
    it.last_kv_blocks = last_kv_blocks;
    it.ttft = metrics->time_to_first_token();
    it.e2e = metrics->e2e_latency();
    const double decode_time = metrics->last_token_time - metrics->first_token_time;
    if (metrics->num_output_tokens > 1 && decode_time > 0)
      it.decode_tps = static_cast<double>(metrics->num_output_tokens - 1) / decode_time;
    return it;
  };

  std::printf("Warming up with %lld iterations...\n", static_cast<long long>(f.num_iters_warmup));
  std::fflush(stdout);
  int64_t i = 0;
  for (; i < f.num_iters_warmup; ++i)
    if (!run_one(prompts[static_cast<size_t>(i)], i)) return 1;
  std::vector<double> ttft, prompt_tps, decode_tps, e2e;
  int64_t peak_kv_blocks = 0, last_kv_blocks = 0;
  for (int64_t k = 0; k < f.num_iters; ++k, ++i) {
    auto it = run_one(prompts[static_cast<size_t>(i)], i);
    if (!it) return 1;
    peak_kv_blocks = std::max(peak_kv_blocks, it->peak_kv_blocks);
    last_kv_blocks = std::max(last_kv_blocks, it->last_kv_blocks);
    ttft.push_back(it->ttft);
    prompt_tps.push_back(it->ttft > 0 ? static_cast<double>(f.input_len) / it->ttft : 0.0);
    if (f.output_len > 1) decode_tps.push_back(it->decode_tps);
    e2e.push_back(it->e2e);
  }
  const bench::Summary s_ttft = bench::summarize(ttft, kPercentiles);
  const bench::Summary s_prompt = bench::summarize(prompt_tps, kPercentiles);
  const bench::Summary s_decode = bench::summarize(decode_tps, kPercentiles);
  const bench::Summary s_e2e = bench::summarize(e2e, kPercentiles);

  std::printf("Input %lld tokens, output %lld tokens, %lld iterations, %d threads%s\n",
              static_cast<long long>(f.input_len), static_cast<long long>(f.output_len),
              static_cast<long long>(f.num_iters), f.threads, ranks_note(f.parallel).c_str());
  std::printf("%-22s %10s %10s %10s %10s %10s\n", "", "mean", "median", "p90", "p99", "stddev");
  print_row("TTFT", "ms", s_ttft, 1e3);
  print_row("Prompt throughput", "tokens/s", s_prompt, 1.0);
  if (f.output_len > 1) print_row("Decode throughput", "tokens/s", s_decode, 1.0);
  print_row("End-to-end latency", "ms", s_e2e, 1e3);
  // What one request's keys and values took at their largest: windowed layers
  // (Gemma 3) give back blocks their window no longer reaches. Tensor
  // parallel: rank 0's config holds its KV heads only, so this is one rank's.
  const int64_t kv_block_bytes = static_cast<int64_t>(KVCache::block_bytes(model->config(), ec.block_size, ec.kv_cache_dtype));
  const int64_t peak_kv_bytes = peak_kv_blocks * kv_block_bytes;
  const int64_t last_kv_bytes = last_kv_blocks * kv_block_bytes;
  std::printf("%-22s %10.2f MiB (%lld blocks of %lld bytes)%s\n", "Peak KV per request",
              static_cast<double>(peak_kv_bytes) / (1 << 20), static_cast<long long>(peak_kv_blocks),
              static_cast<long long>(kv_block_bytes), f.parallel.tensor_parallel_size > 1 ? ", on each rank" : "");
  std::printf("%-22s %10.2f MiB (%lld blocks)\n", "KV at the last token", static_cast<double>(last_kv_bytes) / (1 << 20),
              static_cast<long long>(last_kv_blocks));
  const CollectiveStats collectives = (*engine)->stats().collectives;
  print_collectives(collectives);

  if (!f.output_json.empty()) {
    nlohmann::json j;
    j["ttft_s"] = summary_json(s_ttft);
    j["prompt_tokens_per_second"] = summary_json(s_prompt);
    if (f.output_len > 1) j["decode_tokens_per_second"] = summary_json(s_decode);
    j["latency_s"] = summary_json(s_e2e);
    j["peak_kv_bytes_per_request"] = peak_kv_bytes;
    j["peak_kv_blocks_per_request"] = peak_kv_blocks;
    j["last_token_kv_bytes_per_request"] = last_kv_bytes;
    if (collectives.calls > 0)
      j["collectives"] = {{"calls", collectives.calls}, {"seconds", collectives.seconds}, {"mean_us", collectives.mean_us()}};
    // vLLM's bench latency fields.
    j["avg_latency"] = s_e2e.mean;
    j["percentiles"] = {{"90", s_e2e.at(90)}, {"99", s_e2e.at(99)}};
    j["ttfts"] = ttft;
    j["decode_tps"] = decode_tps;
    j["latencies"] = e2e;
    j["config"] = {{"model", f.model},
                   {"input_len", f.input_len},
                   {"output_len", f.output_len},
                   {"num_iters", f.num_iters},
                   {"num_iters_warmup", f.num_iters_warmup},
                   {"max_num_batched_tokens", f.max_num_batched_tokens},
                   {"enable_prefix_caching", f.enable_prefix_caching},
                   {"kv_cache_dtype", kv::kv_cache_dtype_name(ec.kv_cache_dtype)},
                   {"warm_up", f.warm_up},
                   {"temperature", f.temperature},
                   {"threads", f.threads},
                   {"tensor_parallel_size", f.parallel.tensor_parallel_size},
                   {"pipeline_parallel_size", f.parallel.pipeline_parallel_size},
                   {"seed", f.seed}};
    if (!write_json_file(f.output_json, j)) return 1;
  }
  return 0;
}

int run_bench_latency(const BenchLatencyFlags& f) {
  const auto numerics = resolve_numerics(f.numerics);
  return run_command_on_ranks(
      f.parallel, f.model, f.threads, numerics ? std::optional(*numerics) : std::nullopt,
      [&f](const Model&) -> std::optional<EngineConfig> {
        auto config = latency_engine_config(f);
        return config ? std::optional(*config) : std::nullopt;
      },
      [&f](const ParallelRun& run) { return bench_latency_on(f, run); });
}

}  // namespace

void register_bench_latency(CLI::App& bench, int& exit_code) {
  auto flags = std::make_shared<BenchLatencyFlags>();
  flags->model = default_model_path();
  CLI::App* sub = bench.add_subcommand("latency", "Single-request latency through the engine (TTFT, decode tokens/s)");
  sub->add_option("-m,--model", flags->model, "GGUF model file")->capture_default_str();
  sub->add_option("--input-len", flags->input_len, "Prompt tokens")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--output-len", flags->output_len, "Output tokens")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--num-iters", flags->num_iters, "Timed iterations")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--num-iters-warmup", flags->num_iters_warmup, "Untimed iterations first")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("--max-num-batched-tokens", flags->max_num_batched_tokens,
                  "Token budget of a step (a longer prompt is prefilled in chunks)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--max-model-len", flags->max_model_len, "0 = the model's context length")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("--kv-cache-memory", flags->kv_cache_memory, "KV cache size, e.g. 256M")->capture_default_str();
  sub->add_option("--num-gpu-blocks-override", flags->num_gpu_blocks_override,
                  "This many KV-cache blocks on each rank, whatever --kv-cache-memory buys (0: none)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  add_kv_cache_dtype_options(*sub, flags->kv_cache_dtype, flags->cache_type_k, flags->cache_type_v);
  add_numerics_option(*sub, flags->numerics);
  sub->add_flag("--warm-up,!--no-warm-up", flags->warm_up,
                "Run a prefill and a decode pass when the engine starts, before the first request")
      ->capture_default_str();
  sub->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", flags->enable_prefix_caching,
                "Reuse cached KV blocks (default off: every iteration computes its whole prompt)");
  sub->add_option("--temp,--temperature", flags->temperature, "Sampling temperature; 0 = greedy")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("-t,--threads", flags->threads, "Threads")->capture_default_str()->check(CLI::Range(1, 1024));
  sub->add_option("--seed", flags->seed, "Seed for prompts and sampling")->capture_default_str();
  sub->add_option("--output-json", flags->output_json, "Write the results as JSON to this file");
  flags->parallel.add_to(*sub);
  sub->callback([flags, &exit_code] { exit_code = run_bench_latency(*flags); });
}

}  // namespace inferd::cli
