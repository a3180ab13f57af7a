#include "cli/parallel.h"

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cli/common.h"

namespace inferd::cli {

void ParallelFlags::add_to(CLI::App& app) {
  app.add_option("--pipeline-parallel-size", pipeline_parallel_size,
                 "Split the model's layers into this many stages, one process each, started by mpirun "
                 "(mpirun -np P inferd ... --pipeline-parallel-size P)")
      ->capture_default_str();
  app.add_option("--tensor-parallel-size", tensor_parallel_size,
                 "Split each layer's heads, FFN and vocabulary across this many processes, started by mpirun "
                 "(mpirun -np T inferd ... --tensor-parallel-size T)")
      ->capture_default_str();
  app.add_option("--pipeline-layer-partition", pipeline_layer_partition,
                 "With --pipeline-parallel-size P: the layers of each stage, in order, P counts adding up to the "
                 "model's layers (e.g. 17,7; vLLM's VLLM_PP_LAYER_PARTITION). Default: stages balanced by the "
                 "weight bytes each reads per step")
      ->delimiter(',');
  app.add_flag("--pipeline-head-on-last-stage", pipeline_head_on_last_stage,
               "With --pipeline-parallel-size P: keep the whole LM head on the last stage instead of sharing its "
               "vocabulary rows with the first, for a slow link between the two (sharing sends half of each "
               "sampled row's logits across it every step)");
  app.add_flag("--enable-expert-parallel", enable_expert_parallel,
               "With --tensor-parallel-size T: divide a mixture-of-experts model's experts among the T ranks");
}

void ParallelFlags::default_step_budget(const CLI::App& app, int64_t& budget) const {
  if (pipeline_parallel_size <= 1 || app.count("--max-num-batched-tokens") > 0) return;
  budget = kPipelineStepTokens;
}

int launched_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(name); v && *v) return std::atoi(v);
  return 0;
}

int refuse_launch(const std::string& why, const std::function<void(const std::string&)>& report) {
  if (launched_rank() == 0) {
    report(why);
    return 2;
  }
  std::this_thread::sleep_for(std::chrono::seconds(30));  // mpirun ends it once rank 0 has exited
  return 2;
}

void ParallelRun::abort(int exit_code) const {
  watcher.reset();  // the ranks this ends are not news
  if (world) world->abort(exit_code);
  std::exit(exit_code);
}

void ParallelRun::await_abort() const {
  MPI_Barrier(world->pipeline_comm());  // rank 0 never enters it: it aborts
  abort(2);
}

void ParallelRun::watch_ranks(distributed::RankWatcher::OnLost on_lost) const {
  if (!world || world->rank() != 0) return;
  std::vector<distributed::RankProcess> others(processes.begin() + 1, processes.end());
  watcher = std::make_unique<distributed::RankWatcher>(others, std::move(on_lost));
  for (const distributed::RankProcess& p : watcher->unwatched())
    spdlog::warn("{} is not on this host: if it dies, the MPI runtime ends the job without a message from rank 0",
                 distributed::describe(p));
}

void ParallelRun::exit_when_a_rank_is_lost() const {
  watch_ranks([this](const distributed::RankProcess& p) {
    spdlog::critical("{} ended: the model cannot run without it; ending every rank", distributed::describe(p));
    spdlog::default_logger()->flush();
    std::fflush(stdout);
    // The main thread may wait in MPI for the lost rank for good: MPI_Abort
    // ends it and every rank left.
    world->abort(kLostRankExit);
  });
}

Result<ParallelRun> start_parallel_run(const ParallelFlags& flags) {
  const int launched = distributed::launched_world_size();
  if (Status s = distributed::check_parallel_sizes(flags, launched); !s) return s.error();
  ParallelRun run;
  if (flags.world_size() == 1) return run;
  const distributed::RankLayout layout{flags.tensor_parallel_size, flags.pipeline_parallel_size};
  auto world = distributed::MpiWorld::init(layout);
  if (!world) return world.error();
  run.world = std::move(*world);
  run.processes = distributed::gather_rank_processes(*run.world);
  const int rank = run.world->rank();
  if (flags.pipeline_parallel_size > 1) {
    // Stages of whole layers share the head between the first and the last
    // unless told not to (a tensor-parallel last stage splits it among its
    // ranks instead).
    run.stage = {layout.stage_of(rank), flags.pipeline_parallel_size, flags.pipeline_layer_partition,
                 /*share_head=*/flags.tensor_parallel_size == 1 && !flags.pipeline_head_on_last_stage};
    if (rank == 0) run.link = std::make_shared<distributed::MpiPipelineLink>(*run.world);
  }
  if (flags.tensor_parallel_size > 1) {  // within this rank's stage
    run.shard = {layout.shard_of(rank), flags.tensor_parallel_size, flags.enable_expert_parallel};
    run.tensor_comm = std::make_shared<distributed::MpiTensorComm>(*run.world);
    if (rank == 0)
      run.tensor_link = std::make_shared<distributed::MpiTensorParallelLink>(*run.world, run.tensor_comm);
  }
  if (run.world->rank() == 0) {
    // mpirun ends the job at once on a signal; rank 0's own drains first.
    spdlog::info("rank 0 (pid {}) of {}: SIGTERM to this pid drains and stops every rank", getpid(), run.world->size());
  }
  return run;
}

