// The flags and start-up of a model split across processes (serve and
// generate): --tensor-parallel-size and --pipeline-parallel-size, vLLM's.
// `mpirun -np P inferd serve ... --pipeline-parallel-size P` (or
// `--tensor-parallel-size T`, or T x P ranks with both) starts the ranks;
// rank 0 runs the command (server or CLI, scheduler, output processor), the
// others only their pipeline stage (distributed/pipeline.h), their tensor
// shard of every layer (distributed/tensor_parallel.h), or with both their
// shard of their stage's layers (distributed/rank_layout.h).
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <optional>

#include "core/result.h"
#include "distributed/mpi_world.h"
#include "distributed/parallel_config.h"
#include "distributed/pipeline.h"
#include "distributed/rank_watch.h"
#include "distributed/tensor_parallel.h"
#include "engine/engine.h"
#include "model/model.h"

namespace inferd::cli {

struct ParallelFlags : distributed::ParallelConfig {
  void add_to(CLI::App& app);
  // With a pipeline and no --max-num-batched-tokens on `app`'s command line:
  // the pipeline's own step budget (kPipelineStepTokens) into `budget`.
  void default_step_budget(const CLI::App& app, int64_t& budget) const;
};

// A pipeline's token budget a step when the user sets none. A step crosses
// the stages one after another, so a step's whole prompt chunk keeps one
// stage busy while the next waits for it; steps of 512 tokens let a prompt's
// chunks and the running streams' decode overlap across the stages (16
// streams on Qwen2.5-Coder-0.5B, PP=2 on this 2-core host: 0.76-0.78x one
// process's throughput at 2048, 0.88-0.90x at 512; docs/benchmarks.md).
constexpr int64_t kPipelineStepTokens = 512;

// A run's processes: one (no MPI at all), or the ranks of a pipeline, a
// tensor-parallel model, or both.
struct ParallelRun {
  std::unique_ptr<distributed::MpiWorld> world;  // null: a single process
  PipelineStage stage;                           // this process's
  std::shared_ptr<distributed::MpiPipelineLink> link;  // rank 0 of a pipeline
  TensorShard shard;                                   // this process's
  std::shared_ptr<distributed::MpiTensorComm> tensor_comm;  // every rank of a tensor-parallel model (its stage's)
  std::shared_ptr<distributed::MpiTensorParallelLink> tensor_link;  // its rank 0 (to stage 0's peers)
  std::vector<distributed::RankProcess> processes;  // rank 0: every rank's, gathered at start
  mutable std::unique_ptr<distributed::RankWatcher> watcher;  // rank 0, from watch_ranks() on
  // Rank 0's engine: where the other ranks are.
  void attach(EngineConfig& config) const {
    config.pipeline = link;
    config.tensor_parallel = tensor_link;
  }
  // Rank 0, after its signals are blocked (the watcher's thread inherits the
  // mask): `on_lost` is called, on the watcher's thread, once, when another
  // rank's process ends before shutdown(). Nothing when there is one process.
  void watch_ranks(distributed::RankWatcher::OnLost on_lost) const;
  // Rank 0 of a command (generate, bench): a lost rank ends the run at once,
  // naming the rank, with exit status kLostRankExit.
  void exit_when_a_rank_is_lost() const;
  static constexpr int kLostRankExit = 3;
  // Rank 0, done: the other ranks end their loops.
  void shutdown() const {
    watcher.reset();  // their ends are expected now
    if (link) link->shutdown();
    if (tensor_link) tensor_link->shutdown();
  }
  bool worker() const { return world && world->rank() != 0; }
  // Prints on rank 0 only (every rank reaches the same verdicts).
  bool reports() const { return !world || world->rank() == 0; }
  // After a failure once the ranks depend on each other: ends them all.
  [[noreturn]] void abort(int exit_code) const;
  // A worker whose flags are wrong: rank 0 reads the same flags, reports
  // them and ends every rank; this one waits for that rather than racing
  // rank 0's message with an abort of its own.
  [[noreturn]] void await_abort() const;
};

// Checks the sizes against the processes mpirun started (before MPI starts)
// and starts MPI when there is more than one. The error names the rule; it
// is printed by the caller on rank 0 (launched_rank).
Result<ParallelRun> start_parallel_run(const ParallelFlags& flags);
// This process's rank as the launcher numbered it (0 when not launched by mpirun).
int launched_rank();
// The exit code of a launch start_parallel_run refused. Rank 0 reports why
// (`report`); the other ranks wait for mpirun to end them, since one that
// exited first could have mpirun end rank 0 before its message was out.
int refuse_launch(const std::string& why, const std::function<void(const std::string&)>& report);

// This process's part of the model (its pipeline stage or tensor shard), as
// load_model_or_report loads it.
std::unique_ptr<Model> load_model_part(const ParallelRun& run, const std::string& model_path, bool quiet, int threads,
                                       kernels::GgmlFlavour flavour, kernels::Numerics numerics);

// A rank other than 0 of `serve` or `generate`: loads its stage or shard of
// the model and runs it until rank 0 is done; the exit code.
int run_worker_rank(const ParallelRun& run, const std::string& model_path, int threads,
                       kernels::GgmlFlavour flavour, kernels::Numerics numerics,
                       const std::function<std::optional<EngineConfig>(const Model&)>& engine_config);

// " on each of 2 ranks (tensor parallel)", or "" for one process: how a
// command's report says where it ran.
std::string ranks_note(const ParallelFlags& flags);
// Rank 0's collectives (all-gathers) of a tensor-parallel run, one line (nothing without
// any): the latency per call the benchmarks compare.
void print_collectives(const CollectiveStats& s);

// A command that runs to an end (generate, bench latency|throughput) on one
// process or on every rank mpirun started. Rank 0 runs `command` (it loads
// its part of the model with load_model_part, attaches the run to its engine
// config, and returns the exit code); the others run their part until rank 0
// is done. A lost rank ends the run at once, naming it; a failure on rank 0
// ends every rank. `numerics` is nullopt when the flags are wrong (rank 0's
// command reports them); `engine_config` is what rank 0's engine is given,
// made the same way on every rank.
int run_command_on_ranks(const ParallelFlags& flags, const std::string& model_path, int threads,
                         std::optional<kernels::Numerics> numerics,
                         const std::function<std::optional<EngineConfig>(const Model&)>& engine_config,
                         const std::function<int(const ParallelRun&)>& command);

}  // namespace inferd::cli
