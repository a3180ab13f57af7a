#include "server/serving_core.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "server/disaggregation.h"
#include "server/tool_calling.h"

namespace inferd::server {

using json = nlohmann::json;
namespace net = boost::asio;

ApiError method_not_allowed(std::string message) {
  return ApiError{405, std::move(message), "invalid_request_error", {}, "method_not_allowed"};
}
ApiError model_loading() { return ApiError{503, "the model is loading", "server_error", {}, "model_loading"}; }
ApiError server_error(std::string message) { return ApiError{500, std::move(message), "server_error", {}, {}}; }
Headers retry_after() { return {{"Retry-After", "1"}}; }
ApiError shutting_down_error() {
  return ApiError{503, "the server is shutting down", "server_error", {}, "server_shutting_down"};
}

namespace {

ApiError overloaded(int64_t waiting, int64_t bound) {
  return ApiError{503,
                  "The server is overloaded: " + std::to_string(waiting) +
                      " requests are waiting (--max-queued-requests " + std::to_string(bound) + "). Retry later.",
                  "server_error", {}, "server_overloaded"};
}

double ms(double seconds) { return seconds * 1000.0; }

// Whole: the calls of the choice's output and the content around them;
// content null (empty) when only whitespace remains beside the calls.
void finish_tool_calls(Choice& c, const std::string& text, ToolCallFormat format,
                       const std::vector<std::string>& names, const std::vector<ToolSignature>& signatures) {
  ParsedAssistantMessage m = parse_tool_calls(format, text, names, signatures);
  if (m.tool_calls.empty()) {
    c.content = text;
    return;
  }
  c.content = std::move(m.content);
  for (ParsedToolCall& call : m.tool_calls) {
    json fn = {{"name", std::move(call.name)}, {"arguments", std::move(call.arguments)}};
    c.tool_calls.push_back(json{{"id", new_tool_call_id()}, {"type", "function"}, {"function", std::move(fn)}});
  }
  if (c.finish_reason == "stop" || c.finish_reason == "length") c.finish_reason = "tool_calls";
}

}  // namespace

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string random_hex(size_t n) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* digits = "0123456789abcdef";
  std::string s(n, '0');
  for (char& c : s) c = digits[rng() % 16];
  return s;
}

std::variant<json, ApiError> parse_object(const std::string& text) {
  try {
    json body = json::parse(text);
    if (!body.is_object()) return bad_request("the request body must be a JSON object");
    return body;
  } catch (const json::parse_error& e) {
    return bad_request(std::string("the request body is not valid JSON: ") + e.what());
  } catch (const json::out_of_range&) {
    // A number past the range of a double (1e999): the parser's out_of_range.406.
    return bad_request("the request body holds a number outside the range of a double");
  }
}

std::vector<ToolCallDelta> parse_streamed(Choice& c, const RequestOutput& out) {
  std::vector<ToolCallDelta> deltas = c.tool_parser->feed(out.text);
  if (out.finished)
    for (ToolCallDelta& d : c.tool_parser->finish()) deltas.push_back(std::move(d));
  return deltas;
}

void finish_message(Choice& c, const PreparedGeneration& pg) {
  if (c.harmony_parser) {
    HarmonyMessage m = parse_harmony(c.text, pg.harmony_calls);
    c.reasoning = std::move(m.reasoning);
    c.content = std::move(m.content);
    for (ParsedToolCall& call : m.tool_calls) {
      json fn = {{"name", std::move(call.name)}, {"arguments", std::move(call.arguments)}};
      c.tool_calls.push_back(json{{"id", new_tool_call_id()}, {"type", "function"}, {"function", std::move(fn)}});
    }
    if (!c.tool_calls.empty() && (c.finish_reason == "stop" || c.finish_reason == "length"))
      c.finish_reason = "tool_calls";
    return;
  }
  std::string text = c.text;
  if (c.reasoning_parser) {
    ReasoningDelta d = parse_reasoning(pg.reasoning->starts_inside, c.text);
    c.reasoning = std::move(d.reasoning);
    text = std::move(d.content);
    c.content = text;
  }
  if (c.tool_parser) finish_tool_calls(c, text, *pg.tool_format, pg.tool_names, pg.tool_signatures);
}

