#include "server/serving_messages.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <optional>

#include "server/messages_protocol.h"

namespace inferd::server {

using json = nlohmann::json;

namespace {

struct PreparedMessages {
  PreparedGeneration pg;
  bool thinking = false;
};

// Worker thread: the body parsed, its conversation rendered and tokenized
// through the chat path.
std::variant<PreparedMessages, ApiError> prepare_messages(const ServingCore& core, const std::string& body,
                                                          bool count_tokens) {
  auto parsed = parse_messages_request(body, core.options().limits, count_tokens);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  MessagesRequest& m = std::get<MessagesRequest>(parsed);
  PreparedMessages out;
  out.thinking = m.thinking;
  PreparedGeneration& pg = out.pg;
  pg.req = std::move(m.req);
  if (auto e = core.check_request(pg.req)) return *e;
  if (auto e = core.prepare_chat_prompt(pg)) return *e;
  if (!count_tokens)
    if (auto e = core.finish_preparation(pg, /*fill_context=*/false)) return *e;
  return out;
}

std::string token_count_json(size_t n) { return dump_json(json{{"input_tokens", n}}); }

bool only_whitespace(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

// Messages' side of a generation (one choice: the API has no `n`).
class MessagesOutput : public GenerationOutput {
 public:
  MessagesOutput(const ServingCore& core, const PreparedGeneration& pg, bool thinking, const std::string& id)
      : pg_(pg), thinking_(thinking), id_(id), model_(core.options().served_model_name),
        events_(id, model_, static_cast<int64_t>(pg.prompts.at(0).size())) {}

  std::string error_body(const ApiError& e) const override { return anthropic_error_json(e); }
  std::string stream_head() override { return events_.start(); }

  std::string stream_output(Choice& c, const RequestOutput& out) override {
    std::string thinking;
    std::vector<ToolCallDelta> answer;
    if (c.harmony_parser) {
      std::vector<HarmonyDelta> deltas = c.harmony_parser->feed(out.text);
      if (out.finished)
        for (HarmonyDelta& d : c.harmony_parser->finish()) deltas.push_back(std::move(d));
      for (HarmonyDelta& d : deltas) {
        thinking += d.reasoning;
        if (!d.content.empty() || d.call) answer.push_back({std::move(d.content), std::move(d.call), d.call_index});
      }
    } else {
      RequestOutput rest = out;
      if (c.reasoning_parser) {
        ReasoningDelta d = c.reasoning_parser->feed(out.text);
        if (out.finished) {
          ReasoningDelta tail = c.reasoning_parser->finish();
          d.reasoning += tail.reasoning;
          d.content += tail.content;
        }
        thinking = std::move(d.reasoning);
        rest.text = std::move(d.content);
      }
      if (c.tool_parser) answer = parse_streamed(c, rest);
      else answer.push_back({std::move(rest.text), std::nullopt, -1});
    }
    std::string events;
    if (thinking_) events += events_.thinking(thinking);
    const bool calls_possible = c.tool_parser || c.harmony_parser;
    for (ToolCallDelta& d : answer) {
      // With calls possible, whitespace alone waits for text after it; before
      // or after a call it is dropped (as the whole message's text is trimmed).
      if (!d.content.empty()) {
        if (calls_possible && only_whitespace(d.content)) {
          c.held_space += d.content;
        } else {
          events += events_.text(c.held_space + d.content);
          c.held_space.clear();
        }
      }
      if (d.call) {
        c.held_space.clear();
        events += events_.tool_use(d.call->name, d.call->arguments);
      }
    }
    return events;
  }

  std::string stream_error(const std::string& message) override { return events_.error(server_error(message)); }

  std::string stream_tail(std::vector<Choice>& choices) override {
    const Choice& c = choices.at(0);
    if (c.finish_reason == "abort")
      return events_.error(ApiError{503, "the generation was aborted before it finished (the server is shutting down)",
                                    "server_error", {}, {}});
    return events_.finish(c.finish_reason, c.stop_string, c.num_tokens);
  }

  std::string body(std::vector<Choice>& choices) override {
    Choice& c = choices.at(0);
    finish_message(c, pg_);
    MessageResult r;
    const bool parsed = c.harmony_parser || c.reasoning_parser || c.tool_parser;
    if (thinking_) r.thinking = c.reasoning;
    r.text = parsed ? c.content : c.text;
    if (only_whitespace(r.text)) r.text.clear();
    for (const json& call : c.tool_calls)
      r.tool_uses.push_back({call.at("function").at("name").get<std::string>(),
                             call.at("function").at("arguments").get<std::string>()});
    r.finish_reason = c.finish_reason;
    r.stop_string = c.stop_string;
    r.input_tokens = static_cast<int64_t>(pg_.prompts.at(0).size());
    r.output_tokens = c.num_tokens;
    return dump_json(message_json(id_, model_, r));
  }

 private:
  const PreparedGeneration& pg_;
  const bool thinking_;
  const std::string id_, model_;
  MessagesEventWriter events_;
};

boost::asio::awaitable<void> send_error(Exchange& ex, const ApiError& e) {
  co_await ex.respond(static_cast<http::status>(e.status), "application/json", anthropic_error_json(e));
}

// Anthropic's API reads JSON bodies only: a body sent as another media type
// (a form, plain text) is refused by name rather than parsed as if it were
// JSON. A request without a Content-Type is read as JSON.
std::optional<ApiError> wrong_content_type(const Exchange& ex) {
  const auto it = ex.request().find(http::field::content_type);
  if (it == ex.request().end()) return std::nullopt;
  std::string type(it->value().data(), it->value().size());
  type = type.substr(0, type.find(';'));
  while (!type.empty() && type.back() == ' ') type.pop_back();
  for (char& ch : type) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (type == "application/json") return std::nullopt;
  return bad_request("the request body must be JSON sent as 'Content-Type: application/json', not '" + type + "'");
}

}  // namespace

bool is_messages_path(std::string_view path) {
  return path == "/v1/messages" || path.substr(0, 13) == "/v1/messages/";
}

boost::asio::awaitable<void> serve_messages(ServingCore& core, Exchange& ex) {
  if (auto e = wrong_content_type(ex)) {
    co_await send_error(ex, *e);
    co_return;
  }
  const std::string& body = ex.request().body();
  auto work = [&core, &body] { return prepare_messages(core, body, /*count_tokens=*/false); };
  std::variant<PreparedMessages, ApiError> prepared = co_await core.workers().run(std::move(work));
  if (auto* e = std::get_if<ApiError>(&prepared)) {
    co_await send_error(ex, *e);
    co_return;
  }
  PreparedMessages& pm = std::get<PreparedMessages>(prepared);
  const std::string id = "msg_" + random_hex(24);
  MessagesOutput output(core, pm.pg, pm.thinking, id);
  co_await core.generate(ex, pm.pg, id, output);
}

boost::asio::awaitable<void> serve_messages_count_tokens(ServingCore& core, Exchange& ex) {
  if (auto e = wrong_content_type(ex)) {
    co_await send_error(ex, *e);
    co_return;
  }
  const std::string& body = ex.request().body();
  auto work = [&core, &body] { return prepare_messages(core, body, /*count_tokens=*/true); };
  std::variant<PreparedMessages, ApiError> prepared = co_await core.workers().run(std::move(work));
  if (auto* e = std::get_if<ApiError>(&prepared)) {
    co_await send_error(ex, *e);
    co_return;
  }
  const size_t n = std::get<PreparedMessages>(prepared).pg.prompts.at(0).size();
  co_await ex.respond(http::status::ok, "application/json", token_count_json(n));
}

}  // namespace inferd::server
