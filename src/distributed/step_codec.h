// What crosses the wire between pipeline stages each step, as bytes: rank 0
// sends every other stage a StepMessage (the SchedulerOutput, the sampling
// stage's requests that joined or left, the grammar masks); the last stage
// sends rank 0 its ModelRunnerOutput. Both ends run the same binary, so
// values go in host byte order.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"
#include "engine/sampling_stage.h"
#include "engine/scheduler_output.h"

namespace inferd::distributed {

// A request joining (with its sampling parameters) or leaving the last
// stage's sampling stage; applied in order, before the step.
struct SamplingEvent {
  std::string request_id;
  bool add = true;
  SamplingRequest request;  // add only
};

struct StepMessage {
  enum class Kind : uint8_t { kStep, kShutdown };
  Kind kind = Kind::kStep;
  std::vector<SamplingEvent> events;
  SchedulerOutput out;
  // StepSamplingInputs::allowed, owned: per scheduled request its mask words
  // (empty: unconstrained) and the vocabulary they describe.
  std::vector<std::vector<uint32_t>> masks;
  std::vector<int32_t> mask_vocab;
  // The inputs viewing `masks` (valid while this message lives unmoved).
  StepSamplingInputs sampling_inputs() const;
};

std::vector<uint8_t> encode_step(StepMessage::Kind kind, const std::vector<SamplingEvent>& events,
                                 const SchedulerOutput& out, const StepSamplingInputs& inputs);
Result<StepMessage> decode_step(const std::vector<uint8_t>& bytes);

std::vector<uint8_t> encode_output(const ModelRunnerOutput& output);
// Into `output`, reusing its storage.
Status decode_output(const std::vector<uint8_t>& bytes, ModelRunnerOutput& output);

}  // namespace inferd::distributed
