// `inferd serve`: the OpenAI-compatible server. It listens at once (GET
// /health answers 503 while the model loads, 200 when ready), loads the model
// on a side thread, then serves until SIGINT or SIGTERM. Then it drains: new
// requests get 503 with Retry-After and /health 503 {"status": "draining"},
// while requests already running finish, for up to --shutdown-timeout seconds
// (a second signal cuts it short). Then it stops accepting, ends what is left
// with finish_reason "abort" (streams still get their last chunk and [DONE]),
// gives connections a moment to finish, and exits 0.
// Split across MPI ranks, rank 0 watches the others' processes: when one
// ends, /health answers 503 {"status": "dead", "dead_rank": r, ...}, new
// requests get 503 and running ones end with an error at once; after
// --lost-rank-grace seconds (or sooner, at mpirun's SIGTERM) every rank ends
// with a message naming the lost one.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "chat/chat_template.h"
#include "chat/reasoning.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/parallel.h"
#include "engine/engine.h"
#include "kv/kv_cache_dtype.h"
#include "server/http_server.h"
#include "server/openai_server.h"

namespace inferd::cli {

namespace {

struct ServeFlags {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string served_model_name;
  std::string chat_template;
  EngineFlags engine;
  int threads = default_threads();
  std::string ggml_flavour = "native";
  int io_threads = 1;
  int64_t max_queued_requests = 4096;
  int64_t responses_store_size = 1024;
  int64_t responses_store_ttl = 3600;
  int64_t max_n = 16;
  int64_t max_logprobs = 20;
  std::string max_request_body = "16M";
  bool log_prompts = false;
  int64_t max_log_len = 256;
  bool chat_special_tokens_in_content = false;
  std::string tool_call_parser;
  std::string reasoning_parser = "auto";
  bool no_webui = false;
  std::string kv_transfer_config;  // vLLM's JSON; empty: not part of a disaggregated deployment
  double shutdown_timeout = 30.0;  // seconds running requests may finish after SIGTERM; 0: abort at once
  double lost_rank_grace = 2.0;    // seconds rank 0 answers 503 after another rank is lost, then exits
  ParallelFlags parallel;
};

// An instance's name in transfer parameters, new at every start (vLLM: a uuid).
std::string random_engine_id() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i) id += fmt::format("{:08x}", rd());
  return id;
}

// Everything the loader thread builds; torn down in reverse order.
struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<Engine> engine;
};

bool load(const ServeFlags& f, const ParallelRun& run, Loaded& out, server::OpenAIServer& api,
          const std::optional<server::KVTransferConfig>& kv_transfer) {
  const auto numerics = resolve_numerics(f.engine.numerics);
  if (!numerics) {
    spdlog::error("{}", numerics.error().message);
    return false;
  }
  out.model = load_model_part(run, f.model, false, f.threads,
                              kernels::parse_ggml_flavour(f.ggml_flavour).value_or(kernels::native_ggml_flavour()),
                              *numerics);
  if (!out.model) return false;
  if (!out.model->can_generate()) {
    spdlog::error("{}", unsupported_architecture_message(out.model->config().architecture));
    return false;
  }
  std::optional<ChatTemplate> tmpl;
  const std::string model_template = out.model->chat_template();
  if (!f.chat_template.empty() || !model_template.empty()) {
    auto t = select_chat_template(model_template, f.chat_template);
    if (!t) {
      spdlog::error("chat template: {}", t.error().message);
      return false;
    }
    tmpl = std::move(t.value());
  } else {
    spdlog::warn("the model has no chat template: /v1/chat/completions will refuse requests (see --chat-template)");
  }

  auto ec = f.engine.config();
  if (!ec) {
    spdlog::error("{}", ec.error().message);
    return false;
  }
  ec->max_logprobs = static_cast<int32_t>(f.max_logprobs);
  run.attach(*ec);
  if (kv_transfer) {
    EngineConfig::KVTransfer t;
    t.produce = kv_transfer->produces();
    t.consume = kv_transfer->consumes();
    t.ip = kv_transfer->ip;
    t.port = kv_transfer->port;
    t.engine_id = kv_transfer->engine_id;
    t.lease_seconds = kv_transfer->lease_seconds;
    t.timeout_seconds = kv_transfer->timeout_seconds;
    ec->kv_transfer = t;
  }
  auto engine = Engine::create(*out.model, *ec);
  if (!engine) {
    spdlog::error("engine: {}", engine.error().message);
    return false;
  }
  out.engine = std::move(engine.value());
  out.engine->set_finished_listener([&api](const RequestOutput& o) { api.on_finished(o); });
  out.engine->start();
  const EngineStats stats = out.engine->stats();
  spdlog::info("model {} ready: max_model_len {}, KV cache {} blocks of {} tokens, {} threads, prefix caching {}",
               out.model->config().name, out.engine->config().max_model_len, stats.kv_total_blocks,
               out.engine->config().block_size, f.threads, out.engine->config().enable_prefix_caching ? "on" : "off");
  spdlog::info("numerics {}: {}", kernels::numerics_name(out.model->numerics()),
               out.model->numerics() == kernels::Numerics::kExact
                   ? "bit-identical with llama.cpp's CPU build"
                   : "integer accumulation (differs from llama.cpp by the activation quantization's error)");
  spdlog::info("KV cache capacity {} tokens: {} keys and values{}, {} bytes a token", stats.kv_capacity_tokens,
               kv::kv_cache_dtype_name(stats.kv_cache_dtype),
               stats.kv_cache_skip_sliding_window ? " (sliding-window layers f16)" : "", stats.kv_bytes_per_token);
  // Logged here, not by the engine: `generate --json` writes its result to stdout.
  if (const double c = out.engine->scheduler_config().context_positions_per_token; c > 0.0)
    spdlog::info("prompt chunks shorten with depth: {:.0f} positions of context cost one token's projections", c);
  if (stats.kv_state_slots > 0)
    spdlog::info("recurrent state: {} slots of {} bytes (f32) for up to {} running sequences (--max-num-seqs), "
                 "{} for the prefix cache's snapshots, {} for speculation's checkpoints: {:.2f} MiB with the spare "
                 "one, out of the KV budget",
                 stats.kv_state_slots, stats.kv_state_bytes_per_sequence, stats.kv_state_slots,
                 stats.kv_state_snapshots, stats.kv_state_checkpoints,
                 static_cast<double>(stats.kv_state_bytes) / (1 << 20));
  if (stats.offload.host_enabled)
    spdlog::info("KV offload: host tier of {} MiB", stats.offload.host.capacity_bytes >> 20);
  if (stats.offload.disk_enabled)
    spdlog::info("KV offload: disk tier in {} of {} MiB, {} blocks found there", out.engine->config().offload.disk_path,
                 stats.offload.disk.capacity_bytes >> 20, stats.offload.disk.blocks);
  api.attach(*out.model, *out.engine, std::move(tmpl));
  return true;
}

