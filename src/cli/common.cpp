#include "cli/common.h"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <spdlog/spdlog.h>
#include <cstdio>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "engine/kv_capacity.h"
#include "engine/speculative_json.h"
#include "kv/kv_cache_dtype.h"

namespace inferd::cli {

std::string model_dir() {
  if (const char* d = std::getenv("INFERD_MODEL_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/inferd/models";
}

std::string default_model_path() { return model_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf"; }

void EngineFlags::add_to(CLI::App& app) {
  app.add_option("--max-num-seqs", max_num_seqs, "Requests running at once")
      ->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--max-num-batched-tokens", max_num_batched_tokens,
                 "Token budget of one engine step (with --pipeline-parallel-size above 1: 512 unless given)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--max-model-len", max_model_len, "Prompt + output tokens at most; 0 = the model's context length")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--kv-cache-memory,--kv-cache-memory-bytes", kv_cache_memory,
                 "KV cache size, e.g. 512M or 2G (default: a fraction of available memory)");
  app.add_option("--kv-cache-memory-fraction", kv_cache_memory_fraction,
                 "Fraction of available memory for the KV cache when --kv-cache-memory is unset")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--num-gpu-blocks-override", num_gpu_blocks_override,
                 "This many KV-cache blocks on each rank, whatever the size above buys (0: none)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--block-size", block_size, "Tokens per KV-cache block")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--chunk-attention-cost", chunk_attention_cost,
                 "Projection multiply-adds one attention multiply-add costs: prompt chunks deep in a long prompt "
                 "shorten so that a step's work, and the latency of streams decoding beside it, stays level "
                 "(0: chunks sized by tokens alone)")
      ->capture_default_str()->check(CLI::Range(0.0, 1e6));
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", enable_prefix_caching,
               "Reuse the KV cache of shared prompt prefixes (default on)");
  add_speculative_option(app, speculative_config);
  app.add_option("--kv-offload-size", kv_offload_size,
                 "Keep prefix-cache blocks the KV cache evicts in host memory, up to this size (e.g. 4G)");
  app.add_option("--kv-store-path", kv_store_path,
                 "Keep evicted prefix-cache blocks on disk in this directory too (found again after a restart)");
  app.add_option("--kv-store-size", kv_store_size, "Bound of the disk tier")->capture_default_str();
  add_kv_cache_dtype_options(app, kv_cache_dtype, cache_type_k, cache_type_v);
  app.add_option("--kv-cache-dtype-skip-layers", kv_cache_dtype_skip_layers,
                 "Layers whose KV cache stays f16 whatever --kv-cache-dtype says: sliding_window (Gemma 3's local "
                 "layers, gpt-oss's windowed ones) or none");
  add_numerics_option(app, numerics);
}

void add_numerics_option(CLI::App& app, std::string& numerics) {
  app.add_option("--numerics", numerics,
                 "Kernel arithmetic: exact (bit-identical with llama.cpp's CPU build) or fast (activations quantized "
                 "once per row, integer sums per weight block on VNNI or AMX; differs from exact by the activation "
                 "quantization's error)")
      ->capture_default_str();
}

void add_kv_cache_dtype_options(CLI::App& app, std::string& kv_cache_dtype, std::string& cache_type_k,
                                std::string& cache_type_v) {
  app.add_option("--kv-cache-dtype", kv_cache_dtype,
                 "KV cache element type: " + kv::kv_cache_dtype_names() +
                     " (auto = f16; fp8 = fp8_e4m3, scale 1.0). fp8_e4m3 holds 2x, q8_0 about 1.9x and q4_0 3.5x "
                     "the tokens of f16 in the same memory, at a small cost in accuracy")
      ->capture_default_str();
  app.add_option("--cache-type-k", cache_type_k, "llama.cpp's name (-ctk) for --kv-cache-dtype; must equal -ctv");
  app.add_option("--cache-type-v", cache_type_v, "llama.cpp's name (-ctv) for --kv-cache-dtype; must equal -ctk");
}

std::vector<std::string> expand_llama_cpp_short_flags(int argc, char** argv) {
  std::vector<std::string> args;
  args.reserve(static_cast<size_t>(argc));
  bool options_ended = false;  // after "--" everything is a positional argument
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (!options_ended && i > 0) {
      if (a == "--") options_ended = true;
      else if (a == "-ctk") a = "--cache-type-k";
      else if (a == "-ctv") a = "--cache-type-v";
    }
    args.push_back(std::move(a));
  }
  return args;
}

