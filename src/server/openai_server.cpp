#include "server/openai_server.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <random>

#include "kv/block_hash.h"
#include "server/tool_calling.h"
#include "server/webui.h"

namespace inferd::server {

using json = nlohmann::json;
namespace net = boost::asio;

// One choice: an engine request and what has come back from it so far.
struct Choice {
  std::string engine_id;
  std::shared_ptr<RequestStream> stream;
  int32_t index = 0;
  size_t prompt_index = 0;
  std::string text;
  int64_t num_tokens = 0;
  std::vector<SampledLogprobs> logprobs;
  size_t logprob_text_offset = 0;  // completions: where the next token's text starts
  // Scoring the prompt: echo's text before the completion (completions), the
  // prompt's first token (which has no logprob), and the engine's prompt logprobs.
  std::optional<std::string> echo;
  int32_t prompt_first_token = 0;
  std::vector<SampledLogprobs> prompt_logprobs;
  bool finished = false;
  bool sent_role = false;  // chat streaming: the first delta carries the role
  std::string finish_reason;
  std::string error;
  RequestMetrics metrics;
  // Tool calls: the parser of this choice's output (null: none parsed), and
  // the calls found so far, in OpenAI's shape.
  std::shared_ptr<ToolCallStreamParser> tool_parser;
  json tool_calls = json::array();
  std::string content;     // chat with tools: the content outside the calls
  std::string held_space;  // streaming with tools: whitespace not yet sent
  // Reasoning: the parser that splits the thinking from the answer (null: not
  // split), and the thinking found (whole responses).
  std::shared_ptr<ReasoningStreamParser> reasoning_parser;
  std::string reasoning;
  // gpt-oss's harmony format: one parser splits the channels into reasoning,
  // content and tool calls (null: not harmony).
  std::shared_ptr<HarmonyStreamParser> harmony_parser;
  std::vector<BeamOutput> beams;  // beam search: the engine request's beams (it stands for n choices)
  // Prefill for a remote decode: the lease holding the prompt's blocks, and their ids per KV group.
  uint64_t kv_lease_id = 0;
  std::vector<std::vector<int32_t>> kv_lease_blocks;
};

struct PreparedGeneration {
  GenerationRequest req;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;  // for the log (log_prompts)
  std::vector<int64_t> max_tokens;        // per prompt
  std::shared_ptr<const CompiledGrammar> grammar;  // structured output, compiled (shared by every choice)
  std::optional<ToolCallFormat> tool_format;       // tool calls are parsed from the output in this format
  std::vector<std::string> tool_names;             // the request's functions (untagged hermes calls)
  std::vector<ToolSignature> tool_signatures;      // and their parameter schemas (qwen3_coder's types)
  bool harmony = false;                            // the output is harmony (chat/harmony.h)
  bool harmony_calls = false;                      // harmony: messages to functions are tool calls
  std::optional<ReasoningSpec> reasoning;          // chat: the thinking is split from the answer
  bool render_special = false;                     // the output's text shows control tokens
  // completions' echo: each prompt's text as the response repeats it (the
  // client's text, or its token ids decoded); score_only: max_tokens 0, the
  // one token the engine generates is dropped.
  std::vector<std::string> echo_texts;
  bool score_only = false;
};

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

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

// JSON has no infinities; a token the model rules out gets a very low logprob (as vLLM).
double finite_logprob(float lp) { return std::isfinite(lp) ? lp : -9999.0; }

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

double ms(double seconds) { return seconds * 1000.0; }

// Errors and headers are built by plain functions, never as braced temporaries
// inside a coroutine: GCC 12 miscompiles those (double free, or "array used
// as initializer" for string literals).
ApiError method_not_allowed(std::string message) {
  return ApiError{405, std::move(message), "invalid_request_error", {}, "method_not_allowed"};
}
ApiError model_loading() { return ApiError{503, "the model is loading", "server_error", {}, "model_loading"}; }
ApiError server_error(std::string message) { return ApiError{500, std::move(message), "server_error", {}, {}}; }
ApiError overloaded(int64_t waiting, int64_t bound) {
  return ApiError{503,
                  "The server is overloaded: " + std::to_string(waiting) +
                      " requests are waiting (--max-queued-requests " + std::to_string(bound) + "). Retry later.",
                  "server_error", {}, "server_overloaded"};
}
ApiError shutting_down() {
  return ApiError{503, "the server is shutting down", "server_error", {}, "server_shutting_down"};
}
Headers retry_after() { return {{"Retry-After", "1"}}; }

struct Route {
  const char* path;
  http::verb method;
};
const Route kRoutes[] = {{"/v1/completions", http::verb::post}, {"/v1/chat/completions", http::verb::post},
                         {"/v1/models", http::verb::get},       {"/metrics", http::verb::get},
                         {"/tokenize", http::verb::post},       {"/detokenize", http::verb::post},
                         {"/version", http::verb::get},         {"/tokenizer_info", http::verb::get}};
const Route* find_route(const std::string& path) {
  for (const Route& r : kRoutes)
    if (path == r.path) return &r;
  return nullptr;
}


// Builds the JSON of responses and stream chunks (kept out of the coroutines:
// GCC 12 mishandles brace-initialised JSON temporaries in a coroutine frame).
class ResponseWriter {
 public:
  ResponseWriter(const Tokenizer& tok, bool chat, bool include_usage, std::string id, std::string model)
      : tok_(tok), chat_(chat), include_usage_(include_usage), id_(std::move(id)), model_(std::move(model)),
        created_(unix_now()) {}