// After another rank was lost (ServingCore::fail has run): answers /health
// 503 for the grace period, which a signal (mpirun's SIGTERM as it ends the
// job, an operator's) cuts short, then ends every rank. No drain and no
// teardown: the engine's thread waits in MPI for the lost rank for good.
[[noreturn]] void exit_after_lost_rank(const ParallelRun& run, const sigset_t& signals, double grace_seconds,
                                       const std::string& why) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_seconds);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    timespec ts{static_cast<time_t>(left.count() / 1000000000), static_cast<long>(left.count() % 1000000000)};
    if (sigtimedwait(&signals, nullptr, &ts) > 0) break;
  }
  spdlog::critical("exiting: {}", why);
  spdlog::default_logger()->flush();
  run.abort(ParallelRun::kLostRankExit);
}

int run_serve(const ServeFlags& f) {
  auto run = start_parallel_run(f.parallel);
  if (!run) return refuse_launch(run.error().message, [](const std::string& why) { spdlog::error("{}", why); });
  if (run->worker()) {
    const auto numerics = resolve_numerics(f.engine.numerics);
    const auto config = f.engine.config();
    if (!numerics) run->await_abort();  // rank 0 says why
    return run_worker_rank(
        *run, f.model, f.threads,
        kernels::parse_ggml_flavour(f.ggml_flavour).value_or(kernels::native_ggml_flavour()), *numerics,
        [&config](const Model&) { return config ? std::optional(*config) : std::nullopt; });
  }
  // Rank 0 failing before its engine starts ends the other stages too.
  auto fail = [&run](int exit_code) {
    if (run->world) run->abort(exit_code);
    return exit_code;
  };
  // Signals are taken by sigwait below, not by whichever thread they hit.
  sigset_t signals = prepare_server_process();

  const int64_t max_body = parse_bytes(f.max_request_body);
  if (max_body <= 0) {
    spdlog::error("--max-request-body '{}' is not a size in bytes", f.max_request_body);
    return fail(2);
  }
  if (f.port < 0 || f.port > 65535) {
    spdlog::error("--port {} is not a TCP port", f.port);
    return fail(2);
  }
  server::ServerOptions options;
  options.served_model_name =
      f.served_model_name.empty() ? std::filesystem::path(f.model).stem().string() : f.served_model_name;
  options.api_key = f.api_key;
  options.max_queued_requests = f.max_queued_requests;
  options.responses_store_size = static_cast<size_t>(f.responses_store_size);
  options.responses_store_ttl = std::chrono::seconds(f.responses_store_ttl);
  options.log_prompts = f.log_prompts;
  options.max_log_len = static_cast<size_t>(std::max<int64_t>(0, f.max_log_len));
  options.special_tokens_in_chat_content = f.chat_special_tokens_in_content;
  if (!f.tool_call_parser.empty()) options.tool_call_parser = tool_call_format_from_name(f.tool_call_parser);
  options.reasoning_parser = reasoning_parser_from_name(f.reasoning_parser).value_or(ReasoningParser::kNone);
  options.webui = !f.no_webui;
  options.limits.max_n = static_cast<int32_t>(f.max_n);
  options.limits.max_logprobs = static_cast<int32_t>(f.max_logprobs);
  if (!f.kv_transfer_config.empty()) {
    auto kv = server::parse_kv_transfer_config(f.kv_transfer_config);
    if (!kv) {
      spdlog::error("{}", kv.error().message);
      return fail(2);
    }
    if (kv->engine_id.empty()) kv->engine_id = random_engine_id();
    spdlog::info("KV transfer: {} (engine id {}, transfer address {}:{}, leases {} s, pulls time out after {} s)",
                 server::kv_role_name(kv->role), kv->engine_id, kv->ip, kv->port, kv->lease_seconds,
                 kv->timeout_seconds);
    options.kv_transfer = std::move(*kv);
  }
  server::OpenAIServer api(options);

  server::HttpServerConfig hc;
  hc.host = f.host;
  hc.port = static_cast<uint16_t>(f.port);
  hc.io_threads = f.io_threads;
  hc.max_body_bytes = static_cast<size_t>(max_body);
  auto http = std::make_unique<server::HttpServer>(
      hc, [&api](server::Exchange& ex) { return api.handle(ex); },
      [&api](server::http::status s, std::string_view m, std::string_view path) {
        return api.rejection_body(s, m, path);
      });
  if (Status st = http->start(); !st) {
    spdlog::error("{}", st.error().message);
    return fail(1);
  }
  spdlog::info("serving {} at http://{}:{} ({}OpenAI API under /v1)", options.served_model_name, f.host, http->port(),
               options.webui ? "web chat page at /, " : "");

  // Another rank lost (rank 0 of a split model): fail everything now, exit after the grace period.
  std::atomic<bool> rank_lost{false};
  std::string lost_message;  // written before rank_lost is set
  run->watch_ranks([&](const distributed::RankProcess& p) {
    lost_message = fmt::format("{} ended: the model cannot run without it", distributed::describe(p));
    spdlog::critical("{}; /health answers 503, running requests fail, and every rank ends in {} s (--lost-rank-grace)",
                     lost_message, f.lost_rank_grace);
    api.fail(lost_message, p.rank);
    rank_lost = true;
    kill(getpid(), SIGTERM);  // wakes the main thread's sigwait
  });

  Loaded loaded;
  std::atomic<bool> load_failed{false};
  std::thread loader([&] {
    if (!load(f, *run, loaded, api, options.kv_transfer)) {
      if (run->world) run->abort(1);  // the other stages wait for this one
      load_failed = true;
      kill(getpid(), SIGTERM);
    }
  });
  int sig = 0;
  sigwait(&signals, &sig);
  // The loader may wait in MPI for the lost rank: not joined.
  if (rank_lost) exit_after_lost_rank(*run, signals, f.lost_rank_grace, lost_message);
  loader.join();
  if (!load_failed) spdlog::info("{}: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");

  api.begin_shutdown();  // before the engine stops: nothing may enter it after
  if (loaded.engine && f.shutdown_timeout > 0)
    drain_requests(signals, f.shutdown_timeout, [&api] { return api.unfinished_requests(); });
  // Lost during the drain: stopping the engine would wait for it for good.
  if (rank_lost) exit_after_lost_rank(*run, signals, f.lost_rank_grace, lost_message);
  http->stop_accepting();
  if (loaded.engine) {
    loaded.engine->stop();
    loaded.engine->abort_all();
  }
  http->stop(std::chrono::seconds(2));
  api.join_workers();  // their callers' frames live until the HTTP server goes
  http.reset();
  loaded.engine.reset();
  run->shutdown();  // the other ranks end their loops
  return load_failed ? 1 : 0;
}

}  // namespace

