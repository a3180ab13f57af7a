// The seam between rank 0's model runner and the other stages of a
// pipeline-parallel model (distributed/pipeline_link_mpi.h carries it over
// MPI). The engine schedules as it always does; its runner tells the other
// stages what each step runs, runs its own layers, hands its residual stream
// on, and gets back what the last stage sampled: a few integers per request.
// The sampling stage lives on the last rank, with the logits, so the requests
// that join or leave it travel with the next step.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "engine/sampling_stage.h"
#include "engine/scheduler_output.h"

namespace inferd {

class PipelineLink {
 public:
  virtual ~PipelineLink() = default;
  // The KV block count every stage can hold: the least of the stages'
  // `local` counts (a collective: each stage offers its own once, at start).
  virtual int32_t agree_on_blocks(int32_t local) = 0;
  // The last stage's sampling state: registered (or forgotten) there before
  // the next step runs, in the order of these calls.
  virtual void add_request(const std::string& id, const SamplingRequest& request) = 0;
  virtual void remove_request(const std::string& id) = 0;
  virtual size_t num_requests() const = 0;  // registered there
  virtual int32_t num_stages() const = 0;   // this one included
  // Sends a step to the second stage, which passes it on with its stream.
  virtual void send_step(const SchedulerOutput& out, const StepSamplingInputs& inputs) = 0;
  // Hands the first stage's residual stream (tokens x n_embd) to the second.
  virtual void send_hidden(const std::vector<float>& hidden) = 0;
  // What the last stage sampled for the oldest step sent and not yet received
  // (steps come back in the order they were sent).
  virtual void receive_output(ModelRunnerOutput& output) = 0;
  // A head shared by the first and last stages (PipelineStage::share_head),
  // before receive_output of the same step: the last stage's final-norm rows
  // (rows x n_embd), then this stage's part of their logits (rows x its head
  // rows) back to it, which samples the joined rows.
  virtual void receive_head_input(std::vector<float>& normed) = 0;
  virtual void send_head_part(const std::vector<float>& logits) = 0;
};

}  // namespace inferd
