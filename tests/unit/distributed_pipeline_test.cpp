// The pieces of pipeline parallelism that need no second process: the
// sizes refused before MPI starts, the stages' layer ranges, the step and output messages through their codec, and a stage's
// forward passes chained in one process against the whole model's (also
// with each stage split into tensor-parallel shards run as threads).
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "distributed/parallel_config.h"
#include "distributed/step_codec.h"
#include "engine/model_runner.h"
#include "engine_test_util.h"
#include "model/model.h"
#include "test_data.h"

namespace inferd {
namespace {

using distributed::check_parallel_sizes;
using distributed::ParallelConfig;

// A prompt of 20 tokens in one step, then a decode of one more, each KV
// group in blocks of its own (as the block pool gives them).
std::pair<SchedulerOutput, SchedulerOutput> prompt_then_decode(ModelRunner& runner) {
  SchedulerOutput prefill;
  ScheduledRequest s;
  s.request_id = "a";
  s.num_new_tokens = 20;
  for (int i = 0; i < 20; ++i) s.token_ids.push_back(3 + 7 * i % 50);
  for (int32_t g = 0; g < runner.kv_cache().layout().num_groups(); ++g) s.block_tables.push_back({1 + 2 * g, 2 + 2 * g});
  s.sample = true;
  prefill.scheduled = {s};
  SchedulerOutput decode = prefill;
  decode.scheduled[0].num_computed_tokens = 20;
  decode.scheduled[0].num_new_tokens = 1;
  decode.scheduled[0].token_ids = {17};
  return {prefill, decode};
}

TEST(DistributedSizes, RefusesWhatCannotRunNamingTheRule) {
  EXPECT_TRUE(check_parallel_sizes({1, 1}, 1).ok());
  EXPECT_TRUE(check_parallel_sizes({1, 2}, 2).ok());
  const auto message = [](ParallelConfig c, int launched) { return check_parallel_sizes(c, launched).error().message; };
  EXPECT_NE(message({1, 2}, 1).find("mpirun -np 2"), std::string::npos);
  EXPECT_NE(message({1, 2}, 3).find("must equal"), std::string::npos);
  EXPECT_NE(message({1, 1}, 2).find("mpirun started 2 processes"), std::string::npos);
  EXPECT_TRUE(check_parallel_sizes({2, 1}, 2).ok());
  EXPECT_NE(message({2, 1}, 1).find("mpirun -np 2 inferd ... --tensor-parallel-size 2"), std::string::npos);
  // Both: T x P processes, started by mpirun.
  EXPECT_TRUE(check_parallel_sizes({2, 2}, 4).ok());
  EXPECT_TRUE(check_parallel_sizes({3, 2}, 6).ok());
  EXPECT_NE(message({2, 2}, 3).find("mpirun started 3 processes, but a model split 2 (--tensor-parallel-size) x 2 "
                                    "(--pipeline-parallel-size) ways runs on exactly 4"),
            std::string::npos);
  EXPECT_NE(message({2, 2}, 1).find("mpirun -np 4 inferd ... --tensor-parallel-size 2 --pipeline-parallel-size 2"),
            std::string::npos);
  EXPECT_FALSE(check_parallel_sizes({1, 0}, 1).ok());
  // Expert parallelism divides the experts among the tensor-parallel ranks.
  EXPECT_TRUE(check_parallel_sizes({2, 1, true}, 2).ok());
  EXPECT_NE(message({1, 1, true}, 1).find("--enable-expert-parallel divides the experts among the tensor-parallel "
                                          "ranks: it needs --tensor-parallel-size T > 1"),
            std::string::npos);
  EXPECT_NE(message({1, 2, true}, 2).find("--enable-expert-parallel"), std::string::npos);
  EXPECT_NE(message({2, 2, true}, 4).find("--enable-expert-parallel does not run with --pipeline-parallel-size 2"),
            std::string::npos);
  // The head's place is a pipeline's choice.
  ParallelConfig head_last{1, 2};
  head_last.pipeline_head_on_last_stage = true;
  EXPECT_TRUE(check_parallel_sizes(head_last, 2).ok());
  head_last.pipeline_parallel_size = 1;
  EXPECT_NE(message(head_last, 1).find("--pipeline-head-on-last-stage places the LM head among pipeline stages"),
            std::string::npos);
}

TEST(DistributedSizes, StagesTakeContiguousLayersBalancedByTheirBytes) {
  auto ranges = [](const std::vector<uint64_t>& layers, uint64_t head, int count) {
    std::vector<std::pair<int64_t, int64_t>> r;
    for (int s = 0; s < count; ++s) {
      const LayerRange l = pipeline_layers(layers, head, {s, count});
      r.emplace_back(l.begin, l.end);
    }
    return r;
  };
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  // 30 equal layers over 4 stages: no stage above 8; the later stages take
  // as many as fit, so the first (which also schedules) is the lightest.
  EXPECT_EQ(ranges(std::vector<uint64_t>(30, 10), 0, 4), (Ranges{{0, 6}, {6, 14}, {14, 22}, {22, 30}}));
  // A head of 4.5 layers' bytes on the last stage (Qwen2.5-0.5B's tied head
  // is about 4 of its 24 layers): 14 + 10 layers, 140 bytes each side.
  EXPECT_EQ(ranges(std::vector<uint64_t>(24, 10), 45, 2), (Ranges{{0, 14}, {14, 24}}));
  // A head larger than all the layers: the last stage keeps one layer, the
  // middle one takes all but the first's one.
  EXPECT_EQ(ranges(std::vector<uint64_t>(6, 10), 1000, 3), (Ranges{{0, 1}, {1, 5}, {5, 6}}));
  // Uneven layers (a dense first layer before experts): split at the bytes.
  EXPECT_EQ(ranges({100, 10, 10, 10, 10, 10, 10, 10, 10, 10}, 0, 2), (Ranges{{0, 1}, {1, 10}}));
  // As many stages as layers: one each.
  EXPECT_EQ(ranges({5, 7}, 3, 2), (Ranges{{0, 1}, {1, 2}}));
  // A head shared by the first and last stages counts half on each: Qwen2.5-Coder-0.5B's (145 MB beside
  // 24 layers of about 10) splits the layers evenly instead of 19 and 5.
  const std::vector<uint64_t> qwen(24, 10);
  EXPECT_EQ(pipeline_layers(qwen, 145, {0, 2, {}, true}).end, 12);
  EXPECT_EQ(pipeline_layers(qwen, 145, {1, 2, {}, false}).begin, 19);
  // Three stages: the middle holds no head, so it takes the most layers (72 + 60, 130, 73 + 50 bytes).
  Ranges three;
  for (int s = 0; s < 3; ++s) {
    const LayerRange l = pipeline_layers(qwen, 145, {s, 3, {}, true});
    three.emplace_back(l.begin, l.end);
  }
  EXPECT_EQ(three, (Ranges{{0, 6}, {6, 19}, {19, 24}}));
  // Which head rows each stage computes: halves in whole groups of 16 rows, none in the middle.
  EXPECT_EQ(pipeline_head_rows(151936, {0, 3, {}, true}), (ShardRange{0, 75968}));
  EXPECT_EQ(pipeline_head_rows(151936, {1, 3, {}, true}), (ShardRange{}));
  EXPECT_EQ(pipeline_head_rows(151936, {2, 3, {}, true}), (ShardRange{75968, 151936}));
  EXPECT_EQ(pipeline_head_rows(49155, {0, 2, {}, true}), (ShardRange{0, 24576}));  // 3072 groups, 3 rows over
  EXPECT_EQ(pipeline_head_rows(49155, {1, 2, {}, true}), (ShardRange{24576, 49155}));
  EXPECT_EQ(pipeline_head_rows(49152, {0, 2}), (ShardRange{}));
  EXPECT_EQ(pipeline_head_rows(49152, {1, 2}), (ShardRange{0, 49152}));
  EXPECT_EQ(pipeline_head_rows(49152, {0, 1, {}, true}), (ShardRange{0, 49152}));
}

TEST(DistributedSizes, AGivenLayerPartitionIsTakenAsItIsOrRefusedByItsRule) {
  auto stage = [](int s, std::vector<int64_t> counts) {
    return PipelineStage{s, static_cast<int>(counts.size()), std::move(counts)};
  };
  for (const auto& [s, begin, end] : {std::tuple{0, 0, 17}, std::tuple{1, 17, 24}}) {
    auto l = partitioned_layers(stage(s, {17, 7}), 24);
    ASSERT_TRUE(l.ok()) << l.error().message;
    EXPECT_EQ(l->begin, begin);
    EXPECT_EQ(l->end, end);
  }
  auto l = partitioned_layers(stage(2, {1, 1, 4}), 6);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->begin, 2);
  EXPECT_EQ(l->end, 6);
  auto refusal = [&](std::vector<int64_t> counts, int64_t n_layer, int count) {
    auto r = partitioned_layers(PipelineStage{0, count, std::move(counts)}, n_layer);
    return r.ok() ? std::string() : r.error().message;
  };
  EXPECT_EQ(refusal({17, 6}, 24, 2),
            "--pipeline-layer-partition 17,6: the counts add up to 23, and this model has 24 layers");
  EXPECT_EQ(refusal({24, 0}, 24, 2), "--pipeline-layer-partition 24,0: every stage needs one layer at least");
  EXPECT_EQ(refusal({12, 12}, 24, 3),
            "--pipeline-layer-partition 12,12: give one layer count for each of the 3 pipeline stages");
  // At start, before MPI: a count for each stage.
  ParallelConfig c{1, 2};
  c.pipeline_layer_partition = {8, 8, 8};
  const Status s = check_parallel_sizes(c, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("--pipeline-layer-partition gives 3 layer counts for --pipeline-parallel-size 2"),
            std::string::npos);
  c.pipeline_layer_partition = {20, 4};
  EXPECT_TRUE(check_parallel_sizes(c, 2).ok());
}

TEST(DistributedStepCodec, AStepAndItsOutputCrossUnchanged) {
  SchedulerOutput out;
  out.step = 41;
  out.total_num_scheduled_tokens = 5;
  ScheduledRequest s;
  s.request_id = "req-7";
  s.num_computed_tokens = 16;
  s.num_new_tokens = 4;
  s.token_ids = {5, 6, 7, 8};
  s.block_tables = {{1, 2}, {3, 0}};
  s.new_block_ids = {2};
  s.state_slot = 3;
  s.state_source = 7;
  s.state_saves = {{64, 5}, {128, 6}};
  s.is_new = true;
  s.sample = true;
  s.num_draft_tokens = 2;
  s.prompt_logits = true;
  s.num_prompt_tokens = 18;
  s.num_cached_tokens = 16;
  out.scheduled = {s, ScheduledRequest{.request_id = "b", .num_new_tokens = 1, .token_ids = {9}}};
  out.block_copies = {{4, 5}};
  out.preempted_request_ids = {"c"};
  out.finished_request_ids = {"d", "e"};
  SamplingRequest sr;
  sr.params.temperature = 0.7f;
  sr.params.top_k = 5;
  sr.params.seed = 99;
  sr.prompt_token_ids = {1, 2, 3};
  sr.logprobs = 2;
  sr.constrained = true;
  const std::vector<distributed::SamplingEvent> events = {{"req-7", true, sr}, {"old", false, {}}};
  const std::vector<uint32_t> mask = {0xffu, 0x1u};
  StepSamplingInputs inputs;
  inputs.allowed = {{mask, 40}, {}};

  const std::vector<uint8_t> bytes = distributed::encode_step(distributed::StepMessage::Kind::kStep, events, out, inputs);
  auto m = distributed::decode_step(bytes);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->kind, distributed::StepMessage::Kind::kStep);
  ASSERT_EQ(m->events.size(), 2u);
  EXPECT_EQ(m->events[0].request_id, "req-7");
  EXPECT_TRUE(m->events[0].add);
  EXPECT_EQ(m->events[0].request.params.temperature, 0.7f);
  EXPECT_EQ(m->events[0].request.params.top_k, 5);
  EXPECT_EQ(m->events[0].request.params.seed, std::optional<uint64_t>(99));
  EXPECT_EQ(m->events[0].request.prompt_token_ids, sr.prompt_token_ids);
  EXPECT_EQ(m->events[0].request.logprobs, 2);
  EXPECT_TRUE(m->events[0].request.constrained);
  EXPECT_FALSE(m->events[1].add);
  EXPECT_EQ(m->out.step, 41);
  ASSERT_EQ(m->out.scheduled.size(), 2u);
  const ScheduledRequest& r = m->out.scheduled[0];
  EXPECT_EQ(r.request_id, "req-7");
  EXPECT_EQ(r.num_computed_tokens, 16);
  EXPECT_EQ(r.token_ids, s.token_ids);
  EXPECT_EQ(r.block_tables, s.block_tables);
  EXPECT_EQ(r.new_block_ids, s.new_block_ids);
  EXPECT_EQ(r.state_slot, 3);
  EXPECT_EQ(r.state_source, 7);
  EXPECT_EQ(r.state_saves, (std::vector<kv::StateSave>{{64, 5}, {128, 6}}));
  EXPECT_TRUE(r.is_new && r.sample && r.prompt_logits && !r.resumed);
  EXPECT_EQ(r.num_draft_tokens, 2);
  EXPECT_EQ(r.num_prompt_tokens, 18);
  EXPECT_EQ(r.num_cached_tokens, 16);
  EXPECT_EQ(m->out.scheduled[1].token_ids, std::vector<int32_t>{9});
  EXPECT_EQ(m->out.block_copies, out.block_copies);
  EXPECT_EQ(m->out.preempted_request_ids, out.preempted_request_ids);
  EXPECT_EQ(m->out.finished_request_ids, out.finished_request_ids);
  const StepSamplingInputs back = m->sampling_inputs();
  ASSERT_EQ(back.allowed.size(), 2u);
  EXPECT_EQ(std::vector<uint32_t>(back.allowed[0].mask.begin(), back.allowed[0].mask.end()), mask);
  EXPECT_EQ(back.allowed[0].mask_vocab, 40);
  EXPECT_TRUE(back.allowed[1].mask.empty());