  // Whole responses that score the prompt: the alternatives asked for by
  // `logprobs` (echo's prompt tokens) and `prompt_logprobs` (-1: none).
  void set_prompt_scores(int32_t echo_top, int32_t prompt_logprobs) {
    echo_top_ = echo_top;
    prompt_logprobs_ = prompt_logprobs;
  }

  // completions with echo: the prompt's tokens in the `logprobs` object (the
  // first with a null logprob, as OpenAI and vLLM give it), then the
  // completion's, text offsets running on from the prompt's.
  json echo_logprobs(Choice& c) const {
    json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
         offsets = json::array();
    auto add = [&](int32_t token, json logprob, json top) {
      const std::string piece = tok_.token_to_piece(token, true);
      tokens.push_back(piece);
      token_logprobs.push_back(std::move(logprob));
      top_logprobs.push_back(std::move(top));
      offsets.push_back(c.logprob_text_offset);
      c.logprob_text_offset += piece.size();
    };
    add(c.prompt_first_token, nullptr, nullptr);
    for (const SampledLogprobs& lp : c.prompt_logprobs) {
      json top = json::object();
      for (size_t j = 0; j < lp.top.size() && j < static_cast<size_t>(echo_top_); ++j)
        top[tok_.token_to_piece(lp.top[j].token, true)] = finite_logprob(lp.top[j].logprob);
      add(lp.token, finite_logprob(lp.logprob), std::move(top));
    }
    for (const SampledLogprobs& lp : c.logprobs) {  // as logprobs() writes them
      json top = json::object();
      for (const TokenLogprob& t : lp.top) top[tok_.token_to_piece(t.token, true)] = finite_logprob(t.logprob);
      add(lp.token, finite_logprob(lp.logprob), std::move(top));
    }
    return json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs},
                {"text_offset", offsets}};
  }

  // vLLM's `prompt_logprobs`: null for the first token, then per token
  // {token id: {logprob, rank, decoded_token}}: the prompt's token and the
  // most likely ones.
  json vllm_prompt_logprobs(const Choice& c) const {
    json all = json::array({nullptr});
    for (const SampledLogprobs& lp : c.prompt_logprobs) {
      json entry = json::object();
      auto put = [&](int32_t token, float logprob, int32_t rank) {
        const std::string key = std::to_string(token);
        if (entry.contains(key)) return;
        entry[key] = {{"logprob", finite_logprob(logprob)},
                      {"rank", rank},
                      {"decoded_token", tok_.token_to_piece(token, true)}};
      };
      put(lp.token, lp.logprob, lp.rank);
      for (size_t j = 0; j < lp.top.size() && j < static_cast<size_t>(prompt_logprobs_); ++j)
        put(lp.top[j].token, lp.top[j].logprob, static_cast<int32_t>(j + 1));
      all.push_back(std::move(entry));
    }
    return all;
  }

  json logprobs(Choice& c, const std::vector<SampledLogprobs>& lps) const {
    if (chat_) {
      json content = json::array();
      for (const SampledLogprobs& lp : lps) {
        const std::string piece = tok_.token_to_piece(lp.token, true);
        json top = json::array();
        for (const TokenLogprob& t : lp.top) {
          const std::string tp = tok_.token_to_piece(t.token, true);
          top.push_back({{"token", tp}, {"logprob", finite_logprob(t.logprob)}, {"bytes", bytes_of(tp)}});
        }
        content.push_back({{"token", piece},
                           {"logprob", finite_logprob(lp.logprob)},
                           {"bytes", bytes_of(piece)},
                           {"top_logprobs", top}});
      }
      return json{{"content", content}, {"refusal", nullptr}};
    }
    json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
         offsets = json::array();
    for (const SampledLogprobs& lp : lps) {
      const std::string piece = tok_.token_to_piece(lp.token, true);
      tokens.push_back(piece);
      token_logprobs.push_back(finite_logprob(lp.logprob));
      json top = json::object();
      for (const TokenLogprob& t : lp.top) top[tok_.token_to_piece(t.token, true)] = finite_logprob(t.logprob);
      top_logprobs.push_back(top);
      offsets.push_back(c.logprob_text_offset);
      c.logprob_text_offset += piece.size();
    }
    return json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs},
                {"text_offset", offsets}};
  }

  // The SSE event for one engine output of a choice; "" when there is nothing to say.
  std::string chunk(Choice& c, const RequestOutput& out, bool want_logprobs) const {
    const bool has_delta = !out.text.empty() || !out.token_ids.empty();
    if (!has_delta && !out.finished) return {};
    json lp = nullptr;
    if (want_logprobs && !out.logprobs.empty()) lp = logprobs(c, out.logprobs);
    json choice = {{"index", c.index}, {"logprobs", lp},
                   {"finish_reason", out.finished ? json(c.finish_reason) : json(nullptr)}};
    if (chat_) {
      json delta = json::object();
      if (!c.sent_role) {
        delta["role"] = "assistant";
        c.sent_role = true;
      }
      if (!out.text.empty() || !out.finished) delta["content"] = out.text;
      choice["delta"] = delta;
    } else {
      choice["text"] = out.text;
    }
    json j = base();
    j["choices"] = json::array({choice});
    return sse(j);
  }

  // Chat with reasoning: a delta of thinking (with the logprobs of its
  // tokens); "" when there is nothing to say.
  std::string reasoning_chunk(Choice& c, const std::string& text, const std::vector<SampledLogprobs>& lps,
                              bool want_logprobs) const {
    json lp = nullptr;
    if (want_logprobs && !lps.empty()) lp = logprobs(c, lps);
    if (text.empty() && lp.is_null()) return {};
    json delta = json::object();
    if (!c.sent_role) {
      delta["role"] = "assistant";
      c.sent_role = true;
    }
    if (!text.empty()) delta["reasoning_content"] = text;
    json choice = {{"index", c.index}, {"logprobs", lp}, {"delta", std::move(delta)}, {"finish_reason", nullptr}};
    json j = base();
    j["choices"] = json::array({choice});
    return sse(j);
  }

  // Chat with tool parsing: the SSE events for what the parser made of one
  // engine output. Content as usual (whitespace alone is held back until
  // more text follows, and dropped after calls); each call as OpenAI streams
  // it, its id, type and name first, then its arguments; finish_reason
  // "tool_calls" once there was a call.
  std::string tool_events(Choice& c, const std::vector<ToolCallDelta>& deltas, const RequestOutput& out,
                          bool want_logprobs) const {
    std::string& held_space = c.held_space;
    std::string events;
    json lp = nullptr;
    if (want_logprobs && !out.logprobs.empty()) lp = logprobs(c, out.logprobs);
    auto emit = [&](json delta, bool last) {
      if (!c.sent_role) {
        delta["role"] = "assistant";
        c.sent_role = true;
      }
      json choice = {{"index", c.index}, {"logprobs", lp}, {"delta", std::move(delta)},
                     {"finish_reason", last ? json(c.finish_reason) : json(nullptr)}};
      lp = nullptr;  // sent once
      json j = base();
      j["choices"] = json::array({choice});
      events += sse(j);
    };
    for (const ToolCallDelta& d : deltas) {
      if (!d.content.empty()) {
        if (d.content.find_first_not_of(" \t\r\n") == std::string::npos) {
          held_space += d.content;
        } else {
          emit(json{{"content", held_space + d.content}}, false);
          held_space.clear();
        }
      }
      if (d.call) {
        held_space.clear();
        const std::string id = new_tool_call_id();
        const int index = static_cast<int>(c.tool_calls.size());
        c.tool_calls.push_back(
            {{"id", id}, {"type", "function"}, {"function", {{"name", d.call->name}, {"arguments", d.call->arguments}}}});
        json head = {{"index", index},
                     {"id", id},
                     {"type", "function"},
                     {"function", {{"name", d.call->name}, {"arguments", ""}}}};
        emit(json{{"tool_calls", json::array({head})}}, false);
        json args = {{"index", index}, {"function", {{"arguments", d.call->arguments}}}};
        emit(json{{"tool_calls", json::array({args})}}, false);
      }
    }
    if (out.finished) {
      if (!c.tool_calls.empty() && (c.finish_reason == "stop" || c.finish_reason == "length"))
        c.finish_reason = "tool_calls";
      else if (!held_space.empty())
        emit(json{{"content", held_space}}, false);
      held_space.clear();
      emit(json::object(), true);
    } else if (!lp.is_null()) {
      emit(json::object(), false);  // logprobs of tokens held back by the parser
    }
    return events;
  }

  std::string usage_chunk(const json& usage) const {
    json j = base();
    j["choices"] = json::array();
    j["usage"] = usage;
    return sse(j);
  }

  std::string error_event(const std::string& message) const {
    return "data: " + error_json(ApiError{500, message, "server_error", {}, {}}) + "\n\n";
  }

  std::string body(std::vector<Choice>& choices, bool want_logprobs, const json& usage,
                   const json& kv_transfer_params = nullptr) const {
    json out_choices = json::array();
    for (Choice& c : choices) {
      json lp = nullptr;
      if (want_logprobs) {
        c.logprob_text_offset = 0;
        lp = c.echo ? echo_logprobs(c) : logprobs(c, c.logprobs);
      }
      json choice = {{"index", c.index}, {"logprobs", lp}, {"finish_reason", c.finish_reason}};
      if (!chat_ && prompt_logprobs_ >= 0) choice["prompt_logprobs"] = vllm_prompt_logprobs(c);
      if (chat_ && (c.tool_parser || c.reasoning_parser || c.harmony_parser)) {
        json message = {{"role", "assistant"}, {"content", c.content.empty() ? json(nullptr) : json(c.content)}};
        if (c.reasoning_parser || c.harmony_parser) message["reasoning_content"] = c.reasoning.empty() ? json(nullptr) : json(c.reasoning);
        if (!c.tool_calls.empty()) message["tool_calls"] = c.tool_calls;
        choice["message"] = std::move(message);
      } else if (chat_) choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      else choice["text"] = c.echo ? *c.echo + c.text : c.text;
      out_choices.push_back(std::move(choice));
    }
    json response = {{"id", id_},
                     {"object", chat_ ? "chat.completion" : "text_completion"},
                     {"created", created_},
                     {"model", model_},
                     {"choices", out_choices},
                     {"usage", usage}};
    if (!kv_transfer_params.is_null()) response["kv_transfer_params"] = kv_transfer_params;
    // Chat has one prompt: vLLM gives its scores once, beside the choices.
    if (chat_ && prompt_logprobs_ >= 0 && !choices.empty()) response["prompt_logprobs"] = vllm_prompt_logprobs(choices[0]);
    return dump(response);
  }

  static json usage(const std::vector<std::vector<int32_t>>& prompts, const std::vector<Choice>& choices, int32_t n) {
    int64_t prompt_tokens = 0, completion_tokens = 0, cached = 0;
    for (const auto& p : prompts) prompt_tokens += static_cast<int64_t>(p.size());
    for (const Choice& c : choices) {
      completion_tokens += c.num_tokens;
      // The prompt is counted once per prompt; so are its cached tokens.
      if (c.index % n == 0) cached += c.metrics.num_cached_tokens;
    }
    return json{{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion_tokens},
                {"total_tokens", prompt_tokens + completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }

 private:
  json base() const {
    json j = {{"id", id_}, {"object", chat_ ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
              {"model", model_}};
    if (include_usage_) j["usage"] = nullptr;
    return j;
  }

  const Tokenizer& tok_;
  const bool chat_, include_usage_;
  const std::string id_, model_;
  const int64_t created_;
  int32_t echo_top_ = 0, prompt_logprobs_ = -1;
};

// Tool calls (plain functions, out of the coroutines for GCC 12's sake).
// Streaming: what one engine output of the choice adds.
std::vector<ToolCallDelta> parse_streamed(Choice& c, const RequestOutput& out) {
  std::vector<ToolCallDelta> deltas = c.tool_parser->feed(out.text);
  if (out.finished)
    for (ToolCallDelta& d : c.tool_parser->finish()) deltas.push_back(std::move(d));
  return deltas;
}

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

// Whole: the thinking split from the answer, then the answer's tool calls.
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

// Streaming with reasoning: thinking deltas first, then the answer's deltas as
// without reasoning (tool calls parsed from the answer alone).
std::string reasoning_events(const ResponseWriter& writer, Choice& c, const RequestOutput& out, bool want_logprobs) {
  ReasoningDelta d = c.reasoning_parser->feed(out.text);
  if (out.finished) {
    ReasoningDelta tail = c.reasoning_parser->finish();
    d.reasoning += tail.reasoning;
    d.content += tail.content;
  }
  RequestOutput answer = out;
  answer.text = std::move(d.content);
  std::string events;
  if (!d.reasoning.empty() || (answer.text.empty() && !answer.finished)) {
    // The step's logprobs go with its thinking (or alone, for tokens held back).
    events += writer.reasoning_chunk(c, d.reasoning, out.logprobs, want_logprobs);
    answer.logprobs.clear();
    if (answer.text.empty() && !answer.finished) return events;
  }
  if (c.tool_parser) {
    const std::vector<ToolCallDelta> deltas = parse_streamed(c, answer);
    events += writer.tool_events(c, deltas, answer, want_logprobs);
  } else {
    events += writer.chunk(c, answer, want_logprobs);
  }
  return events;
}

// Streaming harmony: the reasoning of one engine output first (with its
// logprobs), then its content and calls as tool_events sends them.
std::string harmony_events(const ResponseWriter& writer, Choice& c, const RequestOutput& out, bool want_logprobs) {
  std::vector<HarmonyDelta> deltas = c.harmony_parser->feed(out.text);
  if (out.finished)
    for (HarmonyDelta& d : c.harmony_parser->finish()) deltas.push_back(std::move(d));
  std::string reasoning;
  std::vector<ToolCallDelta> answer_deltas;
  for (HarmonyDelta& d : deltas) {
    reasoning += d.reasoning;
    if (!d.content.empty() || d.call) answer_deltas.push_back({std::move(d.content), std::move(d.call), d.call_index});
  }
  RequestOutput answer = out;
  answer.text.clear();
  std::string events;
  if (!reasoning.empty()) {
    events += writer.reasoning_chunk(c, reasoning, out.logprobs, want_logprobs);
    answer.logprobs.clear();
  }
  events += writer.tool_events(c, answer_deltas, answer, want_logprobs);
  return events;
}

// kv_transfer_params against this instance's role: a role's own requests
// pass; without --kv-transfer-config they are dropped (vLLM ignores them
// without a connector).
std::optional<ApiError> check_kv_transfer(const std::optional<KVTransferConfig>& config,
                                          std::optional<KVTransferParams>& params) {
  if (!params) return std::nullopt;
  if (!config) {
    params.reset();
    return std::nullopt;
  }
  if (params->do_remote_decode && !config->produces())
    return bad_request("this instance's kv_role is " + std::string(kv_role_name(config->role)) +
                           ": it does not prefill for remote decode ('kv_transfer_params.do_remote_decode')",
                       "kv_transfer_params");
  if (params->do_remote_prefill && !config->consumes())
    return bad_request("this instance's kv_role is " + std::string(kv_role_name(config->role)) +
                           ": it does not take KV blocks from a producer ('kv_transfer_params.do_remote_prefill')",
                       "kv_transfer_params");
  return std::nullopt;
}

// A producer's answer to "do_remote_decode": where the prompts' blocks are
// (vLLM's NixlConnector fields): per prompt, its block keys, and the lease
// that holds its blocks with their ids per KV group (lease 0 and no ids when
// nothing is held: the consumer then computes the prompt).
json producer_params(const KVTransferConfig& config, uint16_t port, const std::string& api_id,
                     const std::vector<std::vector<int32_t>>& prompts, const std::vector<Choice>& choices,
                     int32_t block_size, const std::string& salt) {
  json keys = json::array(), leases = json::array(), block_ids = json::array();
  for (size_t p = 0; p < prompts.size(); ++p) {
    json per_prompt = json::array();
    for (uint64_t k : prompt_block_keys(prompts[p], block_size, salt)) per_prompt.push_back(fmt::format("{:016x}", k));
    keys.push_back(std::move(per_prompt));
    const Choice* held = nullptr;
    for (const Choice& c : choices)
      if (c.prompt_index == p && c.kv_lease_id != 0) held = &c;
    leases.push_back(fmt::format("{:016x}", held ? held->kv_lease_id : 0));
    block_ids.push_back(held ? json(held->kv_lease_blocks) : json::array());
  }
  return json{{"do_remote_prefill", true},
              {"do_remote_decode", false},
              {"remote_engine_id", config.engine_id},
              {"remote_host", config.ip},
              {"remote_port", port},
              {"remote_request_id", api_id},
              {"remote_block_size", block_size},
              {"remote_block_keys", std::move(keys)},
              {"remote_lease_ids", std::move(leases)},
              {"remote_block_ids", std::move(block_ids)}};
}

// A consumer's view of what a producer holds for prompt p: each KV group's
// key of each block -> the producer's block id. Empty when the parameters
// name no lease or no blocks for it.
std::optional<kvtransfer::RemotePrompt> remote_prompt(const KVTransferParams& t, size_t p) {
  if (p >= t.remote_lease_ids.size() || p >= t.remote_block_ids.size() || p >= t.remote_block_keys.size() ||
      t.remote_lease_ids[p] == 0)
    return std::nullopt;
  kvtransfer::RemotePrompt r;
  r.host = t.remote_host;
  r.port = static_cast<uint16_t>(*t.remote_port);
  r.engine_id = t.remote_engine_id;
  r.lease_id = t.remote_lease_ids[p];
  const std::vector<uint64_t>& keys = t.remote_block_keys[p];
  const std::vector<std::vector<int32_t>>& groups = t.remote_block_ids[p];
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t i = 0; i < groups[g].size() && i < keys.size(); ++i)
      if (groups[g][i] != 0) r.blocks[kv::group_block_hash(keys[i], static_cast<int32_t>(g))] = groups[g][i];
  if (r.blocks.empty()) return std::nullopt;
  return r;
}

std::string version_json() { return json{{"version", "inferd 0.1"}}.dump(); }

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

}  // namespace

