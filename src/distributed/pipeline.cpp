#include "distributed/pipeline.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "distributed/mpi_messages.h"
#include "distributed/tensor_parallel.h"

namespace inferd::distributed {

namespace {

enum Tag : int { kStepTag = 1, kHiddenTag = 2, kOutputTag = 3, kHeadInputTag = 4, kHeadPartTag = 5 };

// The sampled rows' logits from the first stage's head rows (the first
// columns of each row) and the last stage's (the rest).
void join_head_logits(const std::vector<float>& first, const std::vector<float>& last, int64_t last_rows,
                      std::vector<float>& joined) {
  const int64_t n = last_rows > 0 ? static_cast<int64_t>(last.size()) / last_rows : 0;
  const int64_t first_rows = n > 0 ? static_cast<int64_t>(first.size()) / n : 0;
  joined.resize(first.size() + last.size());
  for (int64_t r = 0; r < n; ++r) {
    float* row = joined.data() + r * (first_rows + last_rows);
    std::copy_n(first.data() + r * first_rows, first_rows, row);
    std::copy_n(last.data() + r * last_rows, last_rows, row + first_rows);
  }
}

}  // namespace

void StageClock::log(int rank) const {
  if (steps_ == 0) return;
  const double total = std::chrono::duration<double>(Clock::now() - *started_).count();
  spdlog::info("rank {}: {} steps in the pipeline; waited {:.3f} s of {:.3f} s ({:.1f}%) for {}", rank, steps_, waited_,
               total, total > 0 ? 100.0 * waited_ / total : 0.0, rank == 0 ? "the last stage's samples" : "its input");
}

int32_t agree_on_blocks(const MpiWorld& world, int32_t local) {
  int32_t agreed = 0;
  check(world, MPI_Allreduce(&local, &agreed, 1, MPI_INT32_T, MPI_MIN, world.pipeline_comm()),
        "agreeing on the KV block count");
  return agreed;
}

int32_t MpiPipelineLink::agree_on_blocks(int32_t local) { return distributed::agree_on_blocks(world_, local); }

void MpiPipelineLink::add_request(const std::string& id, const SamplingRequest& request) {
  events_.push_back({id, true, request});
  registered_.insert(id);
}

void MpiPipelineLink::remove_request(const std::string& id) {
  if (registered_.erase(id) == 0) return;  // as SamplingStage: unknown ids are a no-op
  events_.push_back({id, false, {}});
}

void MpiPipelineLink::send_step(const SchedulerOutput& out, const StepSamplingInputs& inputs) {
  bytes_ = encode_step(StepMessage::Kind::kStep, events_, out, inputs);
  events_.clear();
  send(world_, bytes_, world_.layout().leader(1), kStepTag, "sending a step");
}

void MpiPipelineLink::send_hidden(const std::vector<float>& hidden) {
  send(world_, hidden, world_.layout().leader(1), kHiddenTag, "sending the residual stream to the second stage");
}

void MpiPipelineLink::receive_output(ModelRunnerOutput& output) {
  const auto t0 = StageClock::Clock::now();
  clock_.start(t0);
  receive(world_, bytes_, world_.layout().last_leader(), kOutputTag, "receiving the last stage's samples");
  clock_.waited_since(t0);
  clock_.step();
  if (Status s = decode_output(bytes_, output); !s) {
    spdlog::critical("rank 0: {}; ending every rank", s.error().message);
    world_.abort(1);
  }
}

void MpiPipelineLink::receive_head_input(std::vector<float>& normed) {
  const auto t0 = StageClock::Clock::now();
  clock_.start(t0);
  receive(world_, normed, world_.layout().last_leader(), kHeadInputTag, "receiving the last stage's final-norm rows");
  clock_.waited_since(t0);
}

void MpiPipelineLink::send_head_part(const std::vector<float>& logits) {
  send(world_, logits, world_.layout().last_leader(), kHeadPartTag, "sending the first stage's head logits");
}

void MpiPipelineLink::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  clock_.log(world_.rank());
  bytes_ = encode_step(StepMessage::Kind::kShutdown, {}, {}, {});
  // Each stage's leader passes it on (and to its peers).
  send(world_, bytes_, world_.layout().leader(1), kStepTag, "ending the pipeline");
}

