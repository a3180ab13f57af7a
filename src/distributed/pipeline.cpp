#include "distributed/pipeline.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include "distributed/mpi_messages.h"

namespace inferd::distributed {

namespace {

enum Tag : int { kStepTag = 1, kHiddenTag = 2, kOutputTag = 3 };

}  // namespace

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
  send(world_, bytes_, 1, kStepTag, "sending a step");
}

void MpiPipelineLink::send_hidden(const std::vector<float>& hidden) {
  send(world_, hidden, 1, kHiddenTag, "sending the residual stream to rank 1");
}

void MpiPipelineLink::receive_output(ModelRunnerOutput& output) {
  receive(world_, bytes_, world_.size() - 1, kOutputTag, "receiving the last stage's samples");
  if (Status s = decode_output(bytes_, output); !s) {
    spdlog::critical("rank 0: {}; ending every rank", s.error().message);
    world_.abort(1);
  }
}

void MpiPipelineLink::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  bytes_ = encode_step(StepMessage::Kind::kShutdown, {}, {}, {});
  send(world_, bytes_, 1, kStepTag, "ending the pipeline");  // each rank passes it on
}

Status run_pipeline_worker(const MpiWorld& world, Model& model, ModelRunnerConfig config) {
  config.pipeline = nullptr;
  config.agree_on_blocks = [&world](int32_t n) { return agree_on_blocks(world, n); };
  auto created = ModelRunner::create(model, config);
  if (!created) return created.error();
  ModelRunner& runner = **created;
  const int rank = world.rank();
  const bool last = rank == world.size() - 1;
  spdlog::info("rank {} (pid {}): pipeline stage of layers [{}, {}), KV cache {} blocks ({} bytes)", rank, getpid(),
               model.layer_begin(), model.layer_end(), runner.n_blocks(), runner.kv_cache_bytes());
  std::vector<uint8_t> bytes;
  std::vector<float> hidden;
  for (;;) {
    receive(world, bytes, rank - 1, kStepTag, "receiving a step");
    auto message = decode_step(bytes);
    if (!message) return message.error();
    if (message->kind == StepMessage::Kind::kShutdown) {
      if (!last) send(world, bytes, rank + 1, kStepTag, "passing on the end of the pipeline");
      return {};
    }
    if (last)
      for (SamplingEvent& e : message->events) {
        if (e.add) runner.add_request(e.request_id, std::move(e.request));
        else runner.remove_request(e.request_id);
      }
    receive(world, hidden, rank - 1, kHiddenTag, "receiving the residual stream");
    std::vector<float>& out = runner.forward_stage(message->out, hidden.data());
    if (!last) {
      // The step goes on with the stream, after this stage's pass: the next
      // rank may still be running the step before.
      send(world, bytes, rank + 1, kStepTag, "passing on a step");
      send(world, out, rank + 1, kHiddenTag, "sending the residual stream");
      continue;
    }
    const ModelRunnerOutput& sampled = runner.sample(message->out, message->sampling_inputs(), out);
    send(world, encode_output(sampled), 0, kOutputTag, "sending the samples to rank 0");
  }
}

}  // namespace inferd::distributed