OpenAIServer::OpenAIServer(ServerOptions options)
    : options_(std::move(options)), metrics_(options_.served_model_name), workers_(options_.worker_threads) {}

void OpenAIServer::begin_shutdown() {
  std::lock_guard<std::mutex> lock(admit_mu_);
  shutting_down_ = true;
}

void OpenAIServer::attach(Model& model, Engine& engine, std::optional<ChatTemplate> tmpl) {
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

std::string OpenAIServer::rejection_body(http::status status, std::string_view message) const {
  ApiError e{static_cast<int>(status), std::string(message), "invalid_request_error", {}, {}};
  if (status == http::status::payload_too_large) e.code = "request_too_large";
  if (static_cast<int>(status) >= 500) e.type = "server_error";
  if (status == http::status::service_unavailable) e.code = "server_shutting_down";  // the HTTP layer's only 503
  return error_json(e);
}

net::awaitable<void> OpenAIServer::send_error(Exchange& ex, const ApiError& e, const Headers& extra) {
  co_await ex.respond(static_cast<http::status>(e.status), "application/json", error_json(e), extra);
}

std::optional<ApiError> OpenAIServer::check_auth(const HttpRequest& req) const {
  if (options_.api_key.empty()) return std::nullopt;
  auto it = req.find(http::field::authorization);
  std::string_view given;
  if (it != req.end()) given = std::string_view(it->value().data(), it->value().size());
  constexpr std::string_view kBearer = "Bearer ";
  if (given.size() > kBearer.size() && given.substr(0, kBearer.size()) == kBearer &&
      constant_time_equal(given.substr(kBearer.size()), options_.api_key))
    return std::nullopt;
  return ApiError{401,
                  given.empty() ? "Missing API key: send it as 'Authorization: Bearer <key>'."
                                : "Incorrect API key provided.",
                  "invalid_request_error", {}, "invalid_api_key"};
}

std::string OpenAIServer::models_json() const {
  json m = {{"id", options_.served_model_name},
            {"object", "model"},
            {"created", unix_now()},
            {"owned_by", "inferd"},
            {"max_model_len", engine_->config().max_model_len}};
  return dump(json{{"object", "list"}, {"data", json::array({m})}});
}

net::awaitable<void> OpenAIServer::handle(Exchange& ex) {
  const std::string path(ex.path());
  const http::verb method = ex.request().method();
  if (path == "/health") {
    if (method != http::verb::get && method != http::verb::head) {
      co_await send_error(ex, method_not_allowed("use GET for /health"));
    } else if (ready()) {
      co_await ex.respond(http::status::ok, "application/json", "{}");
    } else {
      co_await send_error(ex, model_loading());
    }
    co_return;
  }
  // The page loads without the API key (it holds none); its API calls send it.
  if (options_.webui && method == http::verb::get) {
    const auto if_none_match = ex.request()[http::field::if_none_match];
    std::optional<WebResponse> page =
        serve_webui(path, std::string_view(if_none_match.data(), if_none_match.size()));
    if (page) {
      co_await ex.respond(page->status, page->content_type, std::move(page->body), page->headers);
      co_return;
    }
  }
  if (auto e = check_auth(ex.request())) {
    co_await send_error(ex, *e);
    co_return;
  }
  const Route* route = find_route(path);
  if (!route) {
    co_await send_error(ex, not_found("Not found: " + path));
    co_return;
  }
  if (method != route->method) {
    co_await send_error(ex, method_not_allowed("use " + std::string(http::to_string(route->method)) + " for " + path));
    co_return;
  }
  if (path == "/version") {
    co_await ex.respond(http::status::ok, "application/json", version_json());
    co_return;
  }
  if (!ready()) {
    co_await send_error(ex, model_loading(), retry_after());
    co_return;
  }
  if (path == "/v1/models") {
    co_await ex.respond(http::status::ok, "application/json", models_json());
  } else if (path == "/metrics") {
    const EngineStats stats = engine_->stats();
    const int64_t not_yet_scheduled =
        std::max<int64_t>(0, unfinished_.load() - stats.scheduler.num_running_requests -
                                 stats.scheduler.num_waiting_requests);
    const std::optional<GrammarCompilerStats> grammar_stats =
        grammars_ ? std::optional(grammars_->stats()) : std::nullopt;
    co_await ex.respond(http::status::ok, "text/plain; version=0.0.4; charset=utf-8",
                        metrics_.render(stats, not_yet_scheduled, grammar_stats ? &*grammar_stats : nullptr));
  } else if (path == "/tokenizer_info") {
    co_await ex.respond(http::status::ok, "application/json", tokenizer_info_json());
  } else if (path == "/tokenize" || path == "/detokenize") {
    const std::string& body = ex.request().body();
    const bool to_ids = path == "/tokenize";
    auto work = [this, &body, to_ids] { return to_ids ? tokenize(body) : detokenize(body); };
    std::variant<std::string, ApiError> result = co_await workers_.run(std::move(work));
    if (auto* e = std::get_if<ApiError>(&result)) co_await send_error(ex, *e);
    else co_await ex.respond(http::status::ok, "application/json", std::get<std::string>(result));
  } else {
    co_await generate(ex, path == "/v1/chat/completions");
  }
}

std::variant<ChatPrompt, ApiError> OpenAIServer::render_chat(const std::vector<ChatMessage>& messages,
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

std::optional<ApiError> OpenAIServer::surely_too_long(std::string_view prompt, std::optional<int64_t> max_tokens) const {
  const int64_t max_model_len = engine_->config().max_model_len;
  const auto at_least = static_cast<int64_t>(model_->tokenizer().min_tokens(prompt));
  if (at_least >= max_model_len || (max_tokens && at_least + *max_tokens > max_model_len))
    return context_length_error_by_bytes(max_model_len, at_least, prompt.size(), max_tokens);
  return std::nullopt;
}

namespace {
// A request body that must be a JSON object.
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
}  // namespace

std::variant<std::string, ApiError> OpenAIServer::tokenize(const std::string& text) const {
  auto parsed_body = parse_object(text);
  if (auto* e = std::get_if<ApiError>(&parsed_body)) return *e;
  const json& body = std::get<json>(parsed_body);
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    // The chat parser validates the messages.
    json chat = {{"messages", body.at("messages")}};
    auto parsed = parse_chat_request(chat.dump(), options_.limits);
    if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
    auto agp = body.find("add_generation_prompt");
    if (agp != body.end() && !agp->is_boolean())
      return bad_request("'add_generation_prompt' must be a boolean", "add_generation_prompt");
    auto prompt = render_chat(std::get<GenerationRequest>(parsed).messages, agp == body.end() || agp->get<bool>(), "");
    if (auto* e = std::get_if<ApiError>(&prompt)) return *e;
    ids = tokenize_chat_prompt(model_->tokenizer(), std::get<ChatPrompt>(prompt));
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || !it->is_string()) return bad_request("'prompt' (a string) or 'messages' is required", "prompt");
    auto special = body.find("add_special_tokens");
    if (special != body.end() && !special->is_boolean())
      return bad_request("'add_special_tokens' must be a boolean", "add_special_tokens");
    const bool add_special = special == body.end() || special->get<bool>();
    ids = model_->tokenizer().encode(it->get<std::string>(), add_special, /*parse_special=*/true);
  }
  return dump(json{{"count", ids.size()}, {"max_model_len", engine_->config().max_model_len}, {"tokens", ids}});
}

