#include "server/serving_completion.h"

#include "server/openai_response_writer.h"

namespace inferd::server {

std::variant<PreparedGeneration, ApiError> prepare_completion(const ServingCore& core, const std::string& body) {
  ParseResult parsed = parse_completion_request(body, core.options().limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  PreparedGeneration pg;
  pg.req = std::move(std::get<GenerationRequest>(parsed));
  GenerationRequest& req = pg.req;
  if (auto e = core.check_request(req)) return *e;
  const Tokenizer& tok = core.tokenizer();
  const bool log_prompts = core.options().log_prompts;
  for (PromptInput& p : req.prompts) {
    if (p.is_tokens) {
      for (int32_t id : p.token_ids)
        if (id >= tok.n_vocab())
          return bad_request("token id " + std::to_string(id) + " in 'prompt' is outside the vocabulary of " +
                                 std::to_string(tok.n_vocab()) + " tokens",
                             "prompt");
      pg.prompts.push_back(std::move(p.token_ids));
    } else {
      if (auto e = core.surely_too_long(p.text, req.max_tokens)) return *e;
      pg.prompts.push_back(tok.encode(p.text, /*add_special=*/true, /*parse_special=*/true));
    }
    if (log_prompts) pg.prompt_texts.push_back(p.is_tokens ? tok.decode(pg.prompts.back(), true) : p.text);
    if (pg.prompts.back().empty()) return bad_request("'prompt' must not be empty", "prompt");
    if (req.echo) pg.echo_texts.push_back(p.is_tokens ? tok.decode(pg.prompts.back(), true) : p.text);
  }
  if (auto e = core.finish_preparation(pg, /*fill_context=*/false)) return *e;
  return pg;
}

boost::asio::awaitable<void> serve_completions(ServingCore& core, Exchange& ex) {
  const std::string& body = ex.request().body();
  auto work = [&core, &body] { return prepare_completion(core, body); };
  std::variant<PreparedGeneration, ApiError> prepared = co_await core.workers().run(std::move(work));
  if (auto* e = std::get_if<ApiError>(&prepared)) {
    co_await ex.respond(static_cast<http::status>(e->status), "application/json", error_json(*e));
    co_return;
  }
  PreparedGeneration& pg = std::get<PreparedGeneration>(prepared);
  const std::string api_id = "cmpl-" + random_hex(24);
  ChoicesOutput output(core, pg, /*chat=*/false, api_id);
  co_await core.generate(ex, pg, api_id, output);
}

}  // namespace inferd::server
