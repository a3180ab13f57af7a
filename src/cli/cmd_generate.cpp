// `inferd generate`: complete a raw text prompt, streaming the text, or print
// token ids and text as JSON for tools. Runs on the serving engine
// (SingleRequestEngine), as `serve` does.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <optional>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/parallel.h"

namespace inferd::cli {

namespace {
struct GenerateFlags {
  std::string model;
  std::string prompt;
  int64_t n_predict = 128;
  int64_t ctx_size = 4096;
  int threads = default_threads();
  bool json = false;
  bool ignore_eos = false;
  bool no_special = false;
  SamplingFlags sampling;
  std::string speculative_config;  // vLLM's JSON; empty: off
  int32_t beam_width = 0;          // > 0: beam search with this many beams
  int32_t n_beams = 1;             // beams printed, best first
  float length_penalty = 1.0f;
  std::string early_stopping = "false";
  std::string kv_cache_dtype = "auto", cache_type_k, cache_type_v;  // resolve_kv_cache_dtype
  std::string numerics = kernels::numerics_name(kernels::kDefaultNumerics);  // resolve_numerics
  ParallelFlags parallel;
};

// --early-stopping: HF's / vLLM's true, false or never.
std::optional<EarlyStopping> parse_early_stopping(const std::string& s) {
  if (s == "false") return EarlyStopping::kFalse;
  if (s == "true") return EarlyStopping::kTrue;
  if (s == "never") return EarlyStopping::kNever;
  return std::nullopt;
}

// The engine config of a run (every rank makes the same one from the flags).
Result<EngineConfig> generate_engine_config(const GenerateFlags& f, const Model& model) {
  const auto kv_dtype = resolve_kv_cache_dtype(f.kv_cache_dtype, f.cache_type_k, f.cache_type_v);
  if (!kv_dtype) return kv_dtype.error();
  auto speculative = parse_speculative_config(f.speculative_config);
  if (!speculative) return speculative.error();
  const int64_t ctx = std::min<int64_t>(f.ctx_size, model.config().context_length);
  return SingleRequestEngine::engine_config(model, ctx, *speculative, std::max(1, f.beam_width), *kv_dtype);
}

int generate_on(const GenerateFlags& f, const ParallelRun& run) {
  const auto kv_dtype = resolve_kv_cache_dtype(f.kv_cache_dtype, f.cache_type_k, f.cache_type_v);
  if (!kv_dtype) {
    std::fprintf(stderr, "error: %s\n", kv_dtype.error().message.c_str());
    return 1;
  }
  const auto numerics = resolve_numerics(f.numerics);
  if (!numerics) {
    std::fprintf(stderr, "error: %s\n", numerics.error().message.c_str());
    return 1;
  }
  auto model = load_model_part(run, f.model, f.json, f.threads, kernels::native_ggml_flavour(), *numerics);
  if (!model) return 1;
  if (!model->can_generate()) {
    std::fprintf(stderr, "error: %s\n", unsupported_architecture_message(model->config().architecture).c_str());
    return 1;
  }
  const Tokenizer& tok = model->tokenizer();
  std::vector<int32_t> prompt = tok.encode(f.prompt, /*add_special=*/true, !f.no_special);
  if (prompt.empty()) {
    std::fprintf(stderr, "error: the prompt is empty\n");
    return 1;
  }
  const std::optional<EarlyStopping> early_stopping = parse_early_stopping(f.early_stopping);
  if (!early_stopping) {
    std::fprintf(stderr, "error: --early-stopping must be true, false or never\n");
    return 1;
  }
  if (f.n_beams > std::max(1, f.beam_width)) {
    std::fprintf(stderr, "error: --n (%d) exceeds the beams searched (--beam-width %d)\n", f.n_beams, f.beam_width);
    return 1;
  }
  auto config = generate_engine_config(f, *model);
  if (config) run.attach(*config);
  auto engine = config ? SingleRequestEngine::create(*model, *config) : Result<SingleRequestEngine>(config.error());
  if (!engine) {
    std::fprintf(stderr, "error: %s\n", engine.error().message.c_str());
    return 1;
  }
  GenerationParams params;
  params.prompt_token_ids = prompt;
  // -n 0 runs the prompt only (timing it): the engine samples one token, which
  // is dropped.
  params.max_tokens = std::max<int64_t>(f.n_predict, 1);
  params.sampling = f.sampling.params();
  params.ignore_eos = f.ignore_eos;
  if (f.beam_width > 0) params.beam_search = BeamSearchParams{f.beam_width, f.length_penalty, *early_stopping};

  if (!f.json) std::fwrite(f.prompt.data(), 1, f.prompt.size(), stdout);
  auto out = engine->run(std::move(params), [&](const RequestOutput& delta) {
    if (f.json || f.n_predict == 0) return;
    std::fwrite(delta.text.data(), 1, delta.text.size(), stdout);
    std::fflush(stdout);
  });
  if (!out) {
    std::fprintf(stderr, "\nerror: %s\n", out.error().message.c_str());
    return 1;
  }
  if (f.n_predict == 0) {
    out->token_ids.clear();
    out->text.clear();
  }
  const RequestMetrics& m = out->metrics;
  const double prompt_seconds = m.first_token_time - m.first_scheduled_time;
  const double decode_seconds = m.last_token_time - m.first_token_time;
  const int64_t generated = static_cast<int64_t>(out->token_ids.size());
  if (f.json) {
    nlohmann::json j;
    j["prompt_ids"] = prompt;
    j["ids"] = out->token_ids;
    j["text"] = out->text;
    j["finish_reason"] = out->finish_reason();
    if (f.beam_width > 0) {
      j["beams"] = nlohmann::json::array();
      for (size_t k = 0; k < out->beams.size() && k < static_cast<size_t>(f.n_beams); ++k)
        j["beams"].push_back({{"ids", out->beams[k].token_ids},
                              {"text", out->beams[k].text},
                              {"cumulative_logprob", out->beams[k].cumulative_logprob},
                              {"finish_reason", finish_reason(out->beams[k].status)}});
    }
    j["timings"] = {{"prompt_tokens", m.num_prompt_tokens},
                    {"prompt_seconds", prompt_seconds},
                    {"generated_tokens", generated},
                    {"decode_seconds", decode_seconds}};
    if (m.speculative.drafts > 0)
      j["speculative"] = {{"verifications", m.speculative.drafts},
                          {"draft_tokens", m.speculative.draft_tokens},
                          {"accepted_tokens", m.speculative.accepted_tokens},
                          {"mean_acceptance_length", m.speculative.mean_acceptance_length()}};
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::fprintf(stdout, "\n");
    // Beam search: the best beam was printed above; the next ones follow.
    for (size_t k = 1; k < out->beams.size() && k < static_cast<size_t>(f.n_beams); ++k) {
      const BeamOutput& b = out->beams[k];
      std::fprintf(stdout, "--- beam %zu (cumulative logprob %.4f, %s)\n", k + 1, b.cumulative_logprob,
                   finish_reason(b.status));
      std::fwrite(f.prompt.data(), 1, f.prompt.size(), stdout);
      std::fwrite(b.text.data(), 1, b.text.size(), stdout);
      std::fprintf(stdout, "\n");
    }
    std::fprintf(stderr, "\nprompt: %lld tokens in %.3f s (%.1f tok/s); generated: %lld tokens in %.3f s (%.1f tok/s)\n",
                 static_cast<long long>(m.num_prompt_tokens), prompt_seconds,
                 m.num_prompt_tokens / std::max(prompt_seconds, 1e-9), static_cast<long long>(generated),
                 decode_seconds, generated > 1 ? (generated - 1) / std::max(decode_seconds, 1e-9) : 0.0);
    if (m.speculative.drafts > 0)
      std::fprintf(stderr, "speculation: %lld of %lld drafts accepted in %lld verifications (mean acceptance length %.2f)\n",
                   static_cast<long long>(m.speculative.accepted_tokens),
                   static_cast<long long>(m.speculative.draft_tokens), static_cast<long long>(m.speculative.drafts),
                   m.speculative.mean_acceptance_length());
  }
  return 0;
}

int run_generate(const GenerateFlags& f) {
  const auto numerics = resolve_numerics(f.numerics);
  return run_command_on_ranks(
      f.parallel, f.model, f.threads, numerics ? std::optional(*numerics) : std::nullopt,
      [&](const Model& model) -> std::optional<EngineConfig> {
        auto config = generate_engine_config(f, model);
        return config ? std::optional(*config) : std::nullopt;
      },
      [&](const ParallelRun& run) { return generate_on(f, run); });
}
}  // namespace

void register_generate(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<GenerateFlags>();
  flags->model = default_model_path();
  CLI::App* sub = app.add_subcommand("generate", "Complete a text prompt");
  sub->add_option("-m,--model", flags->model, "GGUF model file")->capture_default_str();
  sub->add_option("-p,--prompt", flags->prompt, "Prompt text")->required();
  sub->add_option("-n,--n-predict,--max-tokens", flags->n_predict, "Tokens to generate")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("-c,--ctx-size,--max-model-len", flags->ctx_size, "Context length")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("-t,--threads", flags->threads, "Threads")->capture_default_str()->check(CLI::Range(1, 1024));
  add_speculative_option(*sub, flags->speculative_config);
  add_kv_cache_dtype_options(*sub, flags->kv_cache_dtype, flags->cache_type_k, flags->cache_type_v);
  add_numerics_option(*sub, flags->numerics);
  sub->add_flag("--json", flags->json, "Print prompt ids, generated ids and text as JSON");
  sub->add_flag("--ignore-eos", flags->ignore_eos, "Do not stop at end-of-generation tokens");
  sub->add_flag("--no-special", flags->no_special, "Tokenize special-token text as plain text");
  sub->add_option("--beam-width", flags->beam_width,
                  "Beam search with this many beams (sampling flags are then unused); 0 = off")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  sub->add_option("--n", flags->n_beams, "With --beam-width: print this many best beams")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  sub->add_option("--length-penalty", flags->length_penalty,
                  "With --beam-width: rank beams by logprob / length^this (> 0 favours longer ones)")
      ->capture_default_str();
  sub->add_option("--early-stopping", flags->early_stopping,
                  "With --beam-width: stop when the beams found cannot be beaten: true, false (heuristic) or never")
      ->capture_default_str();
  flags->sampling.add_to(*sub);
  flags->parallel.add_to(*sub);
  sub->callback([flags, &exit_code] { exit_code = run_generate(*flags); });
}

}  // namespace inferd::cli