std::unique_ptr<Model> load_model_part(const ParallelRun& run, const std::string& model_path, bool quiet, int threads,
                                       kernels::GgmlFlavour flavour, kernels::Numerics numerics) {
  return load_model_or_report(model_path, quiet, threads, flavour, numerics, run.stage, run.shard, run.tensor_comm);
}

int run_worker_rank(const ParallelRun& run, const std::string& model_path, int threads,
                    kernels::GgmlFlavour flavour, kernels::Numerics numerics,
                    const std::function<std::optional<EngineConfig>(const Model&)>& engine_config) {
  // mpirun forwards SIGTERM and SIGINT to every rank: rank 0 drains and then
  // tells this one to end, so this one must outlive the signal.
  signal(SIGTERM, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  // A model that cannot load here ends every rank (rank 0 waits for this
  // one's KV cache size); the message says why.
  auto model = load_model_part(run, model_path, true, threads, flavour, numerics);
  if (!model) run.abort(1);
  const std::optional<EngineConfig> config = engine_config(*model);
  if (!config) run.await_abort();  // rank 0 reports the same flags
  const ModelRunnerConfig runner_config = Engine::runner_config(*model, *config);
  // A stage's leader talks to the stages beside it; a peer only to its leader.
  const Status s = run.world->layout().is_leader(run.world->rank())
                       ? distributed::run_pipeline_worker(*run.world, *model, runner_config, run.tensor_comm.get())
                       : distributed::run_tensor_parallel_worker(*run.world, *model, *run.tensor_comm, runner_config);
  if (!s) {
    spdlog::critical("rank {}: {}", run.world->rank(), s.error().message);
    run.abort(1);
  }
  return 0;
}

std::string ranks_note(const ParallelFlags& flags) {
  if (flags.world_size() == 1) return "";
  const bool tp = flags.tensor_parallel_size > 1, pp = flags.pipeline_parallel_size > 1;
  return " on each of " + std::to_string(flags.world_size()) + " ranks" +
         (tp && pp ? " (" + std::to_string(flags.tensor_parallel_size) + " tensor parallel x " +
                         std::to_string(flags.pipeline_parallel_size) + " pipeline stages)"
          : tp     ? std::string(" (tensor parallel)")
                   : std::string(" (pipeline parallel)"));
}

void print_collectives(const CollectiveStats& s) {
  if (s.calls == 0) return;
  std::printf("%-22s %10.1f us mean per call (%lld calls, %.3f s in all, the wait for the slowest rank included)\n",
              "Collective latency", s.mean_us(), static_cast<long long>(s.calls), s.seconds);
}

int run_command_on_ranks(const ParallelFlags& flags, const std::string& model_path, int threads,
                         std::optional<kernels::Numerics> numerics,
                         const std::function<std::optional<EngineConfig>(const Model&)>& engine_config,
                         const std::function<int(const ParallelRun&)>& command) {
  auto run = start_parallel_run(flags);
  if (!run)
    return refuse_launch(run.error().message,
                         [](const std::string& why) { std::fprintf(stderr, "error: %s\n", why.c_str()); });
  if (run->worker()) {
    if (!numerics) run->await_abort();
    return run_worker_rank(*run, model_path, threads, kernels::native_ggml_flavour(), *numerics, engine_config);
  }
  run->exit_when_a_rank_is_lost();
  const int exit_code = command(*run);
  // A failure may leave the other ranks waiting for this one's engine.
  if (exit_code != 0 && run->world) run->abort(exit_code);
  run->shutdown();
  return exit_code;
}

}  // namespace inferd::cli