OutputParts split_output(Choice& c, const RequestOutput& out) {
  OutputParts parts;
  if (c.harmony_parser) {
    std::vector<HarmonyDelta> deltas = c.harmony_parser->feed(out.text);
    if (out.finished)
      for (HarmonyDelta& d : c.harmony_parser->finish()) deltas.push_back(std::move(d));
    for (HarmonyDelta& d : deltas) {
      parts.reasoning += d.reasoning;
      if (!d.content.empty() || d.call) parts.answer.push_back({std::move(d.content), std::move(d.call), d.call_index});
    }
    return parts;
  }
  RequestOutput answer;  // the text after the thinking (the tool parser reads text and finished only)
  answer.finished = out.finished;
  answer.text = out.text;
  if (c.reasoning_parser) {
    ReasoningDelta d = c.reasoning_parser->feed(out.text);
    if (out.finished) {
      ReasoningDelta tail = c.reasoning_parser->finish();
      d.reasoning += tail.reasoning;
      d.content += tail.content;
    }
    parts.reasoning = std::move(d.reasoning);
    answer.text = std::move(d.content);
  }
  if (c.tool_parser) {
    parts.answer = parse_streamed(c, answer);
  } else if (!answer.text.empty()) {
    ToolCallDelta text;
    text.content = std::move(answer.text);
    parts.answer.push_back(std::move(text));
  }
  return parts;
}

// Beam search: each engine request (one per prompt) becomes its beams, one
// choice each, best first, at the indexes the request holds for its prompt.
std::vector<Choice> beam_choices(const std::vector<Choice>& requests) {
  std::vector<Choice> out;
  for (const Choice& c : requests) {
    for (size_t k = 0; k < c.beams.size(); ++k) {
      Choice b;
      b.engine_id = c.engine_id;
      b.index = c.index + static_cast<int32_t>(k);
      b.prompt_index = c.prompt_index;
      b.text = c.beams[k].text;
      b.num_tokens = static_cast<int64_t>(c.beams[k].token_ids.size());
      b.finished = true;
      b.finish_reason = finish_reason(c.beams[k].status);
      b.metrics = c.metrics;
      b.tool_parser = c.tool_parser;  // finish_message parses each beam's whole text
      b.reasoning_parser = c.reasoning_parser;
      b.harmony_parser = c.harmony_parser;
      out.push_back(std::move(b));
    }
  }
  return out;
}

ServingCore::ServingCore(ServerOptions options)
    : options_(std::move(options)), metrics_(options_.served_model_name), workers_(options_.worker_threads) {}

void ServingCore::begin_shutdown() {
  std::lock_guard<std::mutex> lock(admit_mu_);
  shutting_down_ = true;
  stopping_.store(true);
}

void ServingCore::attach(Model& model, Engine& engine, std::optional<ChatTemplate> tmpl) {
  model_ = &model;
  engine_ = &engine;
  template_ = std::move(tmpl);
  tool_format_ = options_.tool_call_parser;
  if (!tool_format_ && template_) tool_format_ = detect_tool_call_format(template_->source());
  if (tool_format_) tool_marker_token_ = tool_call_marker_token(*tool_format_, model.tokenizer());
  reasoning_ = options_.reasoning_parser;
  const bool template_harmony = template_ && template_uses_harmony(template_->source());
  if (reasoning_ == ReasoningParser::kAuto)
    reasoning_ = template_harmony                                       ? ReasoningParser::kHarmony
                 : template_ && template_thinks(template_->source()) ? ReasoningParser::kQwen3
                                                                      : ReasoningParser::kNone;
  // gpt-oss's output is harmony whichever flag says so: its channels are
  // split by one parser (chat/harmony.h).
  harmony_ = reasoning_ == ReasoningParser::kHarmony || tool_format_ == ToolCallFormat::kHarmony;
  if (reasoning_ != ReasoningParser::kNone)
    spdlog::info("reasoning: {} parser{}", reasoning_parser_name(reasoning_),
                 options_.reasoning_parser != ReasoningParser::kAuto ? " (--reasoning-parser)"
                 : template_harmony                                  ? " (the chat template writes <|channel|>)"
                                                                     : " (the chat template writes </think>)");
  if (template_ && template_supports_tools(template_->source()))
    spdlog::info("tool calling: {} format{}", tool_format_ ? tool_call_format_name(*tool_format_) : "no known",
                 options_.tool_call_parser ? " (--tool-call-parser)" : " (from the chat template)");
  // Structured outputs: the vocabulary as llguidance sees it, built once.
  if (auto gt = GrammarTokenizer::create(model.tokenizer())) {
    grammars_ = std::make_unique<GrammarCompiler>(std::move(*gt));
  } else {
    grammar_error_ = gt.error().message;
    spdlog::warn("structured outputs are unavailable: {}", grammar_error_);
  }
  ready_.store(true);
}

