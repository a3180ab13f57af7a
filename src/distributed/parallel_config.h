// How a model is split across processes: vLLM's --tensor-parallel-size T and
// --pipeline-parallel-size P, run as T x P ranks under mpirun: rank r is
// shard r % T of stage r / T (rank_layout.h).
#pragma once
#include <cstdint>
#include <vector>

#include "core/result.h"

namespace inferd::distributed {

struct ParallelConfig {
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  // Divide a mixture's experts among the T tensor-parallel ranks (vLLM's
  // --enable-expert-parallel; attention stays tensor-parallel).
  bool enable_expert_parallel = false;
  // Layers per pipeline stage, in order (vLLM's VLLM_PP_LAYER_PARTITION);
  // empty: balanced by the bytes each stage reads (pipeline_layers).
  std::vector<int64_t> pipeline_layer_partition;
  // The whole LM head on the last stage, not shared with the first
  // (PipelineStage::share_head): for a slow link between them, which
  // sharing crosses with half of each sampled row's logits a step.
  bool pipeline_head_on_last_stage = false;
  int world_size() const { return tensor_parallel_size * pipeline_parallel_size; }
};

// Refuses sizes that cannot run, naming the rule: T and P at least 1; expert
// parallelism only with T > 1 (and no pipeline); T x P processes, all started
// by mpirun (`launched` processes were); a layer partition only with a
// pipeline, one count a stage; the head kept on the last stage only with a
// pipeline. What the model allows (T dividing its KV heads,
// P at most its layers, the partition adding up to them) is checked as it loads.
Status check_parallel_sizes(const ParallelConfig& config, int launched);

}  // namespace inferd::distributed
