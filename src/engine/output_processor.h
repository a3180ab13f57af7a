// The output processor: what a client sees of the tokens the engine core
// decided. Apart from the step loop, as vLLM's OutputProcessor is apart from
// its EngineCore: it detokenizes each request's tokens incrementally, finds
// stop strings (and reports them back: only the core finishes a request in
// the scheduler), renders a finished beam's text, and pushes the step's
// RequestOutput deltas to their streams at the end of the step, so a client
// that sees an output also sees the stats of the step that made it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/request_output.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

// Where the earliest of `stops` begins in `text` at or after `from` (the
// longest if several begin there), or npos; *which is set to it.
size_t find_stop_string(const std::string& text, const std::vector<std::string>& stops, size_t from,
                        std::string* which);

// One sequence's text: incremental detokenization and its stop strings.
class RequestText {
 public:
  RequestText(const Tokenizer& tokenizer, bool render_special, std::vector<std::string> stop)
      : decoder_(tokenizer, render_special), render_special_(render_special), stop_(std::move(stop)) {}

  // Appends the text of a step's new tokens; `last_stopped` says the last
  // one stopped the request (EOS, an end-of-generation or stop token), which
  // is not text even when control tokens are rendered ("</s>" would end the
  // answer; vLLM leaves it out too). Returns how many tokens to keep: fewer
  // when a stop string is completed by a token before the last (accepted
  // drafts), which ends the request there, as a plain step would have.
  size_t append(const std::vector<int32_t>& tokens, bool last_stopped);
  // Text that can be emitted now; sets *stop_at to a matched stop string, if
  // any (the text before it is returned, the rest dropped). Holds back a tail
  // that could still begin a stop string, unless `final`.
  std::string release(bool final, std::string* stop_at);

  const std::vector<std::string>& stop() const { return stop_; }
  bool render_special() const { return render_special_; }

 private:
  bool holds_stop_string() const;

  IncrementalDecoder decoder_;
  bool render_special_;
  std::vector<std::string> stop_;
  std::string held_;  // decoded text not yet emitted (a stop string could start in it)
};

// A beam search's text side: with stop strings, each live beam's text so far,
// so a candidate token is checked without decoding the beam again; and the
// final text of a finished beam.
class BeamText {
 public:
  BeamText(const Tokenizer& tokenizer, bool render_special, std::vector<std::string> stop);
  bool tracks() const { return !stop_.empty(); }  // without stop strings no beam's text is kept
  // Live beam `beam`'s text would end in a stop string with `token` next.
  bool completes_stop_string(size_t beam, int32_t token) const;
  // After a step: the live beams are children of the previous ones
  // (parents[i] the previous beam of child i, which appended tokens[i]).
  void advance(const std::vector<size_t>& parents, const std::vector<int32_t>& tokens);
  // The text a request with these tokens would have emitted, cut before its
  // first stop string (then *stop_at is set to it). `stopped`: the last token
  // stopped the sequence (left out of a rendered text).
  std::string render(const std::vector<int32_t>& tokens, bool stopped, std::string* stop_at) const;

 private:
  struct Text {
    IncrementalDecoder decoder;
    std::string text;
  };
  const Tokenizer& tokenizer_;
  bool render_special_;
  std::vector<std::string> stop_;
  size_t longest_stop_ = 0;
  std::vector<Text> texts_;  // per live beam (only with stop strings)
};

// The step's outputs, queued as the step makes them and pushed at its end.
class OutputProcessor {
 public:
  void emit(std::shared_ptr<RequestStream> stream, RequestOutput out) {
    emitted_.emplace_back(std::move(stream), std::move(out));
  }
  // Pushes the queued outputs to their streams (calling `on_finished` with
  // each final one first) and returns them.
  std::vector<RequestOutput> flush(const std::function<void(const RequestOutput&)>& on_finished);

 private:
  std::vector<std::pair<std::shared_ptr<RequestStream>, RequestOutput>> emitted_;
};

}  // namespace inferd
