// Pipeline parallelism over MPI: stage s's leader (rank_layout.h; rank s
// without tensor parallelism) runs stage s of the model's layers
// (Model::layer_begin), with its tensor-parallel peers when there are any
// (tensor_parallel.h). The messages below go between the stages' leaders. Per step, rank 0 runs its layers and sends rank 1 the
// step (step_codec.h) and its residual stream; each rank runs its layers on
// the stream it receives and passes the step and its stream on; the last one
// samples and sends rank 0 the tokens. With a shared head
// (PipelineStage::share_head) the last stage first sends rank 0 its final-norm
// rows, both compute their half of the head at once, and rank 0 sends its
// half back for the last stage to sample. Rank 0 owns the scheduler and the KV
// block allocation: the other ranks' caches have the same blocks (agreed once
// at start) and follow the block tables each step carries.
//
// Several steps are in the pipeline at once (Engine's batches in flight); a
// rank runs them in the order sent. No two ranks wait on each other's
// (blocking) sends: a rank sends only to the next one, which posts its
// receives as soon as it is done with the step before, and rank 0 receives a
// step's samples before it sends the next step on (ModelRunner::hand_on).
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "distributed/mpi_world.h"
#include "distributed/step_codec.h"
#include "distributed/tensor_parallel.h"
#include "engine/model_runner.h"
#include "engine/pipeline_link.h"
#include "model/model.h"

namespace inferd::distributed {

// Where a stage's time went, logged when the pipeline ends: the share of it
// the stage waited for its input (rank 0: for the last stage's samples). A
// stage that waits a large share is lighter than the one it waits on (the
// balance of pipeline_layers, or rank 0's own engine work). The clock starts
// at the first step's arrival; waits before it are not the pipeline's.
class StageClock {
 public:
  using Clock = std::chrono::steady_clock;
  // The first call starts the clock at `t`.
  void start(Clock::time_point t) {
    if (!started_) started_ = t;
  }
  bool started() const { return started_.has_value(); }
  void waited_since(Clock::time_point t0) { waited_ += std::chrono::duration<double>(Clock::now() - t0).count(); }
  void step() { ++steps_; }
  void log(int rank) const;

 private:
  std::optional<Clock::time_point> started_;
  int64_t steps_ = 0;
  double waited_ = 0;
};

// Rank 0's side (engine/pipeline_link.h).
class MpiPipelineLink final : public PipelineLink {
 public:
  explicit MpiPipelineLink(const MpiWorld& world) : world_(world) {}
  ~MpiPipelineLink() override { shutdown(); }
  // Tells the other stages to end their loops (once; the destructor does it
  // if nobody did).
  void shutdown();

  int32_t agree_on_blocks(int32_t local) override;
  void add_request(const std::string& id, const SamplingRequest& request) override;
  void remove_request(const std::string& id) override;
  size_t num_requests() const override { return registered_.size(); }
  int32_t num_stages() const override { return world_.layout().pipeline; }
  void send_step(const SchedulerOutput& out, const StepSamplingInputs& inputs) override;
  void send_hidden(const std::vector<float>& hidden) override;
  void receive_output(ModelRunnerOutput& output) override;
  void receive_head_input(std::vector<float>& normed) override;
  void send_head_part(const std::vector<float>& logits) override;

 private:
  const MpiWorld& world_;
  std::vector<SamplingEvent> events_;  // since the last step
  std::unordered_set<std::string> registered_;
  std::vector<uint8_t> bytes_;  // reused
  bool shut_down_ = false;
  StageClock clock_;  // waits for the samples, from the first receive on
};

// The block count every stage agrees on (the least offered): the collective
// MpiPipelineLink::agree_on_blocks takes part in on rank 0.
int32_t agree_on_blocks(const MpiWorld& world, int32_t local);

// The leader of a stage other than the first: makes its stage's runner (as
// rank 0's engine makes its own, from the same config), hands each step (and
// stream) to its peers and runs it, until rank 0 says it is done.
// `comm`: its stage's collectives, when it has peers (their latency is logged
// at the end).
Status run_pipeline_worker(const MpiWorld& world, Model& model, ModelRunnerConfig config,
                           MpiTensorComm* comm = nullptr);

}  // namespace inferd::distributed