std::string ServingCore::metrics_text() const {
  const EngineStats stats = engine_->stats();
  const int64_t not_yet_scheduled = std::max<int64_t>(
      0, unfinished_.load() - stats.scheduler.num_running_requests - stats.scheduler.num_waiting_requests);
  const std::optional<GrammarCompilerStats> grammar_stats =
      grammars_ ? std::optional(grammars_->stats()) : std::nullopt;
  return metrics_.render(stats, not_yet_scheduled, grammar_stats ? &*grammar_stats : nullptr);
}

std::variant<ChatPrompt, ApiError> ServingCore::render_chat(const std::vector<ChatMessage>& messages,
                                                             bool add_generation_prompt,
                                                             const std::string& kwargs,
                                                             const std::string& tools_json) const {
  if (!template_)
    return bad_request("this model has no chat template; start the server with --chat-template FILE, or use "
                       "/v1/completions");
  ChatPromptOptions copts;
  copts.add_generation_prompt = add_generation_prompt;
  copts.extra_context_json = kwargs;
  copts.tools_json = tools_json;
  copts.special_tokens_in_content = options_.special_tokens_in_chat_content;
  Result<ChatPrompt> prompt = render_chat_prompt(*template_, model_->tokenizer(), messages, copts);
  if (!prompt) return bad_request(prompt.error().message, "messages");
  return std::move(prompt.value());
}

std::optional<ApiError> ServingCore::surely_too_long(std::string_view prompt, std::optional<int64_t> max_tokens) const {
  const int64_t max_model_len = engine_->config().max_model_len;
  const auto at_least = static_cast<int64_t>(model_->tokenizer().min_tokens(prompt));
  if (at_least >= max_model_len || (max_tokens && at_least + *max_tokens > max_model_len))
    return context_length_error_by_bytes(max_model_len, at_least, prompt.size(), max_tokens);
  return std::nullopt;
}

std::optional<ApiError> ServingCore::check_request(GenerationRequest& req) const {
  if (auto e = check_model(req.model)) return e;
  return check_kv_transfer(options_.kv_transfer, req.kv_transfer);
}

std::optional<ApiError> ServingCore::prepare_chat_prompt(PreparedGeneration& pg) const {
  const GenerationRequest& req = pg.req;
  const Tokenizer& tok = model_->tokenizer();
  pg.harmony = harmony_;
  if (pg.harmony) pg.render_special = true;  // the parser reads the channels' markers (the client never sees them)
  if (req.tools)
    if (auto e = prepare_tools(pg)) return *e;
  auto prompt = render_chat(req.messages, req.add_generation_prompt, req.chat_template_kwargs,
                            req.tools ? req.tools->tools_json : std::string());
  if (auto* e = std::get_if<ApiError>(&prompt)) return *e;
  const ChatPrompt& cp = std::get<ChatPrompt>(prompt);
  if (auto e = surely_too_long(cp.text, req.max_tokens)) return *e;
  pg.prompts.push_back(tokenize_chat_prompt(tok, cp));
  // Reasoning: the request's format, or the server's parser; the rendered
  // prompt tells whether the output starts inside the thinking (the
  // template opened <think>) or has none to split (it closed it, as Qwen3's
  // enable_thinking=false does).
  ReasoningParser rp = req.reasoning_format.value_or(reasoning_);
  if (rp == ReasoningParser::kAuto) rp = reasoning_ != ReasoningParser::kNone ? reasoning_ : ReasoningParser::kQwen3;
  const PromptThinking pt = prompt_thinking(cp.text);
  if (!pg.harmony && rp != ReasoningParser::kNone && rp != ReasoningParser::kHarmony && pt != PromptThinking::kClosed) {
    ReasoningSpec spec;
    spec.start = std::string(kThinkStart);
    spec.end = std::string(kThinkEnd);
    spec.starts_inside = rp == ReasoningParser::kDeepSeekR1 || pt == PromptThinking::kOpen;
    pg.reasoning = std::move(spec);
  }
  if (options_.log_prompts) pg.prompt_texts.push_back(tok.decode(pg.prompts.back(), true));
  return std::nullopt;
}