  // A message cut short is refused, not read past its end.
  for (size_t cut : {size_t{1}, bytes.size() / 2, bytes.size() - 1})
    EXPECT_FALSE(distributed::decode_step({bytes.begin(), bytes.begin() + cut}).ok()) << cut;

  ModelRunnerOutput sampled;
  sampled.requests.resize(2);
  sampled.requests[0].tokens = {11, 12};
  sampled.requests[0].logprobs = {{11, -0.5f, 1, {{11, -0.5f}, {3, -1.5f}}}};
  sampled.requests[0].prompt_logprobs = {{2, -2.0f, 4, {}}};
  sampled.requests[1].beam_candidates = {{7, -0.25f}};
  sampled.requests[1].pooled = {0.5f, 1.5f};
  const std::vector<uint8_t> out_bytes = distributed::encode_output(sampled);
  ModelRunnerOutput got;
  ASSERT_TRUE(distributed::decode_output(out_bytes, got).ok());
  ASSERT_EQ(got.requests.size(), 2u);
  EXPECT_EQ(got.requests[0].tokens, sampled.requests[0].tokens);
  ASSERT_EQ(got.requests[0].logprobs.size(), 1u);
  EXPECT_EQ(got.requests[0].logprobs[0].rank, 1);
  EXPECT_EQ(got.requests[0].logprobs[0].top.size(), 2u);
  EXPECT_EQ(got.requests[0].logprobs[0].top[1].token, 3);
  EXPECT_EQ(got.requests[0].prompt_logprobs[0].logprob, -2.0f);
  EXPECT_EQ(got.requests[1].beam_candidates[0].token, 7);
  EXPECT_EQ(got.requests[1].pooled, sampled.requests[1].pooled);
  EXPECT_FALSE(distributed::decode_output({out_bytes.begin(), out_bytes.end() - 3}, got).ok());
}

