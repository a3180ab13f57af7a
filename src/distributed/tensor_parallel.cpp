#include "distributed/tensor_parallel.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>

#include "distributed/mpi_messages.h"
#include "distributed/pipeline.h"
#include "distributed/step_codec.h"

namespace inferd::distributed {

namespace {

enum Tag : int { kStepTag = 11 };

void log_step(const MpiWorld& world, MpiTensorComm& comm) {
  const MpiTensorComm::Stats s = comm.take_step_stats();
  if (s.calls > 0)
    spdlog::debug("rank {}: step's collectives: {} calls, {:.1f} us mean", world.rank(), s.calls, s.mean_us());
}

}  // namespace

void MpiTensorComm::gather(const float* part, int64_t rows, float* whole, const ShardSplit& split, bool to_all) {
  const auto start = std::chrono::steady_clock::now();
  const int n = world_.size();
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
  const int mine = counts_[world_.rank()];
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
  const int n = world_.size();
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
  for (int rank = 1; rank < world_.size(); ++rank) send(world_, bytes_, rank, kStepTag, "sending a step");
}

void MpiTensorParallelLink::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  bytes_ = encode_step(StepMessage::Kind::kShutdown, {}, {}, {});
  for (int rank = 1; rank < world_.size(); ++rank) send(world_, bytes_, rank, kStepTag, "ending the ranks");
  log_collective_latency(world_, *comm_);
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
  spdlog::info("rank {} (pid {}): tensor-parallel rank, KV cache {} blocks ({} bytes)", world.rank(), getpid(),
               runner.n_blocks(), runner.kv_cache_bytes());
  std::vector<uint8_t> bytes;
  for (;;) {
    receive(world, bytes, 0, kStepTag, "receiving a step");
    auto message = decode_step(bytes);
    if (!message) return message.error();
    if (message->kind == StepMessage::Kind::kShutdown) {
      log_collective_latency(world, comm);
      return {};
    }
    runner.compute_logits(message->out);  // the logits go to rank 0
    log_step(world, comm);
  }
}

}  // namespace inferd::distributed