std::optional<ApiError> ServingCore::finish_preparation(PreparedGeneration& pg, bool fill_context) const {
  GenerationRequest& req = pg.req;
  // ---- the structured-output constraint, compiled (or found in the cache) ----
  if (req.structured) {
    if (!grammars_) return bad_request("structured outputs are unavailable: " + grammar_error_, req.structured->param);
    GrammarKind kind = req.structured->kind;
    std::string text = req.structured->text;
    if (pg.harmony) {
      // The analysis messages go free; the constraint applies to the final message.
      auto lark = harmony_final_grammar(kind, text);
      if (!lark) return bad_request(lark.error().message, req.structured->param);
      kind = GrammarKind::kLark;
      text = std::move(*lark);
    }
    auto compiled = grammars_->compile(kind, text);
    if (!compiled) return bad_request(compiled.error().message, req.structured->param);
    pg.grammar = std::move(*compiled);
  }

  // max_tokens 0 (echo): the engine generates its least, one token, which the
  // response leaves out (as vLLM does).
  if (req.max_tokens == 0) {
    pg.score_only = true;
    req.max_tokens = 1;
  }

  // ---- the context length ----
  const int64_t max_model_len = engine_->config().max_model_len;
  for (const std::vector<int32_t>& prompt : pg.prompts) {
    const int64_t n_prompt = static_cast<int64_t>(prompt.size());
    if (n_prompt >= max_model_len || (req.max_tokens && n_prompt + *req.max_tokens > max_model_len))
      return context_length_error(max_model_len, n_prompt, req.max_tokens);
    const int64_t room = max_model_len - n_prompt;
    pg.max_tokens.push_back(req.max_tokens ? *req.max_tokens
                            : fill_context ? room
                                           : std::min(options_.default_max_tokens, room));
  }
  return std::nullopt;
}

std::optional<ApiError> ServingCore::prepare_tools(PreparedGeneration& pg) const {
  const ToolsRequest& tools = *pg.req.tools;
  if (!template_)
    return bad_request("this model has no chat template; start the server with --chat-template FILE", "tools");
  if (!template_supports_tools(template_->source()))
    return bad_request("this model's chat template does not support tools (it never reads the variable 'tools'); "
                       "start the server with --chat-template FILE of a template that does",
                       "tools");
  if (tools.choice == ToolChoice::kNone) return std::nullopt;  // rendered, not parsed (as vLLM)
  if (pg.harmony) pg.harmony_calls = true;
  const std::optional<ToolCallFormat> format = pg.harmony ? std::optional(ToolCallFormat::kHarmony) : tool_format_;
  if (!format)
    return bad_request("the tool-call format of this model's chat template is unknown; start the server with "
                       "--tool-call-parser hermes|llama3_json|mistral|qwen3_coder|openai",
                       "tools");
  pg.tool_format = format;
  // Mistral's calls open with the control token [TOOL_CALLS], which the
  // parser must see in the text (vLLM's mistral parser turns
  // skip_special_tokens off likewise).
  if (*format == ToolCallFormat::kMistral) pg.render_special = true;
  for (const ToolSpec& spec : tools.tools) {
    pg.tool_names.push_back(spec.name);
    pg.tool_signatures.push_back({spec.name, spec.parameters});
  }
  if (tools.choice == ToolChoice::kAuto) return std::nullopt;
  // "required" or a named function: a grammar admits only such calls (a
  // named function is called once, as vLLM does; "required" calls one or,
  // with parallel_tool_calls, several).
  const bool named = tools.choice == ToolChoice::kNamed;
  auto lark = forced_tool_call_grammar(*format, tools.tools, named ? tools.named : std::string(),
                                       !named && tools.parallel, tool_marker_token_);
  if (!lark) return bad_request(lark.error().message, "tool_choice");
  if (!grammars_)
    return bad_request(std::string(named ? "a named tool_choice" : "tool_choice 'required'") +
                           " is unavailable: " + grammar_error_,
                       "tool_choice");
  auto compiled = grammars_->compile(GrammarKind::kLark, *lark);
  if (!compiled) return bad_request("the tools' parameter schemas cannot be enforced: " + compiled.error().message, "tools");
  pg.grammar = std::move(*compiled);
  return std::nullopt;
}

