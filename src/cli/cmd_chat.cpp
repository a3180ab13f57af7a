// `inferd chat`: an interactive conversation on the terminal. Each turn is
// rendered through the model's chat template; the KV cache of the earlier turns
// is reused, and the reply streams as it is generated.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "chat/chat_template.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "chat/chat_prompt.h"

namespace inferd::cli {

namespace {
struct ChatFlags {
  std::string model;
  std::string system;
  std::string chat_template_file;
  int64_t n_predict = 512;
  int64_t ctx_size = 4096;
  int threads = default_threads();
  SamplingFlags sampling;
  std::string speculative_config;  // vLLM's JSON; empty: off
  std::string kv_cache_dtype = "auto", cache_type_k, cache_type_v;  // resolve_kv_cache_dtype
  std::string numerics = kernels::numerics_name(kernels::kDefaultNumerics);  // resolve_numerics
};

// The chat template: --chat-template FILE, else the model's own.
int run_chat(const ChatFlags& f) {
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
  auto model = load_model_or_report(f.model, false, f.threads, kernels::native_ggml_flavour(), *numerics);
  if (!model) return 1;
  if (!model->can_generate()) {
    std::fprintf(stderr, "error: %s\n", unsupported_architecture_message(model->config().architecture).c_str());
    return 1;
  }
  auto selected = select_chat_template(model->chat_template(), f.chat_template_file);
  if (!selected) {
    std::fprintf(stderr, "error: %s\n", selected.error().message.c_str());
    return 1;
  }
  ChatTemplate tmpl = std::move(selected.value());
  const Tokenizer& tok = model->tokenizer();

  const int64_t ctx = std::min<int64_t>(f.ctx_size, model->config().context_length);
  // Earlier turns are prefix-cache hits of the engine, not recomputed.
  auto speculative = parse_speculative_config(f.speculative_config);
  auto engine = speculative ? SingleRequestEngine::create(*model, ctx, *speculative, 1, *kv_dtype)
                            : Result<SingleRequestEngine>(speculative.error());
  if (!engine) {
    std::fprintf(stderr, "error: %s\n", engine.error().message.c_str());
    return 1;
  }

  std::vector<ChatMessage> messages;
  if (!f.system.empty()) messages.push_back({"system", f.system});
  const bool interactive = isatty(STDIN_FILENO);
  if (interactive)
    std::fprintf(stderr, "Chatting with %s. Type /reset to start over, /exit or Ctrl-D to quit.\n",
                 model->config().name.empty() ? "the model" : model->config().name.c_str());
  std::string line;
  for (;;) {
    if (interactive) {
      std::fprintf(stdout, "\n> ");
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages.resize(f.system.empty() ? 0 : 1);
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({"user", line});
    // As the server does: special-token text typed into a message is text,
    // only the template's own markers are control tokens.
    auto chat_prompt = render_chat_prompt(tmpl, tok, messages, {});
    if (!chat_prompt) {
      std::fprintf(stderr, "error: chat template: %s\n", chat_prompt.error().message.c_str());
      return 1;
    }
    std::vector<int32_t> prompt = tokenize_chat_prompt(tok, *chat_prompt);
    GenerationParams params;
    params.prompt_token_ids = prompt;
    params.sampling = f.sampling.params();
    params.max_tokens = std::min<int64_t>(f.n_predict, ctx - static_cast<int64_t>(prompt.size()));
    if (params.max_tokens <= 0) {
      std::fprintf(stderr, "error: the conversation no longer fits the context of %lld tokens; /reset to start over\n",
                   static_cast<long long>(ctx));
      messages.pop_back();
      continue;
    }
    auto out = engine->run(std::move(params), [&](const RequestOutput& delta) {
      std::fwrite(delta.text.data(), 1, delta.text.size(), stdout);
      std::fflush(stdout);
    });
    if (!out) {
      std::fprintf(stderr, "\nerror: %s\n", out.error().message.c_str());
      messages.pop_back();
      continue;
    }
    std::fprintf(stdout, "\n");
    std::fflush(stdout);
    const std::string& reply = out->text;
    messages.push_back({"assistant", reply});
  }
  return 0;
}
}  // namespace

void register_chat(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<ChatFlags>();
  flags->model = default_model_path();
  CLI::App* sub = app.add_subcommand("chat", "Chat with a model on the terminal");
  sub->add_option("-m,--model", flags->model, "GGUF model file")->capture_default_str();
  sub->add_option("--system", flags->system, "System prompt");
  sub->add_option("--chat-template", flags->chat_template_file, "Jinja chat template file");
  sub->add_option("-n,--n-predict,--max-tokens", flags->n_predict, "Max tokens per reply")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("-c,--ctx-size,--max-model-len", flags->ctx_size, "Context length")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  sub->add_option("-t,--threads", flags->threads, "Threads")->capture_default_str()->check(CLI::Range(1, 1024));
  add_speculative_option(*sub, flags->speculative_config);
  add_kv_cache_dtype_options(*sub, flags->kv_cache_dtype, flags->cache_type_k, flags->cache_type_v);
  add_numerics_option(*sub, flags->numerics);
  flags->sampling.add_to(*sub);
  sub->callback([flags, &exit_code] { exit_code = run_chat(*flags); });
}

}  // namespace inferd::cli
