#include "server/openai_response_writer.h"

#include <cmath>

#include "server/tool_calling.h"

namespace inferd::server {

using json = nlohmann::json;

namespace {

// JSON has no infinities; a token the model rules out gets a very low logprob (as vLLM).
double finite_logprob(float lp) { return std::isfinite(lp) ? lp : -9999.0; }

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

std::string sse(const json& j) { return "data: " + dump_json(j) + "\n\n"; }

}  // namespace

json ResponseWriter::echo_logprobs(Choice& c) const {
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

json ResponseWriter::vllm_prompt_logprobs(const Choice& c) const {
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

json ResponseWriter::logprobs(Choice& c, const std::vector<SampledLogprobs>& lps) const {
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

std::string ResponseWriter::chunk(Choice& c, const RequestOutput& out, bool want_logprobs) const {
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

std::string ResponseWriter::reasoning_chunk(Choice& c, const std::string& text,
                                            const std::vector<SampledLogprobs>& lps, bool want_logprobs) const {
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

std::string ResponseWriter::tool_events(Choice& c, const std::vector<ToolCallDelta>& deltas,
                                        const RequestOutput& out, bool want_logprobs) const {
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

std::string ResponseWriter::usage_chunk(const json& usage) const {
  json j = base();
  j["choices"] = json::array();
  j["usage"] = usage;
  return sse(j);
}

std::string ResponseWriter::error_event(const std::string& message) const {
  return "data: " + error_json(ApiError{500, message, "server_error", {}, {}}) + "\n\n";
}

std::string ResponseWriter::body(std::vector<Choice>& choices, bool want_logprobs, const json& usage,
                                 const json& kv_transfer_params) const {
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
  return dump_json(response);
}

json ResponseWriter::usage(const std::vector<std::vector<int32_t>>& prompts, const std::vector<Choice>& choices,
                           int32_t n) {
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

ChoicesOutput::ChoicesOutput(const ServingCore& core, const PreparedGeneration& pg, bool chat,
                             const std::string& api_id)
    : core_(core), pg_(pg), api_id_(api_id),
      writer_(core.tokenizer(), chat, pg.req.include_usage, api_id, core.options().served_model_name),
      want_logprobs_(pg.req.logprobs >= 0) {
  writer_.set_prompt_scores(pg.req.echo ? pg.req.logprobs : 0, pg.req.prompt_logprobs);
}

std::string ChoicesOutput::stream_output(Choice& c, const RequestOutput& out) {
  return writer_.chunk(c, out, want_logprobs_);
}

std::string ChoicesOutput::stream_error(const std::string& message) { return writer_.error_event(message); }

std::string ChoicesOutput::stream_tail(std::vector<Choice>& choices) {
  std::string events;
  if (pg_.req.include_usage) events += writer_.usage_chunk(ResponseWriter::usage(pg_.prompts, choices, pg_.req.n));
  return events + "data: [DONE]\n\n";
}

std::string ChoicesOutput::body(std::vector<Choice>& choices) {
  if (pg_.req.use_beam_search) choices = beam_choices(choices);
  if (pg_.score_only)
    for (Choice& c : choices) {
      c.text.clear();
      c.logprobs.clear();
      c.num_tokens = 0;
      c.finish_reason = "length";
    }
  for (Choice& c : choices) finish_message(c, pg_);
  const json transfer = core_.kv_transfer_response(pg_, api_id_, choices);
  return writer_.body(choices, want_logprobs_, ResponseWriter::usage(pg_.prompts, choices, pg_.req.n), transfer);
}

json ResponseWriter::base() const {
  json j = {{"id", id_}, {"object", chat_ ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
            {"model", model_}};
  if (include_usage_) j["usage"] = nullptr;
  return j;
}

}  // namespace inferd::server