std::optional<ApiError> ServingCore::admit(PreparedGeneration& pg, const std::string& api_id,
                                            const std::function<void()>& wake, std::vector<Choice>& choices) {
  const GenerationRequest& req = pg.req;
  // Checked and added under one lock: no request enters the engine once
  // begin_shutdown() has returned (the engine may be stopped by then), and
  // concurrent requests cannot overshoot the queue bound together.
  std::lock_guard<std::mutex> lock(admit_mu_);
  if (auto refused = admission_refusal(static_cast<int64_t>(pg.prompts.size()) * req.n)) return refused;

  // Beam search: one engine request per prompt, whose n beams are its choices.
  const int32_t requests_per_prompt = req.use_beam_search ? 1 : req.n;
  for (size_t p = 0; p < pg.prompts.size(); ++p) {
    for (int32_t k = 0; k < requests_per_prompt; ++k) {
      GenerationParams gp;
      const int32_t index = static_cast<int32_t>(p) * req.n + k;
      if (req.use_beam_search) gp.beam_search = BeamSearchParams{req.n, req.length_penalty, req.early_stopping};
      gp.request_id = api_id + "-" + std::to_string(index);
      gp.prompt_token_ids = pg.prompts[p];
      gp.sampling = req.sampling;
      gp.sampling.seed = choice_seed(gp.sampling.seed, k);
      gp.max_tokens = pg.max_tokens[p];
      gp.stop_token_ids = req.stop_token_ids;
      gp.stop = req.stop;
      gp.ignore_eos = req.ignore_eos;
      gp.logprobs = req.logprobs;
      // echo's prompt tokens are scored with as many alternatives as the completion's.
      gp.prompt_logprobs = std::max(req.prompt_logprobs, req.echo ? req.logprobs : -1);
      gp.cache_salt = req.cache_salt;
      gp.grammar = pg.grammar;  // each choice gets its own matcher
      gp.reasoning = pg.reasoning;  // the grammar applies after the thinking
      gp.render_special = pg.render_special || !req.skip_special_tokens;
      // Disaggregation: one choice per prompt holds (a producer's) or pulls
      // (a consumer's, a beam search's too) the prompt's blocks; the others
      // wait for its pull and share its prefix. A beam search holds none
      // (its beams run as forks): the router prefills it as a plain request.
      const bool first_of_prompt = k == 0;
      const KVTransferParams* kvt = req.kv_transfer ? &*req.kv_transfer : nullptr;
      gp.kv_hold_for_remote_decode = kvt && kvt->do_remote_decode && first_of_prompt && !req.use_beam_search;
      bool registered = false;
      const std::string pull_id = Engine::kv_pull_id(gp.request_id, req.use_beam_search);
      if (kvt && kvt->do_remote_prefill) {
        std::optional<kvtransfer::RemotePrompt> remote = first_of_prompt ? remote_prompt(*kvt, p) : std::nullopt;
        if (remote && engine_->kv_transfer()) {
          engine_->kv_transfer()->register_pull(pull_id, std::move(*remote));
          registered = true;
        } else if (k == 0) {
          metrics_.count_kv_recomputed_prompts(1);  // nothing to pull: computed here
        }
      }
      if (options_.log_prompts) {
        std::lock_guard<std::mutex> log_lock(log_mu_);
        prompt_log_[gp.request_id] = pg.prompt_texts[p].substr(0, options_.max_log_len);
      }
      const std::string engine_id = gp.request_id;
      auto handle = engine_->add_request(std::move(gp));
      if (!handle && registered) engine_->kv_transfer()->forget(pull_id);
      if (!handle) {
        if (options_.log_prompts) {
          std::lock_guard<std::mutex> log_lock(log_mu_);
          prompt_log_.erase(engine_id);
        }
        return bad_request(handle.error().message);  // the caller aborts the choices added so far
      }
      ++unfinished_;
      Choice c;
      c.engine_id = handle->request_id;
      c.stream = handle->stream;
      c.index = index;
      c.prompt_index = p;
      if (req.echo) c.echo = pg.echo_texts[p];
      c.prompt_first_token = pg.prompts[p][0];
      if (pg.harmony) c.harmony_parser = std::make_shared<HarmonyStreamParser>(pg.harmony_calls);
      else if (pg.tool_format)
        c.tool_parser = std::make_shared<ToolCallStreamParser>(*pg.tool_format, pg.tool_names, pg.tool_signatures);
      if (pg.reasoning) c.reasoning_parser = std::make_shared<ReasoningStreamParser>(pg.reasoning->starts_inside);
      c.stream->set_listener(wake);
      track(c);
      choices.push_back(std::move(c));
    }
  }
  return std::nullopt;
}

