// The engine as the Python package drives it, without Python in sight (the
// bindings in module.cpp are a thin layer over this).
//
// A Session loads a model and runs one Engine on its own loop thread, as the
// server does: requests from Python reach it through add_request and come back
// through their RequestStreams. A RequestGroup is one caller's set of
// requests (one LLM.generate call, one stream, one AsyncLLM): each of its
// streams announces new output to the group's Mailbox, so the caller sleeps
// until something arrives and then reads only the streams that have output.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/chat_prompt.h"
#include "chat/chat_template.h"
#include "core/result.h"
#include "engine/engine.h"
#include "model/model.h"

namespace inferd::python {

struct SessionOptions {
  std::string model;        // a GGUF file
  EngineConfig engine;
  int threads = 0;          // the forward pass's threads; 0: one per hardware thread
  std::string chat_template;  // a template file overriding the model's; empty: the model's
};

class Session {
 public:
  // Loads the model and starts the engine's loop. Fails with the loader's or
  // the engine's message.
  static Result<std::unique_ptr<Session>> open(const SessionOptions& options);
  ~Session();  // stops the loop; unfinished requests end with "abort"
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Engine& engine() { return *engine_; }
  const EngineConfig& config() const { return engine_->config(); }
  const Tokenizer& tokenizer() const { return model_->tokenizer(); }
  const Model& model() const { return *model_; }
  bool has_chat_template() const { return template_.has_value(); }

  struct RenderedChat {
    std::string text;                // the conversation as the template wrote it
    std::vector<int32_t> token_ids;  // as the server tokenizes it (chat_prompt.h)
  };
  // A conversation through the model's chat template (or `template_source`
  // when not empty), rendered and tokenized as the server's chat route does.
  Result<RenderedChat> render_chat(const std::vector<ChatMessage>& messages, const ChatPromptOptions& options,
                                   const std::string& template_source = {}) const;

 private:
  Session() = default;
  std::unique_ptr<Model> model_;
  std::optional<ChatTemplate> template_;
  std::unique_ptr<Engine> engine_;  // after model_: destroyed first
};

// Where a group's streams say they have output (called on the engine's
// thread, with no lock of the stream's held). Optionally an eventfd too, for
// an event loop to watch (asyncio's add_reader).
class Mailbox {
 public:
  explicit Mailbox(bool with_fd);
  ~Mailbox();  // closes the eventfd (a Mailbox is not copyable: it holds a mutex)

  void post(const std::string& request_id);
  // The ids posted since the last take (repeats possible), waiting up to
  // `timeout` for one when there is none. Clears the eventfd.
  std::vector<std::string> take(std::chrono::nanoseconds timeout);
  int fd() const { return fd_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> ready_;
  int fd_ = -1;
};

// One caller's requests. Not for concurrent use by several threads.
class RequestGroup {
 public:
  RequestGroup(Session& session, bool with_fd);
  ~RequestGroup();  // aborts the unfinished requests: their KV blocks are freed within a step
  RequestGroup(const RequestGroup&) = delete;
  RequestGroup& operator=(const RequestGroup&) = delete;

  // Adds `n` choices of one request, as the server does for its `n`: choice k
  // is seeded choice_seed(seed, k). Returns their engine ids, in choice
  // order. All or none: when the engine refuses one, those added are aborted.
  Result<std::vector<std::string>> add(const GenerationParams& params, int32_t n);

  // Streaming: the outputs ready now, in arrival order; when there is none,
  // waits up to `timeout` for one.
  std::vector<RequestOutput> poll(std::chrono::nanoseconds timeout);

  // Whole outputs: folds what arrives into each request's whole output, and
  // returns how many requests finished since the last call, waiting up to
  // `timeout` for one to finish when none has.
  int64_t gather(std::chrono::nanoseconds timeout);
  // A request's outputs so far, folded (gather); nullptr for an unknown id.
  const RequestOutput* whole(const std::string& request_id) const;

  void abort(const std::string& request_id);
  void abort_unfinished();
  size_t unfinished() const { return unfinished_; }
  int fd() const { return mailbox_->fd(); }

 private:
  struct Member {
    std::shared_ptr<RequestStream> stream;
    bool finished = false;
    RequestOutput whole;  // gather()'s fold
  };
  // Reads every output of the streams in `ids` (their first mention), giving
  // each to `take`; returns how many requests finished.
  template <class Take>
  int64_t drain(const std::vector<std::string>& ids, Take&& take);

  Session& session_;
  std::shared_ptr<Mailbox> mailbox_;
  std::unordered_map<std::string, Member> members_;
  size_t unfinished_ = 0;
};

}  // namespace inferd::python