void add_speculative_option(CLI::App& app, std::string& json) {
  app.add_option("--speculative-config", json,
                 "Speculative decoding, as vLLM's JSON: {\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                 "\"prompt_lookup_min\": 1, \"prompt_lookup_max\": 4, \"disable_by_batch_size\": 8} or "
                 "{\"method\": \"draft_model\", \"model\": \"draft.gguf\", \"num_speculative_tokens\": 4, "
                 "\"draft_p_min\": 0.75, \"draft_vocab_size\": 32768}");
  // Runs after --speculative-config's own callback (CLI11 runs them in the
  // order the options were added), so it edits the JSON that option stored.
  app.add_option_function<std::string>(
      "--speculative-state-rollback",
      [&json](const std::string& method) {
        auto edited = with_state_rollback(json, method);
        if (!edited) throw CLI::ValidationError(edited.error().message);
        json = std::move(*edited);
      },
      "Hybrid models (recurrent layers): how rejected drafts are taken back out of the state: checkpoint (keep "
      "the state before the drafts: one state slot per request, the accepted drafts computed again; the default) "
      "or per-position (keep the state before each draft: k slots per request, nothing computed again). The JSON "
      "key \"state_rollback\" of --speculative-config says the same");
}

bool write_json_file(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) {
    std::fprintf(stderr, "error: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

int default_threads() { return ThreadPool::hardware_threads(); }

sigset_t prepare_server_process() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  if (rlimit lim{}; getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  return signals;
}

bool drain_requests(const sigset_t& signals, double timeout_seconds, const std::function<int64_t()>& in_flight) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout_seconds));
  int64_t n = in_flight();
  if (n > 0)
    spdlog::info("draining: {} request(s) in flight may finish within {} s (--shutdown-timeout); new requests get 503; "
                 "SIGTERM or SIGINT again ends at once",
                 n, timeout_seconds);
  for (; n > 0; n = in_flight()) {
    if (clock::now() >= deadline) {
      spdlog::warn("drain timed out after {} s: aborting {} request(s)", timeout_seconds, n);
      return false;
    }
    timespec poll{0, 50'000'000};  // the count is polled; a signal ends the wait at once
    const int sig = sigtimedwait(&signals, nullptr, &poll);
    if (sig == SIGINT || sig == SIGTERM) {
      spdlog::warn("{} during the drain: aborting {} request(s)", sig == SIGINT ? "SIGINT" : "SIGTERM", n);
      return false;
    }
  }
  spdlog::info("drained: every request finished");
  return true;
}

