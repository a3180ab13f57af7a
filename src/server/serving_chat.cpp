#include "server/serving_chat.h"

#include "server/openai_response_writer.h"

namespace inferd::server {

namespace {

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

// Chat's stream: the choice's parsers (harmony, reasoning, tools) decide what
// each output says.
class ChatOutput : public ChoicesOutput {
 public:
  using ChoicesOutput::ChoicesOutput;
  std::string stream_output(Choice& c, const RequestOutput& out) override {
    if (c.harmony_parser) return harmony_events(writer_, c, out, want_logprobs_);
    if (c.reasoning_parser) return reasoning_events(writer_, c, out, want_logprobs_);
    if (c.tool_parser) return writer_.tool_events(c, parse_streamed(c, out), out, want_logprobs_);
    return writer_.chunk(c, out, want_logprobs_);
  }
};

}  // namespace

std::variant<PreparedGeneration, ApiError> prepare_chat(const ServingCore& core, const std::string& body) {
  ParseResult parsed = parse_chat_request(body, core.options().limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  PreparedGeneration pg;
  pg.req = std::move(std::get<GenerationRequest>(parsed));
  if (auto e = core.check_request(pg.req)) return *e;
  if (auto e = core.prepare_chat_prompt(pg)) return *e;
  if (auto e = core.finish_preparation(pg, /*fill_context=*/true)) return *e;
  return pg;
}

boost::asio::awaitable<void> serve_chat_completions(ServingCore& core, Exchange& ex) {
  const std::string& body = ex.request().body();
  auto work = [&core, &body] { return prepare_chat(core, body); };
  std::variant<PreparedGeneration, ApiError> prepared = co_await core.workers().run(std::move(work));
  if (auto* e = std::get_if<ApiError>(&prepared)) {
    co_await ex.respond(static_cast<http::status>(e->status), "application/json", error_json(*e));
    co_return;
  }
  PreparedGeneration& pg = std::get<PreparedGeneration>(prepared);
  const std::string api_id = "chatcmpl-" + random_hex(24);
  ChatOutput output(core, pg, /*chat=*/true, api_id);
  co_await core.generate(ex, pg, api_id, output);
}

}  // namespace inferd::server
