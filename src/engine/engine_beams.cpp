// Beam search, a client of the engine's step loop: between execute() and
// update() each group whose beams all sampled picks its children from their
// candidates (the sampling stage's per-beam top-k logprobs); after update()
// it drops beams without children, forks the others' further children
// (Scheduler::fork), and ends the searches that are done.
#include <algorithm>
#include <unordered_map>

#include "engine/engine.h"

namespace inferd {

namespace {
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

std::vector<Engine::BeamAdvance> Engine::select_beams(const SchedulerOutput& out, const ModelRunnerOutput& sampled) {
  std::vector<BeamAdvance> advanced;
  std::unordered_map<std::string, size_t> scheduled_at;  // beams with a row this step
  std::vector<std::string> groups;                       // their requests, in the order of the step
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    if (!out.scheduled[i].sample || !beam_owner_.count(out.scheduled[i].request_id)) continue;
    scheduled_at[out.scheduled[i].request_id] = i;
    const std::string& request_id = beam_owner_.at(out.scheduled[i].request_id);
    if (std::find(groups.begin(), groups.end(), request_id) == groups.end()) groups.push_back(request_id);
  }
  for (const std::string& request_id : groups) {
    Live& live = live_.at(request_id);
    BeamGroup& g = *live.beams;
    // A group advances only on a step that gave every live beam a row, so
    // its beams always have the same length (the others' rows are not used).
    if (!std::all_of(g.ids.begin(), g.ids.end(), [&](const std::string& b) { return scheduled_at.count(b) > 0; }))
      continue;
    std::vector<std::vector<TokenLogprob>> candidates;
    for (const std::string& b : g.ids) candidates.push_back(sampled.requests[scheduled_at.at(b)].beam_candidates);
    const Request& first = *scheduler_.find(g.ids[0]);  // the beams share prompt and stop conditions
    const auto ends = [&](int32_t beam, int32_t token) {
      if (first.is_stop_token(token)) return BeamEnd::kStopToken;
      if (g.text->completes_stop_string(static_cast<size_t>(beam), token)) return BeamEnd::kStopString;
      return BeamEnd::kNone;
    };
    BeamAdvance a{request_id, g.search.step(candidates, ends)};
    // Each beam's first child is its own next token; update() appends it.
    std::vector<bool> continued(g.ids.size(), false);
    for (const BeamChild& c : a.children)
      if (!continued[c.parent]) {
        continued[c.parent] = true;
        sampled_[scheduled_at.at(g.ids[c.parent])] = {c.token};
      }
    generation_tokens_ += static_cast<int64_t>(g.ids.size());
    advanced.push_back(std::move(a));
  }
  return advanced;
}

void Engine::apply_beams(const std::vector<BeamAdvance>& advanced, double t_token) {
  for (const BeamAdvance& a : advanced) {
    auto it = live_.find(a.request_id);
    if (it == live_.end()) continue;
    Live& live = it->second;
    BeamGroup& g = *live.beams;
    std::vector<bool> continued(g.ids.size(), false);
    for (const BeamChild& c : a.children) continued[c.parent] = true;
    // Dropped first: a group never holds more than beam_width beams.
    for (size_t p = 0; p < g.ids.size(); ++p)
      if (!continued[p]) {
        scheduler_.drop_beam(g.ids[p]);
        beam_owner_.erase(g.ids[p]);
        runner_->remove_request(g.ids[p]);
      }
    std::fill(continued.begin(), continued.end(), false);
    std::vector<std::string> ids;
    std::vector<size_t> parents;  // of the children that live on, in ids' order
    std::vector<int32_t> tokens;
    std::string error;
    for (const BeamChild& c : a.children) {
      if (!continued[c.parent]) {
        continued[c.parent] = true;
        ids.push_back(g.ids[c.parent]);
      } else {
        ids.push_back(a.request_id + kBeamSuffix + str(g.next_beam++));
        if (Status st = scheduler_.fork(g.ids[c.parent], ids.back(), c.token); !st) {
          error = st.error().message;  // a bug: end the search rather than go on without a beam
          ids.pop_back();
          break;
        }
        beam_owner_[ids.back()] = a.request_id;
        runner_->add_request(ids.back(), {.kind = SamplingRequest::Kind::kBeam,
                                          .beam_candidates = g.search.candidates_per_beam()});
      }
      parents.push_back(static_cast<size_t>(c.parent));
      tokens.push_back(c.token);
    }
    // The children live on; parents without children were dropped above.
    g.ids = std::move(ids);
    g.text->advance(parents, tokens);
    live.metrics.token_times.push_back(t_token);
    if (live.metrics.first_token_time == 0.0) live.metrics.first_token_time = t_token;
    live.metrics.last_token_time = t_token;
    if (!error.empty()) {
      release(a.request_id);
      RequestOutput o;
      o.error = "internal error: " + error;
      finish(a.request_id, RequestStatus::kFinishedAborted, std::move(o));
    } else if (g.search.done()) {
      finish_beam_search(a.request_id);
    }
  }
}

void Engine::finish_beam_search(const std::string& request_id) {
  Live& live = live_.at(request_id);
  RequestOutput out;
  for (const Beam& b : live.beams->search.finished()) {
    BeamOutput beam;
    beam.token_ids = b.token_ids;
    beam.cumulative_logprob = b.cumulative_logprob;
    beam.status = b.end == BeamEnd::kLength ? RequestStatus::kFinishedLength : RequestStatus::kFinishedStopped;
    // The text a request with these tokens would have emitted (run_step).
    beam.text = live.beams->text->render(b.token_ids, b.end == BeamEnd::kStopToken, &beam.stop_string);
    if (!beam.stop_string.empty()) beam.status = RequestStatus::kFinishedStopped;
    out.beams.push_back(std::move(beam));
  }
  RequestStatus status = RequestStatus::kFinishedLength;
  if (!out.beams.empty()) {
    out.token_ids = out.beams[0].token_ids;
    out.text = out.beams[0].text;
    out.stop_string = out.beams[0].stop_string;
    status = out.beams[0].status;
  }
  live.metrics.num_output_tokens = static_cast<int64_t>(out.token_ids.size());
  release(request_id);  // every beam has been dropped already; this forgets the group
  finish(request_id, status, std::move(out));
}

}  // namespace inferd