void register_serve(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<ServeFlags>();
  flags->model = default_model_path();
  CLI::App* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  sub->add_option("model_path", flags->model, "GGUF model file (the default model if omitted)");
  sub->add_option("-m,--model", flags->model, "GGUF model file");
  sub->add_option("--host", flags->host, "Address to listen on")->capture_default_str();
  sub->add_option("--port", flags->port, "Port to listen on")->capture_default_str();
  sub->add_option("--api-key", flags->api_key,
                  "Require 'Authorization: Bearer KEY' (or Anthropic's 'x-api-key: KEY') on every route but "
                  "/health and the web page's files");
  sub->add_option("--served-model-name", flags->served_model_name,
                  "Model name in the API (default: the model file's name without .gguf)");
  sub->add_option("--chat-template", flags->chat_template, "Jinja chat template file (overrides the model's)");
  sub->add_option("--tool-call-parser", flags->tool_call_parser,
                  "Tool-call format of the model's output (vLLM's names; default: from the chat template): "
                  "hermes, llama3_json, mistral, qwen3_coder, openai (gpt-oss's harmony; also 'harmony')")
      ->check(CLI::IsMember({"hermes", "llama3_json", "mistral", "qwen3_coder", "openai", "harmony"}));
  sub->add_option("--reasoning-parser", flags->reasoning_parser,
                  "Return the thinking of <think>...</think> models as reasoning_content, and apply grammars "
                  "after it: qwen3 (the output opens <think>), deepseek_r1 (the prompt opened it), openai_gptoss "
                  "(gpt-oss's analysis channel; also 'openai', 'harmony'), none, or auto (harmony when the chat "
                  "template writes <|channel|>, qwen3 when it writes </think>)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "auto", "qwen3", "deepseek_r1", "openai_gptoss", "openai", "harmony"}));
  sub->add_flag("--chat-special-tokens-in-content", flags->chat_special_tokens_in_content,
                "Read special-token text in chat messages (e.g. <|im_end|>) as the special token, as before; "
                "by default it is plain text, so a message cannot forge the template's turns");
  flags->engine.add_to(*sub);
  sub->add_option("-t,--threads", flags->threads, "Compute threads")->capture_default_str()->check(CLI::Range(1, 1024));
  sub->add_option("--ggml-flavour", flags->ggml_flavour,
                  "Follow the arithmetic of llama.cpp's AVX-512 or AVX2 CPU build, on any CPU (native: the build "
                  "llama.cpp makes on this one): outputs then match across machines bit for bit")
      ->capture_default_str()
      ->check(CLI::IsMember({"native", "avx512", "avx2"}));
  sub->add_option("--io-threads", flags->io_threads, "HTTP I/O threads")->capture_default_str();
  sub->add_option("--max-queued-requests", flags->max_queued_requests,
                  "Waiting requests at most; beyond it requests get 503")
      ->capture_default_str();
  sub->add_option("--responses-store-size", flags->responses_store_size,
                  "Responses kept for previous_response_id and GET /v1/responses/{id} (the oldest go first; 0: none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--responses-store-ttl", flags->responses_store_ttl,
                  "Seconds a stored response is kept")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("--shutdown-timeout", flags->shutdown_timeout,
                  "Seconds that running requests may take to finish after SIGTERM (new ones get 503, /health "
                  "reports draining); then the rest are aborted. 0: abort at once. A second signal ends at once")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--max-n", flags->max_n, "Largest 'n' (choices per prompt) a request may ask for")
      ->capture_default_str();
  sub->add_option("--max-logprobs", flags->max_logprobs, "Largest number of logprobs a request may ask for")
      ->capture_default_str();
  sub->add_option("--max-request-body", flags->max_request_body, "Largest request body (bytes; 413 beyond)")
      ->capture_default_str();
  sub->add_option("--kv-transfer-config", flags->kv_transfer_config,
                  "Prefill/decode disaggregation, vLLM's JSON: {\"kv_role\": \"kv_producer\" | \"kv_consumer\" | "
                  "\"kv_both\", \"kv_connector\": \"NixlConnector\", \"kv_ip\": \"127.0.0.1\", \"kv_port\": 14579} "
                  "(see inferd router)");
  flags->parallel.add_to(*sub);
  sub->add_option("--lost-rank-grace", flags->lost_rank_grace,
                  "With --tensor- or --pipeline-parallel-size: seconds that rank 0 keeps answering /health with 503 "
                  "(naming the rank) after another rank's process ended, before it ends every rank; a signal "
                  "(mpirun's SIGTERM, about 1 s after the loss by default) ends it sooner")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--no-webui", flags->no_webui, "Do not serve the web chat page at / (the API alone)");
  sub->add_flag("--log-prompts", flags->log_prompts, "Include prompt text in the per-request log line");
  sub->add_option("--max-log-len", flags->max_log_len, "Prompt characters logged at most")->capture_default_str();
  sub->callback([flags, sub, &exit_code] {
    flags->parallel.default_step_budget(*sub, flags->engine.max_num_batched_tokens);
    exit_code = run_serve(*flags);
  });
}

}  // namespace inferd::cli
