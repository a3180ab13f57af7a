#include "engine/output_processor.h"

#include <algorithm>

namespace inferd {

size_t find_stop_string(const std::string& text, const std::vector<std::string>& stops, size_t from,
                        std::string* which) {
  size_t best = std::string::npos;
  for (const std::string& stop : stops) {
    const size_t p = text.find(stop, from);
    if (p != std::string::npos && (p < best || (p == best && stop.size() > which->size()))) {
      best = p;
      *which = stop;
    }
  }
  return best;
}

size_t RequestText::append(const std::vector<int32_t>& tokens, bool last_stopped) {
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (render_special_ && last_stopped && t + 1 == tokens.size()) continue;
    held_ += decoder_.push(tokens[t]);
    if (t + 1 < tokens.size() && holds_stop_string()) return t + 1;
  }
  return tokens.size();
}

bool RequestText::holds_stop_string() const {
  for (const std::string& stop : stop_)
    if (held_.find(stop) != std::string::npos) return true;
  return false;
}

std::string RequestText::release(bool final, std::string* stop_at) {
  if (final) held_ += decoder_.flush();
  // The earliest stop string wins (the longest, if several start there).
  if (const size_t at = find_stop_string(held_, stop_, 0, stop_at); at != std::string::npos) {
    std::string out = held_.substr(0, at);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is the start of some stop string: the
  // next tokens could complete it. Everything before it can never be part of
  // a match, since any match would have to start inside the held tail.
  size_t keep = 0;
  if (!final) {
    for (const std::string& s : stop_) {
      for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
        if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
          keep = k;
          break;
        }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

BeamText::BeamText(const Tokenizer& tokenizer, bool render_special, std::vector<std::string> stop)
    : tokenizer_(tokenizer), render_special_(render_special), stop_(std::move(stop)) {
  for (const std::string& s : stop_) longest_stop_ = std::max(longest_stop_, s.size());
  if (tracks()) texts_.push_back({IncrementalDecoder(tokenizer_, render_special_), {}});  // the first beam
}

bool BeamText::completes_stop_string(size_t beam, int32_t token) const {
  if (!tracks()) return false;
  // A new match ends in the new token's text (the beam's text had none).
  Text t = texts_[beam];
  const std::string piece = t.decoder.push(token);
  if (piece.empty()) return false;
  const std::string text = t.text + piece;
  const size_t from = t.text.size() >= longest_stop_ ? t.text.size() - (longest_stop_ - 1) : 0;
  std::string unused;
  return find_stop_string(text, stop_, from, &unused) != std::string::npos;
}

void BeamText::advance(const std::vector<size_t>& parents, const std::vector<int32_t>& tokens) {
  if (!tracks()) return;
  std::vector<Text> texts;
  texts.reserve(parents.size());
  for (size_t i = 0; i < parents.size(); ++i) {
    texts.push_back(texts_[parents[i]]);
    texts.back().text += texts.back().decoder.push(tokens[i]);
  }
  texts_ = std::move(texts);
}

std::string BeamText::render(const std::vector<int32_t>& tokens, bool stopped, std::string* stop_at) const {
  IncrementalDecoder decoder(tokenizer_, render_special_);
  std::string text;
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (render_special_ && stopped && t + 1 == tokens.size()) continue;
    text += decoder.push(tokens[t]);
  }
  text += decoder.flush();
  if (const size_t at = find_stop_string(text, stop_, 0, stop_at); at != std::string::npos) text.resize(at);
  return text;
}

std::vector<RequestOutput> OutputProcessor::flush(const std::function<void(const RequestOutput&)>& on_finished) {
  std::vector<RequestOutput> outputs;
  outputs.reserve(emitted_.size());
  for (auto& [stream, out] : emitted_) {
    if (out.finished && on_finished) on_finished(out);
    stream->push(out);
    outputs.push_back(std::move(out));
  }
  emitted_.clear();
  return outputs;
}

}  // namespace inferd
