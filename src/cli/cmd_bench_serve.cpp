// `inferd bench serve`: a load generator for any OpenAI-compatible server,
// after vLLM's `vllm bench serve`. Requests (random token sequences or a JSONL
// file of prompts or conversations) arrive as a Poisson process or all at once,
// at most --max-concurrency in flight, each streamed; prints vLLM's result
// block (throughputs; TTFT, TPOT, ITL and end-to-end latency percentiles) and
// writes it as JSON with the per-request measurements.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>
#include <sys/resource.h>
#include <unistd.h>

#include "bench/dataset.h"
#include "bench/serve_benchmark.h"
#include "bench/serve_metrics.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace inferd::cli {

namespace {

struct BenchServeFlags {
  std::string base_url;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint = "/v1/completions";
  std::string model;      // "": the first model the server lists
  std::string tokenizer;  // GGUF file whose vocabulary random prompts are drawn from
  std::string dataset_name = "random";
  std::string dataset_path;
  int64_t num_prompts = 1000;
  int64_t random_input_len = 1024;
  int64_t random_output_len = 128;
  double random_range_ratio = 0.0;
  int64_t random_prefix_len = 0;
  int64_t jsonl_output_len = 0;
  std::string request_rate = "inf";
  double burstiness = 1.0;
  int64_t max_concurrency = 0;  // 0: no limit
  int64_t num_warmups = 0;
  int ignore_eos = 0;  // > 0 on, < 0 off, 0: on for random prompts only
  double temperature = 0.0;
  int64_t seed = 0;
  std::string extra_body;
  std::string percentile_metrics = "ttft,tpot,itl,e2el";
  std::string metric_percentiles = "90,99";
  bool save_result = false;
  std::string result_dir;
  std::string result_filename;
  std::string output_json;
  bool save_generated_texts = false;
  std::string label;
  double ready_check_timeout_sec = 600;
  double request_timeout_sec = 600;
};

// Vocabulary less control tokens: what random prompts are made of, so no
// prompt contains a BOS, EOS or chat-template marker.
Result<std::vector<int32_t>> ordinary_tokens(const Tokenizer& tok) {
  std::vector<int32_t> pool;
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    if (!tok.is_control(id) && !tok.is_eog(id)) pool.push_back(id);
  if (pool.empty()) return make_error("the tokenizer has no ordinary tokens");
  return pool;
}

// Every request in flight holds a socket: lift the soft limit on open files
// to the hard one, so a burst of a few thousand requests does not run out.
void raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

std::string now_stamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

bool write_json(const std::string& path, const nlohmann::json& j) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) {
    std::fprintf(stderr, "error: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

int run_bench_serve(const BenchServeFlags& f) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    return 1;
  };
  const std::string url = !f.base_url.empty() ? f.base_url : "http://" + f.host + ":" + std::to_string(f.port);
  auto base = bench::parse_base_url(url);
  if (!base) return fail("--base-url: " + base.error().message);

  double rate = INFINITY;
  if (f.request_rate != "inf") {
    try {
      size_t used = 0;
      rate = std::stod(f.request_rate, &used);
      if (used != f.request_rate.size() || !(rate > 0)) throw std::invalid_argument("");
    } catch (...) {
      return fail("--request-rate: expected a positive number or 'inf'");
    }
  }
  auto metrics = bench::parse_metric_names(f.percentile_metrics);
  if (!metrics) return fail("--percentile-metrics: " + metrics.error().message);
  auto percentiles = bench::parse_percentiles(f.metric_percentiles);
  if (!percentiles) return fail("--metric-percentiles: " + percentiles.error().message);
  nlohmann::json extra_body = nlohmann::json::object();
  if (!f.extra_body.empty()) {
    extra_body = nlohmann::json::parse(f.extra_body, nullptr, false);
    if (extra_body.is_discarded() || !extra_body.is_object()) return fail("--extra-body: expected a JSON object");
  }
  const bench::ApiKind kind = bench::api_kind_of_endpoint(f.endpoint);

  // The tokenizer: needed for random prompts, optional for counting JSONL tokens.
  std::unique_ptr<gguf::File> gguf_file;
  std::unique_ptr<Tokenizer> tokenizer;
  if (!f.tokenizer.empty() && (f.dataset_name == "random" || std::filesystem::exists(f.tokenizer))) {
    auto file = gguf::File::open(f.tokenizer);
    if (!file) return fail("--tokenizer: " + file.error().message);
    auto tok = Tokenizer::from_gguf(**file);
    if (!tok) return fail("--tokenizer: " + tok.error().message);
    gguf_file = std::move(*file);
    tokenizer = std::move(*tok);
  }

  std::vector<bench::SampleRequest> requests;
  bool ignore_eos = f.ignore_eos > 0;
  if (f.dataset_name == "random") {
    if (kind == bench::ApiKind::kChatCompletions)
      return fail("random prompts are token ids: use --endpoint /v1/completions");
    if (!tokenizer) return fail("random prompts need --tokenizer (a GGUF file)");
    auto pool = ordinary_tokens(*tokenizer);
    if (!pool) return fail(pool.error().message);
    bench::RandomDatasetOptions o;
    o.num_prompts = f.num_prompts;
    o.input_len = f.random_input_len;
    o.output_len = f.random_output_len;
    o.range_ratio = f.random_range_ratio;
    o.prefix_len = f.random_prefix_len;
    o.seed = static_cast<uint64_t>(f.seed);
    requests = bench::make_random_dataset(o, *pool);
    ignore_eos = f.ignore_eos >= 0;  // fixed output lengths unless --no-ignore-eos
  } else if (f.dataset_name == "jsonl") {
    if (f.dataset_path.empty()) return fail("--dataset-name jsonl needs --dataset-path");
    bench::JsonlDatasetOptions o;
    o.num_prompts = f.num_prompts;
    o.chat = kind == bench::ApiKind::kChatCompletions;
    o.output_len = f.jsonl_output_len;
    bench::TokenCounter count;
    if (tokenizer)
      count = [&](const std::string& s) {
        return static_cast<int64_t>(tokenizer->encode(s, /*add_special=*/false, /*parse_special=*/false).size());
      };
    auto loaded = bench::load_jsonl_dataset(f.dataset_path, o, count);
    if (!loaded) return fail(loaded.error().message);
    requests = std::move(*loaded);
  } else {
    return fail("--dataset-name: expected 'random' or 'jsonl'");
  }

  std::string model = f.model;
  if (model.empty()) {
    // A server still loading its model may not answer yet: ask until the ready-check timeout.
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(f.ready_check_timeout_sec);
    for (;;) {
      auto first = bench::first_served_model(*base, f.request_timeout_sec);
      if (first) {
        model = *first;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) return fail(first.error().message + " (pass --model)");
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }

  bench::ServeBenchmarkConfig config;
  config.base = *base;
  config.endpoint = f.endpoint;
  config.request.model = model;
  config.request.ignore_eos = ignore_eos;
  config.request.temperature = f.temperature;
  config.request.seed = f.seed;
  config.request.extra_body = extra_body;
  config.request_rate = rate;
  config.burstiness = f.burstiness;
  if (f.max_concurrency > 0) config.max_concurrency = f.max_concurrency;
  config.num_warmups = f.num_warmups;
  config.ready_check_timeout_s = f.ready_check_timeout_sec;
  config.request_timeout_s = f.request_timeout_sec;
  config.seed = static_cast<uint64_t>(f.seed);
  config.progress = isatty(STDERR_FILENO);
  config.log = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };

  raise_open_file_limit();
  auto run = bench::run_serve_benchmark(config, requests);
  if (!run) return fail(run.error().message);

  const bench::ServeMetrics m = bench::compute_serve_metrics(run->results, run->duration, *percentiles);
  bench::ServeRunInfo info;
  info.backend = kind == bench::ApiKind::kChatCompletions ? "openai-chat" : "openai";
  info.label = f.label.empty() ? info.backend : f.label;
  info.base_url = url;
  info.endpoint = f.endpoint;
  info.model_id = model;
  info.tokenizer_id = tokenizer ? f.tokenizer : "";
  info.dataset_name = f.dataset_name;
  info.num_prompts = static_cast<int64_t>(requests.size());
  info.request_rate = rate;
  info.burstiness = f.burstiness;
  info.max_concurrency = config.max_concurrency;
  info.percentile_metrics = *metrics;
  info.percentiles = *percentiles;
  info.extra = {{"random_input_len", f.random_input_len},
                {"random_output_len", f.random_output_len},
                {"random_range_ratio", f.random_range_ratio},
                {"random_prefix_len", f.random_prefix_len},
                {"dataset_path", f.dataset_path},
                {"ignore_eos", ignore_eos},
                {"temperature", f.temperature},
                {"num_warmups", f.num_warmups},
                {"seed", f.seed},
                {"extra_body", extra_body}};

  int64_t shown = 0;
  for (const bench::RequestResult& r : run->results)
    if (!r.success && shown++ < 10) std::printf("Error %lld: %s\n", static_cast<long long>(shown - 1), r.error.c_str());
  std::printf("%s", bench::format_result_block(m, info).c_str());
  std::fflush(stdout);

  nlohmann::json j = bench::result_json(m, info, run->results, f.save_generated_texts);
  j["date"] = now_stamp();
  if (!f.output_json.empty() && !write_json(f.output_json, j)) return 1;
  if (f.save_result) {
    std::string name = f.result_filename;
    if (name.empty()) {
      std::string model_tail = model.substr(model.find_last_of('/') + 1);
      name = info.label + "-" + f.request_rate + "qps" +
             (config.max_concurrency ? "-concurrency" + std::to_string(*config.max_concurrency) : "") + "-" +
             model_tail + "-" + j["date"].get<std::string>() + ".json";
    }
    const std::string path = f.result_dir.empty() ? name : (std::filesystem::path(f.result_dir) / name).string();
    if (!write_json(path, j)) return 1;
  }
  return m.completed > 0 ? 0 : 1;
}

}  // namespace