std::optional<ApiError> ServingCore::admission_refusal(int64_t new_requests) const {
  if (std::optional<Failure> f = failure()) return ApiError{503, f->message, "server_error", {}, "engine_dead"};
  if (shutting_down_) return shutting_down_error();
  const int64_t waiting = unfinished_.load() - engine_->stats().scheduler.num_running_requests;
  if (waiting + new_requests > options_.max_queued_requests) return overloaded(waiting, options_.max_queued_requests);
  return std::nullopt;
}

namespace {

// Whatever way a handler ends (done, client gone, coroutine destroyed), its
// unfinished choices are aborted so their KV blocks are freed.
struct AbortUnfinished {
  Engine& engine;
  std::vector<Choice>& choices;
  ~AbortUnfinished() {
    for (const Choice& c : choices)
      if (!c.finished) engine.abort(c.engine_id);
  }
};

}  // namespace

std::optional<ApiError> ServingCore::check_model(const std::string& model) const {
  if (!model.empty() && model != options_.served_model_name)
    return not_found("The model `" + model + "` does not exist.", "model_not_found");
  return std::nullopt;
}

net::awaitable<std::optional<std::vector<std::vector<float>>>> ServingCore::run_pooled(
    Exchange& ex, const std::vector<std::vector<int32_t>>& inputs, const std::string& api_id) {
  std::vector<Choice> choices;
  AbortUnfinished abort_unfinished{*engine_, choices};
  const std::function<void()> wake = ex.waker();
  std::optional<ApiError> refused;
  {
    std::lock_guard<std::mutex> lock(admit_mu_);
    refused = admission_refusal(static_cast<int64_t>(inputs.size()));
    for (size_t i = 0; i < inputs.size() && !refused; ++i) {
      GenerationParams gp;
      gp.request_id = api_id + "-" + std::to_string(i);
      gp.prompt_token_ids = inputs[i];
      gp.pooled = true;
      auto handle = engine_->add_request(std::move(gp));
      if (!handle) {
        refused = bad_request("input " + std::to_string(i) + ": " + handle.error().message);
        break;
      }
      ++unfinished_;
      Choice c;
      c.engine_id = handle->request_id;
      c.stream = handle->stream;
      c.index = static_cast<int32_t>(i);
      c.stream->set_listener(wake);
      track(c);
      choices.push_back(std::move(c));
    }
  }
  if (refused) {
    const Headers extra = refused->status == 503 ? retry_after() : Headers();
    co_await ex.respond(static_cast<http::status>(refused->status), "application/json", error_json(*refused), extra);
    co_return std::nullopt;
  }
  std::vector<std::vector<float>> outputs(inputs.size());
  for (;;) {
    bool progressed = false, all_finished = true;
    for (Choice& c : choices) {
      while (!c.finished) {
        std::optional<RequestOutput> out = c.stream->try_next();
        if (!out) break;
        progressed = true;
        if (!out->finished) continue;
        c.finished = true;
        if (!out->error.empty()) {
          const ApiError failed = server_error("embedding failed: " + out->error);
          co_await ex.respond(static_cast<http::status>(failed.status), "application/json", error_json(failed));
          co_return std::nullopt;
        }
        outputs[static_cast<size_t>(c.index)] = std::move(out->embedding);
      }
      all_finished = all_finished && c.finished;
    }
    if (all_finished) break;
    if (ex.client_gone()) co_return std::nullopt;
    if (!progressed) co_await ex.wait();
  }
  co_return outputs;
}

