#include "distributed/parallel_config.h"

#include <string>

namespace inferd::distributed {

Status check_parallel_sizes(const ParallelConfig& c, int launched) {
  const std::string t = std::to_string(c.tensor_parallel_size), p = std::to_string(c.pipeline_parallel_size);
  if (c.tensor_parallel_size < 1 || c.pipeline_parallel_size < 1)
    return make_error("--tensor-parallel-size and --pipeline-parallel-size must be at least 1");
  if (c.enable_expert_parallel && c.tensor_parallel_size < 2)
    return make_error("--enable-expert-parallel divides the experts among the tensor-parallel ranks: it needs "
                      "--tensor-parallel-size T > 1 (mpirun -np T inferd ... --tensor-parallel-size T "
                      "--enable-expert-parallel) and no pipeline");
  // Not built: a pipeline stage's experts divided among its shards.
  if (c.enable_expert_parallel && c.pipeline_parallel_size > 1)
    return make_error("--enable-expert-parallel does not run with --pipeline-parallel-size " + p +
                      " yet: expert parallelism needs the whole model on its tensor-parallel ranks (no pipeline)");
  if (!c.pipeline_layer_partition.empty() && c.pipeline_layer_partition.size() != static_cast<size_t>(c.pipeline_parallel_size))
    return make_error("--pipeline-layer-partition gives " + std::to_string(c.pipeline_layer_partition.size()) +
                      " layer counts for --pipeline-parallel-size " + p + ": give one count for each stage");
  if (c.pipeline_head_on_last_stage && c.pipeline_parallel_size == 1)
    return make_error("--pipeline-head-on-last-stage places the LM head among pipeline stages: it needs "
                      "--pipeline-parallel-size P > 1");
  const std::string n = std::to_string(c.world_size());
  if (launched == 1 && c.world_size() > 1) {
    const bool tp = c.tensor_parallel_size > 1, pp = c.pipeline_parallel_size > 1;
    const std::string flag = tp && pp ? "--tensor-parallel-size " + t + " --pipeline-parallel-size " + p
                             : tp     ? "--tensor-parallel-size " + t
                                      : "--pipeline-parallel-size " + p;
    return make_error(flag + " runs one process per " + (tp && pp ? "shard of each stage" : tp ? "shard" : "stage") +
                      ": start them with mpirun, e.g. mpirun -np " + n + " inferd ... " + flag);
  }
  if (launched != c.world_size())
    return make_error("mpirun started " + std::to_string(launched) + " processes, but a model split " + t +
                      " (--tensor-parallel-size) x " + p + " (--pipeline-parallel-size) ways runs on exactly " + n +
                      ": the number of processes must equal tensor x pipeline parallel size");
  return {};
}

}  // namespace inferd::distributed