// Two stages chained in one process (the residual stream handed from one to
// the next by hand, as MPI hands it) give the whole model's logits to the bit.
// With share_head, the first stage computes the head's first rows from the
// last stage's final-norm rows and the last stage the rest (as the MPI stages
// do): joined, the whole model's logits to the bit.
void expect_stages_chain_to_the_whole(const std::string& file, bool one_kv_group, bool share_head = false) {
  const std::string path = inferd::test::find_model_file(file);
  if (path.empty()) GTEST_SKIP() << file << " is not here (scripts/fetch_models.sh)";
  LoadOptions options;
  options.n_threads = 1;
  auto whole = Model::load(path, options);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  std::vector<std::unique_ptr<Model>> stages;
  for (int s = 0; s < 2; ++s) {
    options.pipeline_stage = {s, 2, {}, share_head};
    auto m = Model::load(path, options);
    ASSERT_TRUE(m.ok()) << m.error().message;
    stages.push_back(std::move(*m));
  }
  EXPECT_TRUE(stages[0]->first_stage() && !stages[0]->last_stage());
  EXPECT_TRUE(!stages[1]->first_stage() && stages[1]->last_stage());
  const int64_t n_vocab = (*whole)->n_logits();
  EXPECT_EQ(stages[0]->head_shared(), share_head);
  EXPECT_EQ(stages[1]->head_shared(), share_head);
  if (share_head) {  // halves in whole groups of rows, covering the vocabulary
    EXPECT_EQ(stages[0]->head_rows(), (ShardRange{0, stages[1]->head_rows().begin}));
    EXPECT_EQ(stages[1]->head_rows().end, n_vocab);
    EXPECT_EQ(stages[0]->head_rows().end % kShardRowGroup, 0);
    EXPECT_GT(stages[0]->head_rows().size(), 0);
  } else {
    EXPECT_EQ(stages[0]->head_rows().size(), 0);
    EXPECT_EQ(stages[1]->head_rows(), (ShardRange{0, n_vocab}));
  }
  ModelRunnerConfig rc;
  rc.kv_cache_bytes = 32 << 20;  // more than 16 blocks of every model's: max_blocks binds
  rc.max_blocks = 16;
  rc.warm_up = false;
  auto whole_runner = ModelRunner::create(**whole, rc);
  auto first = ModelRunner::create(*stages[0], rc);
  auto last = ModelRunner::create(*stages[1], rc);
  ASSERT_TRUE(whole_runner.ok() && first.ok() && last.ok());
  // A stage's blocks hold its own layers' slabs only (with one KV group: a slab a layer).
  const int64_t n_layer = (*whole)->config().n_layer, own = stages[0]->layer_end() - stages[0]->layer_begin();
  if (one_kv_group) EXPECT_EQ((*first)->kv_cache_bytes() * n_layer, (*whole_runner)->kv_cache_bytes() * own) << file;
  EXPECT_LE((*first)->kv_cache_bytes(), (*whole_runner)->kv_cache_bytes());
  const auto [prefill, decode] = prompt_then_decode(**whole_runner);
  for (const SchedulerOutput* step : {&prefill, &decode}) {
    const std::vector<float> expected = (*whole_runner)->compute_logits(*step);
    const std::vector<float> hidden = (*first)->forward_stage(*step, nullptr);
    EXPECT_EQ(hidden.size(), static_cast<size_t>(step->scheduled[0].num_new_tokens * (*whole)->config().n_embd));
    std::vector<float> got = (*last)->forward_stage(*step, hidden.data());
    if (share_head) {
      const std::vector<float> normed = got;
      const std::vector<float> first_part = (*first)->head_logits(normed);
      const std::vector<float>& last_part = (*last)->head_logits(normed);
      const int64_t n_rows = static_cast<int64_t>(normed.size()) / (*whole)->config().n_embd;
      const int64_t split = stages[1]->head_rows().begin;
      ASSERT_EQ(first_part.size(), static_cast<size_t>(n_rows * split));
      ASSERT_EQ(last_part.size(), static_cast<size_t>(n_rows * (n_vocab - split)));
      got.clear();
      for (int64_t r = 0; r < n_rows; ++r) {
        got.insert(got.end(), first_part.begin() + r * split, first_part.begin() + (r + 1) * split);
        got.insert(got.end(), last_part.begin() + r * (n_vocab - split), last_part.begin() + (r + 1) * (n_vocab - split));
      }
    }
    ASSERT_EQ(got.size(), expected.size());
    EXPECT_EQ(0, std::memcmp(got.data(), expected.data(), got.size() * sizeof(float))) << file;
  }
}