net::awaitable<void> ServingCore::generate(Exchange& ex, PreparedGeneration& pg, const std::string& api_id,
                                           GenerationOutput& output) {
  const GenerationRequest& req = pg.req;
  // ---- into the engine: one request per prompt and choice ----
  std::vector<Choice> choices;
  AbortUnfinished abort_unfinished{*engine_, choices};
  const std::function<void()> wake = ex.waker();
  if (std::optional<ApiError> refused = admit(pg, api_id, wake, choices)) {
    // Overloaded, or draining: another instance (or this one, later) can take it.
    const Headers extra = refused->status == 503 ? retry_after() : Headers();
    co_await ex.respond(static_cast<http::status>(refused->status), "application/json", output.error_body(*refused),
                        extra);
    co_return;
  }
  // Disaggregation: a producer's prompts (a consumer's pulls were registered in admit()).
  if (req.kv_transfer && req.kv_transfer->do_remote_decode)
    metrics_.count_kv_produced_prompts(static_cast<int64_t>(pg.prompts.size()));

  // ---- outputs back to the client ----
  const bool want_logprobs = req.logprobs >= 0;
  if (req.stream) {
    if (!co_await ex.begin_stream(http::status::ok, "text/event-stream")) co_return;
    std::string head = output.stream_head();
    if (!head.empty() && !co_await ex.write_chunk(std::move(head))) co_return;
  }
  for (;;) {
    bool progressed = false;
    for (Choice& c : choices) {
      while (!c.finished) {
        std::optional<RequestOutput> out = c.stream->try_next();
        if (!out) break;
        progressed = true;
        c.text += out->text;
        c.num_tokens += static_cast<int64_t>(out->token_ids.size());
        if (out->finished) {
          c.finished = true;
          c.finish_reason = out->finish_reason();
          c.stop_string = out->stop_string;
          c.error = out->error;
          c.metrics = out->metrics;
          c.beams = std::move(out->beams);
          c.kv_lease_id = out->kv_lease_id;
          c.kv_lease_blocks = std::move(out->kv_lease_blocks);
        }
        if (!req.stream) {
          if (want_logprobs) c.logprobs.insert(c.logprobs.end(), out->logprobs.begin(), out->logprobs.end());
          c.prompt_logprobs.insert(c.prompt_logprobs.end(), out->prompt_logprobs.begin(), out->prompt_logprobs.end());
          continue;
        }
        if (!c.error.empty() && !co_await ex.write_chunk(output.stream_error("generation failed: " + c.error)))
          co_return;
        std::string events = output.stream_output(c, *out);
        if (!events.empty() && !co_await ex.write_chunk(std::move(events))) co_return;
      }
    }
    bool all_finished = true;
    for (const Choice& c : choices) all_finished = all_finished && c.finished;
    if (all_finished) break;
    if (ex.client_gone()) co_return;
    if (!progressed) co_await ex.wait();
  }

  if (req.stream) {
    std::string tail = output.stream_tail(choices);
    if (!tail.empty() && !co_await ex.write_chunk(std::move(tail))) co_return;
    co_await ex.end_stream();
    co_return;
  }
  for (const Choice& c : choices)
    if (!c.error.empty()) {
      const ApiError failed = server_error("generation failed: " + c.error);
      co_await ex.respond(static_cast<http::status>(failed.status), "application/json", output.error_body(failed));
      co_return;
    }
  co_await ex.respond(http::status::ok, "application/json", output.body(choices));
}

