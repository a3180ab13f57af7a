#include "distributed/tensor_parallel.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>

#include "distributed/mpi_messages.h"
#include "distributed/pipeline.h"
#include "distributed/step_codec.h"

namespace inferd::distributed {

namespace {

// A stage's leader to its peers (on the world's message communicator).
enum Tag : int { kStepTag = 11, kHiddenTag = 12 };

void log_step(const MpiWorld& world, MpiTensorComm& comm) {
  const MpiTensorComm::Stats s = comm.take_step_stats();
  if (s.calls > 0)
    spdlog::debug("rank {}: step's collectives: {} calls, {:.1f} us mean", world.rank(), s.calls, s.mean_us());
}

}  // namespace

void MpiTensorComm::gather(const float* part, int64_t rows, float* whole, const ShardSplit& split, bool to_all) {
  const auto start = std::chrono::steady_clock::now();
  const int n = world_.tensor_size();
  counts_.resize(n);
  displs_.resize(n);
  int64_t at = 0;
  for (int r = 0; r < n; ++r) {
    counts_[r] = static_cast<int>(rows * split.of(r).size());
    displs_[r] = static_cast<int>(at);
    at += counts_[r];
  }
  // One row (a decode step) arrives rank-major, which is the row itself: the
  // ranks' columns land in place. Several rows are staged rank-major and then
  // copied into each row: one receive datatype cannot describe the ranks'
  // columns when their widths differ (the last rank's may), and the copy is
  // small beside the projection that made the rows.
  const bool in_place = rows == 1;
  if (!in_place && (to_all || root())) staged_.resize(static_cast<size_t>(at));
  float* into = in_place ? whole : staged_.data();
  const int mine = counts_[world_.tensor_rank()];
  if (to_all)
    check(world_, MPI_Allgatherv(part, mine, MPI_FLOAT, into, counts_.data(), displs_.data(), MPI_FLOAT,
                                 world_.tensor_comm()),
          "gathering a layer's outputs (MPI_Allgatherv)");
  else
    check(world_, MPI_Gatherv(part, mine, MPI_FLOAT, into, counts_.data(), displs_.data(), MPI_FLOAT, 0,
                              world_.tensor_comm()),
          "gathering the logits (MPI_Gatherv)");
  if (!in_place && (to_all || root())) {
    const int64_t whole_cols = split.whole();
    for (int r = 0; r < n; ++r) {
      const ShardRange cols = split.of(r);
      for (int64_t row = 0; row < rows; ++row)
        std::copy_n(staged_.data() + displs_[r] + row * cols.size(), cols.size(),
                    whole + row * whole_cols + cols.begin);
    }
  }
  count(start);
}

void MpiTensorComm::all_gather_rows(float* rows, int64_t width, const ShardSplit& split) {
  const auto start = std::chrono::steady_clock::now();
  const int n = world_.tensor_size();
  counts_.resize(n);
  displs_.resize(n);
  for (int r = 0; r < n; ++r) {
    counts_[r] = static_cast<int>(split.of(r).size() * width);
    displs_[r] = static_cast<int>(split.of(r).begin * width);
  }
  // Each rank's rows are already where the others' land: sent in place.
  check(world_, MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, rows, counts_.data(), displs_.data(), MPI_FLOAT,
                               world_.tensor_comm()),
        "gathering the experts' output rows (MPI_Allgatherv)");
  count(start);
}

void MpiTensorComm::count(std::chrono::steady_clock::time_point start) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (Stats* s : {&total_, &step_}) {
    ++s->calls;
    s->seconds += seconds;
  }
}

int32_t MpiTensorParallelLink::agree_on_blocks(int32_t local) { return distributed::agree_on_blocks(world_, local); }

void MpiTensorParallelLink::send_step(const SchedulerOutput& out) {
  log_step(world_, *comm_);  // the step before this one
  bytes_ = encode_step(StepMessage::Kind::kStep, {}, out, {});
  hand_to_peers(world_, bytes_, nullptr);
}

void MpiTensorParallelLink::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  bytes_ = encode_step(StepMessage::Kind::kShutdown, {}, {}, {});
  hand_to_peers(world_, bytes_, nullptr);
  log_collective_latency(world_, *comm_);
}

void hand_to_peers(const MpiWorld& world, const std::vector<uint8_t>& step, const std::vector<float>* hidden) {
  for (int peer : world.layout().peers(world.layout().stage_of(world.rank()))) {
    send(world, step, peer, kStepTag, "handing a step to a tensor-parallel peer");
    if (hidden) send(world, *hidden, peer, kHiddenTag, "handing the residual stream to a tensor-parallel peer");
  }
}

void log_collective_latency(const MpiWorld& world, const MpiTensorComm& comm) {
  const MpiTensorComm::Stats s = comm.total();
  spdlog::info("rank {}: {} collectives, {:.1f} us mean per call ({:.3f} s in all)", world.rank(), s.calls,
               s.mean_us(), s.seconds);
}

Status run_tensor_parallel_worker(const MpiWorld& world, Model& model, MpiTensorComm& comm, ModelRunnerConfig config) {
  config.pipeline = nullptr;
  config.tensor_parallel = nullptr;
  config.agree_on_blocks = [&world](int32_t n) { return agree_on_blocks(world, n); };
  auto created = ModelRunner::create(model, config);
  if (!created) return created.error();
  ModelRunner& runner = **created;
  const RankLayout& layout = world.layout();
  const int stage = layout.stage_of(world.rank()), leader = layout.leader(stage);
  // After the first stage, the leader hands on the stream it received too.
  const bool stream_in = !model.first_stage();
  if (layout.pipeline > 1)
    spdlog::info("rank {} (pid {}): tensor-parallel rank {} of stage {} (layers [{}, {})), KV cache {} blocks "
                 "({} bytes)",
                 world.rank(), getpid(), world.tensor_rank(), stage, model.layer_begin(), model.layer_end(),
                 runner.n_blocks(), runner.kv_cache_bytes());
  else
    spdlog::info("rank {} (pid {}): tensor-parallel rank, KV cache {} blocks ({} bytes)", world.rank(), getpid(),
                 runner.n_blocks(), runner.kv_cache_bytes());
  std::vector<uint8_t> bytes;
  std::vector<float> hidden;
  for (;;) {
    receive(world, bytes, leader, kStepTag, "receiving a step");
    auto message = decode_step(bytes);
    if (!message) return message.error();
    if (message->kind == StepMessage::Kind::kShutdown) {
      log_collective_latency(world, comm);
      return {};
    }
    if (stream_in) receive(world, hidden, leader, kHiddenTag, "receiving the residual stream");
    // The stream (or on the last stage the logits) goes on from the leader,
    // which holds the same numbers: this rank's copy is dropped.
    runner.forward_stage(message->out, stream_in ? hidden.data() : nullptr);
    log_step(world, comm);
  }
}

}  // namespace inferd::distributed
