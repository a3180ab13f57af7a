#include "python/session.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <unordered_set>

#include "model/architecture.h"

namespace inferd::python {

Result<std::unique_ptr<Session>> Session::open(const SessionOptions& options) {
  std::unique_ptr<Session> s(new Session());
  LoadOptions load;
  load.n_threads = options.threads;
  load.numerics = options.engine.numerics;
  auto model = Model::load(options.model, load);
  if (!model) return make_error("cannot load model '" + options.model + "': " + model.error().message);
  s->model_ = std::move(*model);
  if (!s->model_->can_generate())
    return make_error(unsupported_architecture_message(s->model_->config().architecture));
  const std::string model_template = s->model_->chat_template();
  if (!options.chat_template.empty() || !model_template.empty()) {
    auto t = select_chat_template(model_template, options.chat_template);
    if (!t) return make_error("chat template: " + t.error().message);
    s->template_ = std::move(t.value());
  }
  auto engine = Engine::create(*s->model_, options.engine);
  if (!engine) return engine.error();
  s->engine_ = std::move(*engine);
  s->engine_->start();
  return s;
}

Session::~Session() {
  if (!engine_) return;
  engine_->stop();
  engine_->abort_all();  // streams still get their final output
}

Result<Session::RenderedChat> Session::render_chat(const std::vector<ChatMessage>& messages,
                                                   const ChatPromptOptions& options,
                                                   const std::string& template_source) const {
  std::optional<ChatTemplate> given;
  if (!template_source.empty()) given.emplace(template_source);
  const ChatTemplate* tmpl = given ? &*given : template_ ? &*template_ : nullptr;
  if (!tmpl) return make_error("this model has no chat template; pass chat_template= (the template's text)");
  auto prompt = render_chat_prompt(*tmpl, tokenizer(), messages, options);
  if (!prompt) return prompt.error();
  RenderedChat out;
  out.token_ids = tokenize_chat_prompt(tokenizer(), *prompt);
  out.text = std::move(prompt->text);
  return out;
}

Mailbox::Mailbox(bool with_fd) {
  if (with_fd) fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

Mailbox::~Mailbox() {
  if (fd_ >= 0) close(fd_);
}

void Mailbox::post(const std::string& request_id) {
  bool was_empty = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    was_empty = ready_.empty();
    ready_.push_back(request_id);
  }
  // One wake-up per batch of posts: take() empties the list (and clears the
  // fd), and the next post into an empty list wakes it again. A step posts
  // once per running request; waking the caller for each would put a third
  // thread on the cores between the forward pass's barriers.
  if (!was_empty) return;
  cv_.notify_one();
  if (fd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(fd_, &one, sizeof one);
  }
}

std::vector<std::string> Mailbox::take(std::chrono::nanoseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (ready_.empty() && timeout.count() > 0) cv_.wait_for(lock, timeout, [&] { return !ready_.empty(); });
  std::vector<std::string> out;
  out.swap(ready_);
  if (fd_ >= 0) {
    uint64_t count = 0;
    [[maybe_unused]] ssize_t n = read(fd_, &count, sizeof count);
  }
  return out;
}

RequestGroup::RequestGroup(Session& session, bool with_fd)
    : session_(session), mailbox_(std::make_shared<Mailbox>(with_fd)) {}

RequestGroup::~RequestGroup() { abort_unfinished(); }

Result<std::vector<std::string>> RequestGroup::add(const GenerationParams& params, int32_t n) {
  if (n < 1) return make_error("n must be at least 1, got " + std::to_string(n));
  std::vector<std::string> ids;
  for (int32_t k = 0; k < n; ++k) {
    GenerationParams p = params;
    p.sampling.seed = choice_seed(params.sampling.seed, k);
    if (n > 1 && !params.request_id.empty()) p.request_id = params.request_id + "-" + std::to_string(k);
    auto handle = session_.engine().add_request(std::move(p));
    if (!handle) {
      for (const std::string& id : ids) abort(id);
      return handle.error();
    }
    const std::string id = handle->request_id;
    std::weak_ptr<Mailbox> mailbox = mailbox_;
    handle->stream->set_listener([mailbox, id] {
      if (auto m = mailbox.lock()) m->post(id);
    });
    members_[id].stream = std::move(handle->stream);
    ++unfinished_;
    mailbox_->post(id);  // outputs pushed before the listener was set are announced by no one else
    ids.push_back(id);
  }
  return ids;
}

template <class Take>
int64_t RequestGroup::drain(const std::vector<std::string>& ids, Take&& take) {
  int64_t finished = 0;
  std::unordered_set<std::string> seen;
  for (const std::string& id : ids) {
    if (!seen.insert(id).second) continue;
    auto it = members_.find(id);
    if (it == members_.end() || it->second.finished) continue;
    Member& m = it->second;
    while (std::optional<RequestOutput> out = m.stream->try_next()) {
      const bool last = out->finished;
      take(m, std::move(*out));
      if (last) {
        m.finished = true;
        --unfinished_;
        ++finished;
        break;
      }
    }
  }
  return finished;
}

std::vector<RequestOutput> RequestGroup::poll(std::chrono::nanoseconds timeout) {
  std::vector<RequestOutput> outputs;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::max(std::chrono::nanoseconds(0),
                               std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   deadline - std::chrono::steady_clock::now()));
    drain(mailbox_->take(left), [&](Member&, RequestOutput&& out) { outputs.push_back(std::move(out)); });
    if (!outputs.empty() || left.count() == 0 || unfinished_ == 0) return outputs;
  }
}

int64_t RequestGroup::gather(std::chrono::nanoseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::max(std::chrono::nanoseconds(0),
                               std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   deadline - std::chrono::steady_clock::now()));
    const int64_t finished =
        drain(mailbox_->take(left), [](Member& m, RequestOutput&& out) { accumulate(m.whole, std::move(out)); });
    if (finished > 0 || left.count() == 0 || unfinished_ == 0) return finished;
  }
}

const RequestOutput* RequestGroup::whole(const std::string& request_id) const {
  auto it = members_.find(request_id);
  return it == members_.end() ? nullptr : &it->second.whole;
}

void RequestGroup::abort(const std::string& request_id) {
  auto it = members_.find(request_id);
  if (it != members_.end() && !it->second.finished) session_.engine().abort(request_id);
}

void RequestGroup::abort_unfinished() {
  for (const auto& [id, m] : members_)
    if (!m.finished) session_.engine().abort(id);
}

}  // namespace inferd::python