std::string OpenAIServer::tokenizer_info_json() const {
  const Tokenizer& tok = model_->tokenizer();
  auto piece = [&](int32_t id) { return id >= 0 ? json(tok.token_to_piece(id, true)) : json(nullptr); };
  json info = {{"tokenizer_class", "inferd"},
               {"eos_token", piece(tok.eos_id())},
               {"bos_token", piece(tok.bos_id())},
               {"pad_token", nullptr},
               {"model_max_length", engine_->config().max_model_len},
               {"chat_template", template_ ? json(template_->source()) : json(nullptr)}};
  return dump(info);
}

std::variant<std::string, ApiError> OpenAIServer::detokenize(const std::string& text) const {
  auto parsed_body = parse_object(text);
  if (auto* e = std::get_if<ApiError>(&parsed_body)) return *e;
  const json& body = std::get<json>(parsed_body);
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array())
    return bad_request("'tokens' (an array of token ids) is required", "tokens");
  const int32_t n_vocab = model_->tokenizer().n_vocab();
  std::vector<int32_t> ids;
  for (const json& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab)
      return bad_request("'tokens' must hold token ids in [0, " + std::to_string(n_vocab) + ")", "tokens");
    ids.push_back(t.get<int32_t>());
  }
  return dump(json{{"prompt", model_->tokenizer().decode(ids, /*render_special=*/false)}});
}