TEST(DistributedStages, ChainedStagesGiveTheWholeModelsLogits) {
  expect_stages_chain_to_the_whole("tiny-llama3.gguf", true);
  // Windowed groups (a block's two places both used by each stage), sandwich norms.
  expect_stages_chain_to_the_whole("tiny-gemma3.gguf", false);
  expect_stages_chain_to_the_whole("tiny-qwen3moe.gguf", true);
}

TEST(DistributedStages, AHeadSharedByTheFirstAndLastStagesGivesTheWholeModelsLogits) {
  expect_stages_chain_to_the_whole("tiny-llama3.gguf", true, true);
  expect_stages_chain_to_the_whole("tiny-gemma3.gguf", false, true);
  expect_stages_chain_to_the_whole("tiny-qwen3moe.gguf", true, true);
  // The default model: its tied head of 49,152 rows in its own type.
  expect_stages_chain_to_the_whole("SmolLM2-135M-Instruct.Q4_1.gguf", true, true);
}

// T ranks as threads of one process (model/tensor_parallel_comm.h): each call
// posts this rank's part, waits for every rank's and copies them in place, as
// the MPI collectives do.
class ThreadsComm final : public TensorParallelComm {
 public:
  struct Group {
    explicit Group(int n) : sync(n), parts(n) {}
    std::barrier<> sync;
    std::vector<const float*> parts;
  };
  ThreadsComm(Group& group, int rank) : group_(group), rank_(rank) {}
  bool root() const override { return rank_ == 0; }
  void all_gather_columns(const float* part, int64_t rows, float* whole, const ShardSplit& split) override {
    gather(part, rows, whole, split, true);
  }
  void gather_columns(const float* part, int64_t rows, float* whole, const ShardSplit& split) override {
    gather(part, rows, whole, split, root());
  }
  void all_gather_rows(float* rows, int64_t width, const ShardSplit& split) override {
    group_.parts[rank_] = rows;
    group_.sync.arrive_and_wait();
    for (int r = 0; r < split.count(); ++r)
      if (r != rank_)
        std::copy(group_.parts[r] + split.of(r).begin * width, group_.parts[r] + split.of(r).end * width,
                  rows + split.of(r).begin * width);
    group_.sync.arrive_and_wait();
  }