std::unique_ptr<Model> load_model_or_report(const std::string& path, bool quiet, int n_threads,
                                            kernels::GgmlFlavour flavour, kernels::Numerics numerics,
                                            PipelineStage stage, TensorShard shard,
                                            std::shared_ptr<TensorParallelComm> tensor_comm) {
  // One progress bar per run.
  const bool tty = isatty(STDERR_FILENO) && !quiet && stage.index == 0 && shard.index == 0;
  LoadOptions options;
  options.pipeline_stage = stage;
  options.tensor_shard = shard;
  options.tensor_comm = std::move(tensor_comm);
  options.n_threads = n_threads;
  options.ggml_flavour = flavour;
  options.numerics = numerics;
  int last_percent = -1;
  options.progress = [&](double fraction) {
    if (!tty) return;
    const int percent = static_cast<int>(fraction * 100.0);
    if (percent == last_percent) return;
    last_percent = percent;
    const int width = 40, filled = percent * width / 100;
    std::fprintf(stderr, "\rloading %-40.*s [%.*s%*s] %3d%%", 40, path.c_str(), filled,
                 "########################################", width - filled, "", percent);
    if (percent >= 100) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
  auto model = Model::load(path, options);
  if (!model) {
    if (tty && last_percent >= 0 && last_percent < 100) std::fprintf(stderr, "\n");
    std::fprintf(stderr, "error: cannot load model: %s\n", model.error().message.c_str());
    return nullptr;
  }
  if (shard.count > 1) {  // what this rank holds, in the whole model's numbering
    const TensorShardPlan& p = (*model)->tensor_shard_plan();
    auto range = [](ShardRange r) { return "[" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")"; };
    // With a pipeline: which stage's shard (its layers' bytes only).
    const std::string of_stage = stage.count > 1 ? " of pipeline stage " + std::to_string(stage.index) : "";
    spdlog::info("rank {} of {} (tensor parallel){}: KV heads {}, query heads {}, FFN rows {}, output rows {} of "
                 "attn_output and ffn_down, vocabulary rows {}; {} MiB of projections and head (the whole file: "
                 "{} MiB)",
                 shard.index, shard.count, of_stage, range(p.kv_heads), range(p.q_heads), range(p.ffn.of(shard.index)),
                 range(p.embd.of(shard.index)), range(p.vocab.of(shard.index)),
                 (*model)->tensor_shard_bytes() >> 20, (*model)->file().data_section_size() >> 20);
    if (p.experts.count() > 0)
      spdlog::info("rank {} of {} (expert parallel): experts {} of {}, shared expert rows {}", shard.index,
                   shard.count, range(p.experts.of(shard.index)), p.experts.whole(), range(p.shared.of(shard.index)));
  }
  return std::move(*model);
}

void SamplingFlags::add_to(CLI::App& app) {
  app.add_option("--temp,--temperature", temperature, "Sampling temperature; 0 = greedy")
      ->capture_default_str();
  app.add_option("--top-k", top_k, "Keep the k most likely tokens; 0 = off")->capture_default_str();
  app.add_option("--top-p", top_p, "Nucleus sampling mass in (0, 1]")->capture_default_str();
  app.add_option("--min-p", min_p, "Drop tokens below min_p x top probability")
      ->capture_default_str();
  app.add_option("--repeat-penalty,--repetition-penalty", repeat_penalty,
                 "Penalty for tokens already seen; 1 = off")
      ->capture_default_str();
  app.add_option("--frequency-penalty", frequency_penalty)->capture_default_str();
  app.add_option("--presence-penalty", presence_penalty)->capture_default_str();
  app.add_option("--seed", seed, "Random seed; -1 = random")->capture_default_str();
}

SamplingParams SamplingFlags::params() const {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repetition_penalty = repeat_penalty;
  p.frequency_penalty = frequency_penalty;
  p.presence_penalty = presence_penalty;
  if (seed >= 0) p.seed = static_cast<uint64_t>(seed);
  return p;
}

EngineConfig SingleRequestEngine::engine_config(const Model& model, int64_t max_model_len,
                                               const SpeculativeConfig& speculative, int32_t max_sequences,
                                               DType kv_cache_dtype) {
  EngineConfig config;
  config.kv_cache_dtype = kv_cache_dtype;
  config.speculative = speculative;
  config.max_num_seqs = std::max(1, max_sequences);
  config.max_model_len = max_model_len;
  config.max_num_batched_tokens = std::max<int64_t>(512, std::min<int64_t>(max_model_len, 2048));
  // The KV cache for max_sequences sequences of max_model_len tokens (the
  // engine caps a fraction of memory at that anyway; beams share most of it).
  const KVLayout layout = KVLayout::plan(model.config(), config.block_size, kv_cache_dtype);
  config.kv_cache_bytes = static_cast<int64_t>(layout.block_bytes()) *
                          (config.max_num_seqs * layout.blocks_for_request(max_model_len, config.block_size) + 2);
  // Beside recurrent layers, the state slots come out of the same budget first
  // (running sequences', speculation's checkpoints, prefix snapshots).
  config.kv_cache_bytes += kv_state_slots_bytes(layout, Engine::runner_config(model, config).n_state_slots);
  return config;
}

Result<SingleRequestEngine> SingleRequestEngine::create(Model& model, int64_t max_model_len,
                                                        const SpeculativeConfig& speculative, int32_t max_sequences,
                                                        DType kv_cache_dtype) {
  return create(model, engine_config(model, max_model_len, speculative, max_sequences, kv_cache_dtype));
}

Result<SingleRequestEngine> SingleRequestEngine::create(Model& model, const EngineConfig& config) {
  auto engine = Engine::create(model, config);
  if (!engine) return engine.error();
  return SingleRequestEngine(std::move(*engine));
}

Result<RequestOutput> SingleRequestEngine::run(GenerationParams params,
                                               const std::function<void(const RequestOutput&)>& on_delta) {
  auto handle = engine_->add_request(std::move(params));
  if (!handle) return handle.error();
  RequestOutput all;
  for (;;) {
    while (auto out = handle->stream->try_next()) {
      on_delta(*out);
      accumulate(all, std::move(*out));
      if (all.finished) {
        if (!all.error.empty()) return make_error(all.error);
        return all;
      }
    }
    engine_->step();
  }
}

}  // namespace inferd::cli