std::variant<PreparedGeneration, ApiError> OpenAIServer::prepare_generation(const std::string& body, bool chat) const {
  ParseResult parsed = chat ? parse_chat_request(body, options_.limits) : parse_completion_request(body, options_.limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  PreparedGeneration pg;
  pg.req = std::move(std::get<GenerationRequest>(parsed));
  GenerationRequest& req = pg.req;
  if (!req.model.empty() && req.model != options_.served_model_name)
    return not_found("The model `" + req.model + "` does not exist.", "model_not_found");
  if (auto e = check_kv_transfer(options_.kv_transfer, req.kv_transfer)) return *e;

  // ---- prompts as token ids ----
  const Tokenizer& tok = model_->tokenizer();
  if (chat) {
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
  } else {
    for (PromptInput& p : req.prompts) {
      if (p.is_tokens) {
        for (int32_t id : p.token_ids)
          if (id >= tok.n_vocab())
            return bad_request("token id " + std::to_string(id) + " in 'prompt' is outside the vocabulary of " +
                                   std::to_string(tok.n_vocab()) + " tokens",
                               "prompt");
        pg.prompts.push_back(std::move(p.token_ids));
      } else {
        if (auto e = surely_too_long(p.text, req.max_tokens)) return *e;
        pg.prompts.push_back(tok.encode(p.text, /*add_special=*/true, /*parse_special=*/true));
      }
      if (options_.log_prompts) pg.prompt_texts.push_back(p.is_tokens ? tok.decode(pg.prompts.back(), true) : p.text);
      if (pg.prompts.back().empty()) return bad_request("'prompt' must not be empty", "prompt");
      if (req.echo) pg.echo_texts.push_back(p.is_tokens ? tok.decode(pg.prompts.back(), true) : p.text);
    }
  }

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
                            : chat         ? room
                                           : std::min(options_.default_max_tokens, room));
  }
  return pg;
}

