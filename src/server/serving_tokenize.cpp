#include "server/serving_tokenize.h"

#include <nlohmann/json.hpp>

namespace inferd::server {

using json = nlohmann::json;

namespace {

std::variant<std::string, ApiError> tokenize(const ServingCore& core, const std::string& text) {
  auto parsed_body = parse_object(text);
  if (auto* e = std::get_if<ApiError>(&parsed_body)) return *e;
  const json& body = std::get<json>(parsed_body);
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    // The chat parser validates the messages.
    json chat = {{"messages", body.at("messages")}};
    auto parsed = parse_chat_request(chat.dump(), core.options().limits);
    if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
    auto agp = body.find("add_generation_prompt");
    if (agp != body.end() && !agp->is_boolean())
      return bad_request("'add_generation_prompt' must be a boolean", "add_generation_prompt");
    auto prompt = core.render_chat(std::get<GenerationRequest>(parsed).messages, agp == body.end() || agp->get<bool>(), "");
    if (auto* e = std::get_if<ApiError>(&prompt)) return *e;
    ids = tokenize_chat_prompt(core.tokenizer(), std::get<ChatPrompt>(prompt));
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || !it->is_string()) return bad_request("'prompt' (a string) or 'messages' is required", "prompt");
    auto special = body.find("add_special_tokens");
    if (special != body.end() && !special->is_boolean())
      return bad_request("'add_special_tokens' must be a boolean", "add_special_tokens");
    const bool add_special = special == body.end() || special->get<bool>();
    ids = core.tokenizer().encode(it->get<std::string>(), add_special, /*parse_special=*/true);
  }
  return dump_json(json{{"count", ids.size()}, {"max_model_len", core.engine().config().max_model_len}, {"tokens", ids}});
}

std::string tokenizer_info_json(const ServingCore& core) {
  const Tokenizer& tok = core.tokenizer();
  auto piece = [&](int32_t id) { return id >= 0 ? json(tok.token_to_piece(id, true)) : json(nullptr); };
  json info = {{"tokenizer_class", "inferd"},
               {"eos_token", piece(tok.eos_id())},
               {"bos_token", piece(tok.bos_id())},
               {"pad_token", nullptr},
               {"model_max_length", core.engine().config().max_model_len},
               {"chat_template", core.chat_template() ? json(core.chat_template()->source()) : json(nullptr)}};
  return dump_json(info);
}

std::variant<std::string, ApiError> detokenize(const ServingCore& core, const std::string& text) {
  auto parsed_body = parse_object(text);
  if (auto* e = std::get_if<ApiError>(&parsed_body)) return *e;
  const json& body = std::get<json>(parsed_body);
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array())
    return bad_request("'tokens' (an array of token ids) is required", "tokens");
  const int32_t n_vocab = core.tokenizer().n_vocab();
  std::vector<int32_t> ids;
  for (const json& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab)
      return bad_request("'tokens' must hold token ids in [0, " + std::to_string(n_vocab) + ")", "tokens");
    ids.push_back(t.get<int32_t>());
  }
  return dump_json(json{{"prompt", core.tokenizer().decode(ids, /*render_special=*/false)}});
}

}  // namespace

boost::asio::awaitable<void> serve_tokenize(ServingCore& core, Exchange& ex, bool to_ids) {
  const std::string& body = ex.request().body();
  auto work = [&core, &body, to_ids] { return to_ids ? tokenize(core, body) : detokenize(core, body); };
  std::variant<std::string, ApiError> result = co_await core.workers().run(std::move(work));
  if (auto* e = std::get_if<ApiError>(&result))
    co_await ex.respond(static_cast<http::status>(e->status), "application/json", error_json(*e));
  else
    co_await ex.respond(http::status::ok, "application/json", std::get<std::string>(result));
}

boost::asio::awaitable<void> serve_tokenizer_info(ServingCore& core, Exchange& ex) {
  co_await ex.respond(http::status::ok, "application/json", tokenizer_info_json(core));
}

}  // namespace inferd::server