 private:
  void gather(const float* part, int64_t rows, float* whole, const ShardSplit& split, bool into) {
    group_.parts[rank_] = part;
    group_.sync.arrive_and_wait();
    if (into)
      for (int r = 0; r < split.count(); ++r) {
        const ShardRange cols = split.of(r);
        for (int64_t row = 0; row < rows; ++row)
          std::copy_n(group_.parts[r] + row * cols.size(), cols.size(), whole + row * split.whole() + cols.begin);
      }
    group_.sync.arrive_and_wait();  // the parts stay valid until every rank has read them
  }
  Group& group_;
  const int rank_;
};

// 2 stages x 2 shards (issue 40's tensor x pipeline): each stage's shards run
// side by side on threads; every shard of the first stage ends with the same
// stream (the gathered residual), which the second stage's shards all start
// from; the second stage's logits, gathered to its shard 0, are the whole
// model's to the bit, and its other shard gets none.
TEST(DistributedStages, TensorParallelStagesGiveTheWholeModelsLogits) {
  constexpr int T = 2, P = 2;
  const std::string path = inferd::test::test_data_root() + "/models/tiny-qwen3.gguf";
  LoadOptions options;
  options.n_threads = 1;
  auto whole = Model::load(path, options);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  ModelRunnerConfig rc;
  rc.kv_cache_bytes = 32 << 20;  // more than 16 blocks of every model's: max_blocks binds
  rc.max_blocks = 16;
  rc.warm_up = false;
  auto whole_runner = ModelRunner::create(**whole, rc);
  ASSERT_TRUE(whole_runner.ok());
  std::vector<std::unique_ptr<ThreadsComm::Group>> groups;
  std::vector<std::unique_ptr<Model>> models;  // stage-major, as the ranks
  std::vector<std::unique_ptr<ModelRunner>> runners;
  for (int s = 0; s < P; ++s) {
    groups.push_back(std::make_unique<ThreadsComm::Group>(T));
    for (int i = 0; i < T; ++i) {
      options.pipeline_stage = {s, P};
      options.tensor_shard = {i, T};
      options.tensor_comm = std::make_shared<ThreadsComm>(*groups.back(), i);
      auto m = Model::load(path, options);
      ASSERT_TRUE(m.ok()) << m.error().message;
      EXPECT_EQ((*m)->config().n_head_kv * T, (*whole)->config().n_head_kv);
      auto r = ModelRunner::create(**m, rc);
      ASSERT_TRUE(r.ok()) << r.error().message;
      models.push_back(std::move(*m));
      runners.push_back(std::move(*r));
    }
  }
  const auto [prefill, decode] = prompt_then_decode(**whole_runner);
  const int64_t n_embd = (*whole)->config().n_embd;
  for (const SchedulerOutput* step : {&prefill, &decode}) {
    const std::vector<float> expected = (*whole_runner)->compute_logits(*step);
    std::vector<float> stream;
    for (int st = 0; st < P; ++st) {
      std::vector<std::vector<float>> outs(T);
      std::vector<std::thread> ranks;
      for (int i = 0; i < T; ++i)
        ranks.emplace_back([&, i] {
          outs[i] = runners[st * T + i]->forward_stage(*step, st == 0 ? nullptr : stream.data());
        });
      for (std::thread& t : ranks) t.join();
      if (st + 1 < P) {
        ASSERT_EQ(outs[0].size(), static_cast<size_t>(step->scheduled[0].num_new_tokens * n_embd));
        for (int i = 1; i < T; ++i) EXPECT_EQ(outs[i], outs[0]) << "stage " << st << " shard " << i;
        stream = outs[0];
        continue;
      }
      ASSERT_EQ(outs[0].size(), expected.size());
      EXPECT_EQ(0, std::memcmp(outs[0].data(), expected.data(), expected.size() * sizeof(float)));
      for (int i = 1; i < T; ++i) EXPECT_TRUE(outs[i].empty());
    }
  }
}

TEST(DistributedStages, MoreStagesThanLayersAreRefused) {
  LoadOptions options;
  options.n_threads = 1;
  options.pipeline_stage = {0, 3};
  auto m = Model::load(inferd::test::test_data_root() + "/models/tiny-llama3.gguf", options);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("a pipeline of 3 stages needs at least 3 layers"), std::string::npos);
}

}  // namespace
}  // namespace inferd
