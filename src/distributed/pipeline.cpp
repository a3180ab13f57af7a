#include "distributed/pipeline.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>

#include "distributed/mpi_messages.h"
#include "distributed/tensor_parallel.h"

namespace inferd::distributed {

namespace {

enum Tag : int { kStepTag = 1, kHiddenTag = 2, kOutputTag = 3 };

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
  spdlog::info("rank {} (pid {}): pipeline stage of layers [{}, {}){}, KV cache {} blocks ({} bytes)", rank,
               getpid(), model.layer_begin(), model.layer_end(), peers ? ", tensor-parallel leader" : "",
               runner.n_blocks(), runner.kv_cache_bytes());
  std::vector<uint8_t> bytes;
  std::vector<float> hidden;
  StageClock clock;  // waits for steps and streams
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
    const ModelRunnerOutput& sampled = runner.sample(message->out, message->sampling_inputs(), out);
    send(world, encode_output(sampled), 0, kOutputTag, "sending the samples to rank 0");
  }
}

}  // namespace inferd::distributed