void register_bench_serve(CLI::App& bench, int& exit_code) {
  auto flags = std::make_shared<BenchServeFlags>();
  flags->tokenizer = default_model_path();
  CLI::App* sub = bench.add_subcommand("serve", "Load-test an OpenAI-compatible server (as vllm bench serve)");
  sub->add_option("--base-url", flags->base_url, "Server URL, e.g. http://127.0.0.1:8000 (else --host/--port)");
  sub->add_option("--host", flags->host)->capture_default_str();
  sub->add_option("--port", flags->port)->capture_default_str()->check(CLI::Range(1, 65535));
  sub->add_option("--endpoint", flags->endpoint, "/v1/completions or /v1/chat/completions")->capture_default_str();
  sub->add_option("--model", flags->model, "Model name sent in requests (default: the server's first model)");
  sub->add_option("--tokenizer", flags->tokenizer, "GGUF file whose vocabulary random prompts use")
      ->capture_default_str();
  sub->add_option("--dataset-name", flags->dataset_name, "random or jsonl")
      ->capture_default_str()->check(CLI::IsMember({"random", "jsonl"}));
  sub->add_option("--dataset-path", flags->dataset_path, "JSONL file: {\"prompt\"}, {\"messages\"} or {\"conversations\"} per line");
  sub->add_option("--num-prompts", flags->num_prompts, "Requests to send")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--random-input-len", flags->random_input_len, "Prompt tokens after the shared prefix")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--random-output-len", flags->random_output_len, "Output tokens (max_tokens)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--random-range-ratio", flags->random_range_ratio, "Lengths uniform in [len*(1-r), len*(1+r)]")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  sub->add_option("--random-prefix-len", flags->random_prefix_len, "Random tokens every prompt starts with")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("--jsonl-output-len", flags->jsonl_output_len,
                  "max_tokens for every JSONL request (0: the line's, else its reference reply's length, else 128)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("--request-rate", flags->request_rate, "Requests per second (Poisson arrivals), or inf: all at once")
      ->capture_default_str();
  sub->add_option("--burstiness", flags->burstiness, "Gamma shape of arrival gaps; 1 = Poisson")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("--max-concurrency", flags->max_concurrency, "Requests in flight at most (0: no limit)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("--num-warmups", flags->num_warmups, "Untimed requests before the run")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_flag("--ignore-eos,!--no-ignore-eos", flags->ignore_eos,
                "Generate exactly max_tokens (default: on for random prompts, off for JSONL)");
  sub->add_option("--temperature,--temp", flags->temperature, "Sampling temperature; 0 = greedy")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("--seed", flags->seed, "Seed for prompts, arrivals and sampling")->capture_default_str();
  sub->add_option("--extra-body", flags->extra_body, "JSON object merged into every request body");
  sub->add_option("--percentile-metrics", flags->percentile_metrics, "Of ttft,tpot,itl,e2el")->capture_default_str();
  sub->add_option("--metric-percentiles", flags->metric_percentiles, "Percentiles to report, e.g. 50,90,99")
      ->capture_default_str();
  sub->add_flag("--save-result", flags->save_result, "Write the result JSON (see --result-dir, --result-filename)");
  sub->add_option("--result-dir", flags->result_dir, "Folder for --save-result");
  sub->add_option("--result-filename", flags->result_filename, "File name for --save-result");
  sub->add_option("--output-json", flags->output_json, "Write the result JSON to this file");
  sub->add_flag("--save-generated-texts", flags->save_generated_texts, "Include every generated text in the JSON");
  sub->add_option("--label", flags->label, "Label of the result (default: the backend)");
  sub->add_option("--ready-check-timeout-sec", flags->ready_check_timeout_sec,
                  "Retry a first request this long until the server answers (0: skip the check)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  sub->add_option("--request-timeout-sec", flags->request_timeout_sec, "Longest silence from the server in a request")
      ->capture_default_str()->check(CLI::PositiveNumber);
  sub->callback([flags, &exit_code] { exit_code = run_bench_serve(*flags); });
}

}  // namespace inferd::cli