Status run_pipeline_worker(const MpiWorld& world, Model& model, ModelRunnerConfig config, MpiTensorComm* comm) {
  config.pipeline = nullptr;
  config.tensor_parallel = nullptr;
  config.agree_on_blocks = [&world](int32_t n) { return agree_on_blocks(world, n); };
  auto created = ModelRunner::create(model, config);
  if (!created) return created.error();
  ModelRunner& runner = **created;
  const int rank = world.rank();
  const RankLayout& layout = world.layout();
  const int stage = layout.stage_of(rank);
  const bool last = layout.last_stage(rank), peers = layout.tensor > 1;
  const int previous = layout.leader(stage - 1), next = last ? 0 : layout.leader(stage + 1);
  const ShardRange head = model.head_rows();
  spdlog::info("rank {} (pid {}): pipeline stage of layers [{}, {}){}{}, KV cache {} blocks ({} bytes)", rank,
               getpid(), model.layer_begin(), model.layer_end(), peers ? ", tensor-parallel leader" : "",
               model.head_shared() ? fmt::format(", head rows [{}, {})", head.begin, head.end) : "",
               runner.n_blocks(), runner.kv_cache_bytes());
  std::vector<uint8_t> bytes;
  std::vector<float> hidden, first_head, joined;
  StageClock clock;  // waits for steps and streams (and a shared head's other half)
  for (;;) {
    const auto t0 = StageClock::Clock::now();
    receive(world, bytes, previous, kStepTag, "receiving a step");
    if (clock.started()) clock.waited_since(t0);
    else clock.start(StageClock::Clock::now());
    auto message = decode_step(bytes);
    if (!message) return message.error();
    if (message->kind == StepMessage::Kind::kShutdown) {
      clock.log(rank);
      if (comm) log_collective_latency(world, *comm);
      if (peers) hand_to_peers(world, bytes, nullptr);
      if (!last) send(world, bytes, next, kStepTag, "passing on the end of the pipeline");
      return {};
    }
    if (last)
      for (SamplingEvent& e : message->events) {
        if (e.add) runner.add_request(e.request_id, std::move(e.request));
        else runner.remove_request(e.request_id);
      }
    const auto t1 = StageClock::Clock::now();
    receive(world, hidden, previous, kHiddenTag, "receiving the residual stream");
    clock.waited_since(t1);
    clock.step();
    // The stage's peers run the same pass on their shards beside this one.
    if (peers) hand_to_peers(world, bytes, &hidden);
    std::vector<float>& out = runner.forward_stage(message->out, hidden.data());
    if (!last) {
      // The step goes on with the stream, after this stage's pass: the next
      // stage may still be running the step before.
      send(world, bytes, next, kStepTag, "passing on a step");
      send(world, out, next, kHiddenTag, "sending the residual stream");
      continue;
    }
    std::vector<float>* logits = &out;
    if (model.head_shared()) {
      // Rank 0 computes the head's first rows from these final-norm rows
      // while this stage computes the rest.
      send(world, out, 0, kHeadInputTag, "sending the final-norm rows to the first stage");
      const std::vector<float>& own = runner.head_logits(out);
      const auto t2 = StageClock::Clock::now();
      receive(world, first_head, 0, kHeadPartTag, "receiving the first stage's head logits");
      clock.waited_since(t2);
      join_head_logits(first_head, own, model.head_rows().size(), joined);
      logits = &joined;
    }
    const ModelRunnerOutput& sampled = runner.sample(message->out, message->sampling_inputs(), *logits);
    send(world, encode_output(sampled), 0, kOutputTag, "sending the samples to rank 0");
  }
}

}  // namespace inferd::distributed
