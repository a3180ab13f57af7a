// `inferd generate`: complete a raw text prompt, streaming the text, or print
// token ids and text as JSON for tools.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/sequence_generator.h"

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
};

int run_generate(const GenerateFlags& f) {
  auto model = load_model_or_report(f.model, f.json);
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
  const int64_t ctx = std::min<int64_t>(f.ctx_size, model->config().context_length);
  ThreadPool pool(f.threads);
  SequenceGenerator gen(*model, pool, ctx);
  GenerationOptions options;
  options.max_tokens = f.n_predict;
  options.sampling = f.sampling.params();
  options.stop_at_end_of_generation = !f.ignore_eos;

  IncrementalDecoder decoder(tok);
  std::string text;
  auto on_token = [&](int32_t id) {
    std::string piece = decoder.push(id);
    text += piece;
    if (!f.json) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  if (!f.json) std::fwrite(f.prompt.data(), 1, f.prompt.size(), stdout);
  auto out = gen.generate(prompt, options, on_token);
  if (!out) {
    std::fprintf(stderr, "\nerror: %s\n", out.error().message.c_str());
    return 1;
  }
  std::string rest = decoder.flush();
  text += rest;
  const GenerationStats& st = gen.stats();
  if (f.json) {
    nlohmann::json j;
    j["prompt_ids"] = prompt;
    j["ids"] = *out;
    j["text"] = text;
    j["timings"] = {{"prompt_tokens", st.prompt_tokens},
                    {"prompt_seconds", st.prefill_seconds},
                    {"generated_tokens", st.generated_tokens},
                    {"decode_seconds", st.decode_seconds}};
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fprintf(stdout, "\n");
    std::fprintf(stderr, "\nprompt: %lld tokens in %.3f s (%.1f tok/s); generated: %lld tokens in %.3f s (%.1f tok/s)\n",
                 static_cast<long long>(st.prompt_tokens), st.prefill_seconds,
                 st.prompt_tokens / std::max(st.prefill_seconds, 1e-9),
                 static_cast<long long>(st.generated_tokens), st.decode_seconds,
                 st.generated_tokens > 1 ? (st.generated_tokens - 1) / std::max(st.decode_seconds, 1e-9) : 0.0);
  }
  return 0;
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
  sub->add_flag("--json", flags->json, "Print prompt ids, generated ids and text as JSON");
  sub->add_flag("--ignore-eos", flags->ignore_eos, "Do not stop at end-of-generation tokens");
  sub->add_flag("--no-special", flags->no_special, "Tokenize special-token text as plain text");
  flags->sampling.add_to(*sub);
  sub->callback([flags, &exit_code] { exit_code = run_generate(*flags); });
}

}  // namespace inferd::cli