std::optional<ApiError> OpenAIServer::prepare_tools(PreparedGeneration& pg) const {
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

std::optional<ApiError> OpenAIServer::admit(PreparedGeneration& pg, const std::string& api_id,
                                            const std::function<void()>& wake, std::vector<Choice>& choices) {
  const GenerationRequest& req = pg.req;
  // Checked and added under one lock: no request enters the engine once
  // begin_shutdown() has returned (the engine may be stopped by then), and
  // concurrent requests cannot overshoot the queue bound together.
  std::lock_guard<std::mutex> lock(admit_mu_);
  if (shutting_down_) return shutting_down();
  const int64_t new_requests = static_cast<int64_t>(pg.prompts.size()) * req.n;
  const int64_t waiting = unfinished_.load() - engine_->stats().scheduler.num_running_requests;
  if (waiting + new_requests > options_.max_queued_requests) return overloaded(waiting, options_.max_queued_requests);

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
      choices.push_back(std::move(c));
    }
  }
  return std::nullopt;
}

net::awaitable<void> OpenAIServer::generate(Exchange& ex, bool chat) {
  const std::string& body = ex.request().body();
  auto work = [this, &body, chat] { return prepare_generation(body, chat); };
  std::variant<PreparedGeneration, ApiError> prepared = co_await workers_.run(std::move(work));
  if (auto* e = std::get_if<ApiError>(&prepared)) {
    co_await send_error(ex, *e);
    co_return;
  }
  PreparedGeneration& pg = std::get<PreparedGeneration>(prepared);
  const GenerationRequest& req = pg.req;
  const std::vector<std::vector<int32_t>>& prompts = pg.prompts;

  // ---- into the engine: one request per prompt and choice ----
  const std::string api_id = (chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
  std::vector<Choice> choices;
  // Whatever way this handler ends (done, client gone, coroutine destroyed),
  // unfinished choices are aborted so their KV blocks are freed.
  struct AbortUnfinished {
    Engine& engine;
    std::vector<Choice>& choices;
    ~AbortUnfinished() {
      for (const Choice& c : choices)
        if (!c.finished) engine.abort(c.engine_id);
    }
  } abort_unfinished{*engine_, choices};
  const std::function<void()> wake = ex.waker();
  if (std::optional<ApiError> refused = admit(pg, api_id, wake, choices)) {
    const Headers extra = refused->code == "server_overloaded" ? retry_after() : Headers();
    co_await send_error(ex, *refused, extra);
    co_return;
  }

  // Disaggregation: a producer's prompts (a consumer's pulls were registered in admit()).
  const bool remote_decode = req.kv_transfer && req.kv_transfer->do_remote_decode;
  if (remote_decode) metrics_.count_kv_produced_prompts(static_cast<int64_t>(prompts.size()));

  // ---- outputs back to the client ----
  const Tokenizer& tok = model_->tokenizer();
  ResponseWriter writer(tok, chat, req.include_usage, api_id, options_.served_model_name);
  writer.set_prompt_scores(req.echo ? req.logprobs : 0, req.prompt_logprobs);
  const bool want_logprobs = req.logprobs >= 0;
  if (req.stream && !co_await ex.begin_stream(http::status::ok, "text/event-stream")) co_return;

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
        if (!c.error.empty() && !co_await ex.write_chunk(writer.error_event("generation failed: " + c.error)))
          co_return;
        if (c.harmony_parser) {
          std::string events = harmony_events(writer, c, *out, want_logprobs);
          if (!events.empty() && !co_await ex.write_chunk(std::move(events))) co_return;
          continue;
        }
        if (c.reasoning_parser) {
          std::string events = reasoning_events(writer, c, *out, want_logprobs);
          if (!events.empty() && !co_await ex.write_chunk(std::move(events))) co_return;
          continue;
        }
        if (c.tool_parser) {
          const std::vector<ToolCallDelta> deltas = parse_streamed(c, *out);
          std::string events = writer.tool_events(c, deltas, *out, want_logprobs);
          if (!events.empty() && !co_await ex.write_chunk(std::move(events))) co_return;
          continue;
        }
        std::string event = writer.chunk(c, *out, want_logprobs);
        if (!event.empty() && !co_await ex.write_chunk(std::move(event))) co_return;
      }
    }
    bool all_finished = true;
    for (const Choice& c : choices) all_finished = all_finished && c.finished;
    if (all_finished) break;
    if (ex.client_gone()) co_return;
    if (!progressed) co_await ex.wait();
  }

  if (req.stream) {
    if (req.include_usage &&
        !co_await ex.write_chunk(writer.usage_chunk(ResponseWriter::usage(prompts, choices, req.n))))
      co_return;
    if (!co_await ex.write_chunk(std::string("data: [DONE]\n\n"))) co_return;
    co_await ex.end_stream();
    co_return;
  }
  for (const Choice& c : choices)
    if (!c.error.empty()) {
      co_await send_error(ex, server_error("generation failed: " + c.error));
      co_return;
    }
  if (req.use_beam_search) choices = beam_choices(choices);
  if (pg.score_only)
    for (Choice& c : choices) {
      c.text.clear();
      c.logprobs.clear();
      c.num_tokens = 0;
      c.finish_reason = "length";
    }
  for (Choice& c : choices) finish_message(c, pg);
  const json transfer =
      remote_decode ? producer_params(*options_.kv_transfer, engine_->kv_transfer_port(), api_id, prompts, choices,
                                      engine_->config().block_size, req.cache_salt)
                    : json(nullptr);
  co_await ex.respond(http::status::ok, "application/json",
                      writer.body(choices, want_logprobs, ResponseWriter::usage(prompts, choices, req.n), transfer));
}

void OpenAIServer::on_finished(const RequestOutput& out) {
  --unfinished_;
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
