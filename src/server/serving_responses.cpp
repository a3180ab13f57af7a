#include "server/serving_responses.h"

#include <spdlog/spdlog.h>

#include <mutex>
#include <set>

#include "server/responses_protocol.h"
#include "server/serving_chat.h"
#include "server/tool_calling.h"

namespace inferd::server {

using json = nlohmann::json;
namespace net = boost::asio;

namespace {

constexpr std::string_view kResponsesPath = "/v1/responses/";

// A request prepared on a worker: the generation, the request, and the
// conversation before it (a previous response's input and output items).
struct PreparedResponse {
  PreparedGeneration pg;
  ResponsesRequest req;
  std::vector<ordered_json> history;
};

ApiError response_not_found(const std::string& id, std::string param) {
  ApiError e = not_found("Response with id '" + id + "' not found.");
  e.param = std::move(param);
  return e;
}

// Hosted tools a request offered and this server left out: said once per
// type, not on every turn of an agent that offers them each time.
void log_ignored_tools(const std::vector<std::string>& types) {
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mutex);
  for (const std::string& type : types)
    if (said.insert(type).second)
      spdlog::info("responses: '{}' tools are left out (this server runs no hosted tool; function tools are kept)",
                   type);
}

std::variant<PreparedResponse, ApiError> prepare_response(const ServingCore& core, ResponseStore& store,
                                                         const std::string& body) {
  auto parsed = parse_responses_request(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  PreparedResponse pr;
  pr.req = std::move(std::get<ResponsesRequest>(parsed));
  log_ignored_tools(pr.req.ignored_tool_types);
  if (!pr.req.previous_response_id.empty()) {
    std::optional<StoredResponse> prev = store.get(pr.req.previous_response_id);
    if (!prev) {
      ApiError e = response_not_found(pr.req.previous_response_id, "previous_response_id");
      e.message = "Previous response with id '" + pr.req.previous_response_id + "' not found.";
      e.code = "previous_response_not_found";
      return e;
    }
    pr.history = std::move(prev->input_items);
    for (const ordered_json& item : prev->response["output"]) pr.history.push_back(item);
  }
  auto chat_body = responses_chat_body(pr.req, pr.history);
  if (auto* e = std::get_if<ApiError>(&chat_body)) return *e;
  auto prepared = prepare_chat(core, std::get<std::string>(chat_body));
  if (auto* e = std::get_if<ApiError>(&prepared)) return *e;
  pr.pg = std::move(std::get<PreparedGeneration>(prepared));
  return pr;
}

// One response's output: its stream of events, or its whole Response object;
// stored (with its conversation) when the request says `store`.
class ResponsesOutput : public GenerationOutput {
 public:
  ResponsesOutput(const ServingCore& core, ResponseStore& store, const PreparedResponse& pr, std::string id)
      : core_(core), store_(store), pr_(pr), id_(std::move(id)), created_at_(unix_now()),
        events_(pr.req, id_, created_at_, core.options().served_model_name) {}

  std::string stream_head() override { return events_.begin(); }

  std::string stream_output(Choice& c, const RequestOutput& out) override {
    OutputParts parts = split_output(c, out);
    reasoning_ += parts.reasoning;
    std::string events = events_.reasoning_delta(parts.reasoning);
    for (ToolCallDelta& d : parts.answer) {
      events += events_.text_delta(d.content);
      if (d.call) events += events_.function_call(new_tool_call_id(), d.call->name, d.call->arguments);
    }
    return events;
  }

  std::string stream_error(const std::string& message) override { return events_.error(message); }

  std::string stream_tail(std::vector<Choice>& choices) override {
    const Choice& c = choices.front();
    std::string events = events_.finish(c.finish_reason == "length", usage(c, reasoning_));
    keep(events_.response());
    return events;
  }

  std::string body(std::vector<Choice>& choices) override {
    Choice& c = choices.front();
    finish_message(c, pr_.pg);
    ResponseResult result;
    result.reasoning = c.reasoning;
    const bool parsed = c.tool_parser || c.reasoning_parser || c.harmony_parser;
    result.content = parsed ? c.content : c.text;
    result.tool_calls = c.tool_calls;
    result.incomplete = c.finish_reason == "length";
    const ResponseUsage u = usage(c, c.reasoning);
    ordered_json response = response_object(pr_.req, id_, created_at_, core_.options().served_model_name,
                                            result.incomplete ? "incomplete" : "completed",
                                            response_output_items(result, pr_.req), &u);
    keep(response);
    return response.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  }

 private:
  ResponseUsage usage(const Choice& c, const std::string& reasoning) const {
    ResponseUsage u;
    u.input_tokens = static_cast<int64_t>(pr_.pg.prompts.front().size());
    u.cached_tokens = c.metrics.num_cached_tokens;
    u.output_tokens = c.num_tokens;
    // The thinking's share of the output, counted as the tokenizer splits its text.
    if (!reasoning.empty())
      u.reasoning_tokens = std::min<int64_t>(
          u.output_tokens, static_cast<int64_t>(core_.tokenizer().encode(reasoning, false, false).size()));
    return u;
  }

  void keep(const ordered_json& response) {
    if (!pr_.req.store) return;
    StoredResponse stored;
    stored.response = response;
    stored.input_items = pr_.history;
    stored.input_items.insert(stored.input_items.end(), pr_.req.input.begin(), pr_.req.input.end());
    store_.put(id_, std::move(stored));
  }

  const ServingCore& core_;
  ResponseStore& store_;
  const PreparedResponse& pr_;
  const std::string id_;
  const int64_t created_at_;
  ResponseEventStream events_;
  std::string reasoning_;  // streamed so far (for usage)
};

std::string deleted_json(const std::string& id) {
  return dump_json(json{{"id", id}, {"object", "response"}, {"deleted", true}});
}

}  // namespace

net::awaitable<void> ResponsesApi::create(Exchange& ex) {
  const std::string& body = ex.request().body();
  ServingCore& core = core_;
  ResponseStore& store = store_;
  auto work = [&core, &store, &body] { return prepare_response(core, store, body); };
  std::variant<PreparedResponse, ApiError> prepared = co_await core_.workers().run(std::move(work));
  if (auto* e = std::get_if<ApiError>(&prepared)) {
    co_await ex.respond(static_cast<http::status>(e->status), "application/json", error_json(*e));
    co_return;
  }
  PreparedResponse& pr = std::get<PreparedResponse>(prepared);
  const std::string id = new_item_id("resp");
  ResponsesOutput output(core_, store_, pr, id);
  co_await core_.generate(ex, pr.pg, id, output);
}

net::awaitable<void> ResponsesApi::retrieve(Exchange& ex) {
  const std::string id(ex.path().substr(kResponsesPath.size()));
  std::optional<StoredResponse> stored = store_.get(id);
  if (!stored) {
    const ApiError e = response_not_found(id, "response_id");
    co_await ex.respond(static_cast<http::status>(e.status), "application/json", error_json(e));
    co_return;
  }
  co_await ex.respond(http::status::ok, "application/json",
                      stored->response.dump(-1, ' ', false, ordered_json::error_handler_t::replace));
}

net::awaitable<void> ResponsesApi::remove(Exchange& ex) {
  const std::string id(ex.path().substr(kResponsesPath.size()));
  if (!store_.erase(id)) {
    const ApiError e = response_not_found(id, "response_id");
    co_await ex.respond(static_cast<http::status>(e.status), "application/json", error_json(e));
    co_return;
  }
  co_await ex.respond(http::status::ok, "application/json", deleted_json(id));
}

}  // namespace inferd::server