json ServingCore::kv_transfer_response(const PreparedGeneration& pg, const std::string& api_id,
                                       const std::vector<Choice>& choices) const {
  if (!pg.req.kv_transfer || !pg.req.kv_transfer->do_remote_decode) return nullptr;
  // Per prompt, the (last) choice that holds its blocks.
  std::vector<HeldPrompt> held(pg.prompts.size());
  for (const Choice& c : choices)
    if (c.kv_lease_id != 0 && c.prompt_index < held.size()) held[c.prompt_index] = {c.kv_lease_id, c.kv_lease_blocks};
  return producer_params(*options_.kv_transfer, engine_->kv_transfer_port(), api_id, pg.prompts, held,
                         engine_->config().block_size, pg.req.cache_salt);
}

void ServingCore::track(const Choice& c) {
  std::lock_guard<std::mutex> lock(streams_mu_);
  live_streams_[c.engine_id] = c.stream;
}

void ServingCore::fail(std::string message, int rank) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    if (failure_) return;
    failure_ = Failure{message, rank};
    for (auto& [id, weak] : live_streams_)
      if (auto stream = weak.lock()) streams.push_back(std::move(stream));
    live_streams_.clear();
  }
  // A stream takes no output after its final one, so whatever the engine
  // might still push is dropped; the handlers wake and answer the error.
  for (const std::shared_ptr<RequestStream>& stream : streams) {
    RequestOutput out;
    out.request_id = stream->request_id();
    out.finished = true;
    out.status = RequestStatus::kFinishedAborted;
    out.error = message;
    stream->push(std::move(out));
  }
}

std::optional<ServingCore::Failure> ServingCore::failure() const {
  std::lock_guard<std::mutex> lock(streams_mu_);
  return failure_;
}

void ServingCore::on_finished(const RequestOutput& out) {
  --unfinished_;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    live_streams_.erase(out.request_id);
  }
  if (engine_ && engine_->kv_transfer()) {
    // Under the request's id, or its first beam's (a beam search's pull).
    for (bool beam_search : {false, true})
      engine_->kv_transfer()->forget(Engine::kv_pull_id(out.request_id, beam_search));
  }
  metrics_.observe_finished(out);
  const RequestMetrics& m = out.metrics;
  const double ttft = m.first_token_time > 0 ? ms(m.time_to_first_token()) : 0.0;
  const double tpot = m.token_times.size() >= 2 ? ms((m.token_times.back() - m.token_times.front()) /
                                                     static_cast<double>(m.token_times.size() - 1))
                                                : 0.0;
  std::string prompt;
  if (options_.log_prompts) {
    std::lock_guard<std::mutex> lock(log_mu_);
    if (auto it = prompt_log_.find(out.request_id); it != prompt_log_.end()) {
      prompt = std::move(it->second);
      prompt_log_.erase(it);
    }
  }
  const std::string spec =
      m.speculative.draft_tokens > 0
          ? fmt::format(", drafts {} accepted of {} (mean acceptance length {:.2f})", m.speculative.accepted_tokens,
                        m.speculative.draft_tokens, m.speculative.mean_acceptance_length())
          : std::string();
  spdlog::info("request {} {}: prompt {} tokens ({} cached), generated {}, queue {:.1f} ms, TTFT {:.1f} ms, "
               "TPOT {:.2f} ms, e2e {:.1f} ms{}{}{}{}",
               out.request_id, out.finish_reason(), m.num_prompt_tokens, m.num_cached_tokens, m.num_output_tokens,
               m.first_scheduled_time > 0 ? ms(m.queue_time()) : 0.0, ttft, tpot, ms(m.e2e_latency()), spec,
               out.error.empty() ? "" : ", error: ", out.error,
               options_.log_prompts ? ", prompt: " + json(prompt).dump(-1, ' ', false, json::error_handler_t::replace)
                                    : std::string());
}

}  // namespace inferd::server
