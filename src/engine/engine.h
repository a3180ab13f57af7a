// The serving engine: many requests share each forward pass.
//
// One step: apply queued commands (add, abort) -> Scheduler::schedule ->
// ModelRunner::execute (the forward pass, then its sampling stage: tokens
// come back, not logits) -> Scheduler::update -> stop strings -> emit
// RequestOutput deltas to each request's stream. Requests enter and leave between any two steps
// (continuous batching); a long prompt is prefilled in chunks alongside
// running decodes.
//
// Two ways to drive it:
//  - start(): the loop runs on its own thread; add_request and abort may be
//    called from any thread and reach the loop as typed messages;
//  - step(): no thread, the caller runs one step at a time (tests, offline
//    benchmarks). Commands queued since the previous step are applied first.
//
// Determinism: the forward pass is batch-invariant and each request samples
// from its own seeded random stream, so a request's tokens do not depend on
// what else shares its steps (greedy always; sampling when a seed is given).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/result.h"
#include "engine/beam_search.h"
#include "engine/draft_model_proposer.h"
#include "engine/kv_offload.h"
#include "engine/model_runner.h"
#include "engine/output_processor.h"
#include "engine/request.h"
#include "engine/request_output.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "kv/chained_connector.h"
#include "kvstore/tiered_connector.h"
#include "kvtransfer/lease_table.h"
#include "kvtransfer/transfer_connector.h"
#include "kvtransfer/ucx_agent.h"
#include "model/model.h"
#include "sampling/sampler.h"
#include "structured/grammar.h"
#include "tokenizer/tokenizer.h"

namespace inferd {

struct EngineConfig {
  int64_t max_num_batched_tokens = 2048;  // token budget of one step
  int32_t max_num_seqs = 128;             // requests running at once
  int64_t long_prefill_token_threshold = 0;  // > 0: cap on one request's tokens per step
  // How many projection multiply-adds one attention multiply-add costs on
  // this executor (measured on the CPU executor: docs/benchmarks.md); with
  // the model's TokenCost it sets SchedulerConfig::context_positions_per_token,
  // which shortens chunks deep in a long prompt. 0: chunks sized by tokens alone.
  double chunk_attention_cost = 2.0;
  int64_t max_model_len = 0;  // prompt + max_tokens at most; 0: the model's context length
  bool enable_prefix_caching = true;
  // A model with recurrent layers: prefix caching keeps snapshots of the
  // state at every state_snapshot_interval tokens of a prompt and at its last
  // full block (kv::StateSnapshotCache), in this many slots of the model's
  // state size, taken from the KV budget before the blocks (0: no prefix
  // caching for such a model). A multiple of block_size.
  int32_t state_snapshots = 32;
  int64_t state_snapshot_interval = 256;
  int32_t block_size = 16;
  // KV cache size: kv_cache_bytes if > 0, else this fraction of available
  // memory; never more blocks than max_num_seqs requests of max_model_len need.
  int64_t kv_cache_bytes = 0;
  double kv_cache_memory_fraction = 0.25;
  // > 0: this many KV blocks instead of what the budget buys (vLLM's
  // num_gpu_blocks_override; ModelRunnerConfig::n_blocks_override).
  int64_t num_gpu_blocks_override = 0;
  // The KV cache's element type: the budget above buys blocks of this dtype
  // (q8_0 about 1.9 times f16's tokens, q4_0 3.5 times). One the model's
  // executor cannot read is refused at create(), naming those it can.
  DType kv_cache_dtype = kv::kDefaultKVCacheDType;
  // --kv-cache-dtype-skip-layers sliding_window: sliding-window layers keep
  // f16, the others kv_cache_dtype (KVLayout::plan).
  bool kv_cache_skip_sliding_window = false;
  // The kernels' arithmetic (kernels/cpu/numerics.h). Fixed when the model is
  // loaded: front ends pass it to LoadOptions, and a draft model follows it.
  kernels::Numerics numerics = kernels::kDefaultNumerics;
  int32_t max_logprobs = 20;  // largest `logprobs` a request may ask for
  // Run a prefill-shaped and a decode-shaped pass at creation, so the first
  // request is as fast as the next (ModelRunnerConfig::warm_up).
  bool warm_up = true;
  // Draft tokens verified with each decode (speculative.h); off by default.
  // Requests with a grammar do not speculate. A draft model is loaded by
  // create(), on the target's threads.
  SpeculativeConfig speculative;
  // Rank 0 of a pipeline-parallel model (engine/pipeline_link.h): the model
  // is loaded as the first stage and the other stages run elsewhere.
  std::shared_ptr<PipelineLink> pipeline;
  // Rank 0 of a tensor-parallel model (engine/tensor_parallel_link.h): the
  // model is loaded as rank 0's shard and the other ranks run theirs.
  std::shared_ptr<TensorParallelLink> tensor_parallel;
  // Offload tiers for the prefix cache (kvstore/tiered_connector.h): cached
  // blocks the pool evicts are kept in host memory and on disk and loaded
  // back for a later prompt with the same prefix. Off by default; needs
  // prefix caching.
  kvstore::OffloadConfig offload;
  // Prefill/decode disaggregation's KV transfer (kvtransfer/): a producer
  // holds a finished prompt's blocks under a lease and serves them over UCX
  // on ip:port; a consumer pulls the blocks it is told about
  // (Engine::kv_transfer). Off by default; needs prefix caching.
  struct KVTransfer {
    bool produce = false, consume = false;
    std::string ip = "127.0.0.1";
    uint16_t port = 14579;  // the producer's listening port (0: any free one)
    std::string engine_id;
    double lease_seconds = 30.0;   // a producer frees held blocks no consumer released by then
    double timeout_seconds = 5.0;  // a consumer's pull that takes longer fails (the prompt is computed)
  };
  std::optional<KVTransfer> kv_transfer;
};

// What a client asks for.
// Reasoning before the answer, as thinking models write it (<think> ... </think>).
// With a grammar (structured output, forced tool calls), the grammar constrains
// only the answer: while the output is inside the thinking, no token is masked
// or given to the grammar, and the grammar starts at the token after the one
// that completes `end`. The markers are matched on the tokens' text, so they
// work whether a marker is one special token (Qwen3) or several ordinary ones.
struct ReasoningSpec {
  std::string start = "<think>";  // an output that opens with this thinks (empty: only starts_inside)
  std::string end = "</think>";
  bool starts_inside = false;  // the prompt opened the thinking: the output begins in it
};

struct GenerationParams {
  std::string request_id;  // empty: the engine numbers it; else unique among live requests
  std::vector<int32_t> prompt_token_ids;
  SamplingParams sampling;
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // finish on these (the token is kept in the output)
  std::vector<std::string> stop;        // finish before any of these strings (not emitted)
  bool ignore_eos = false;              // do not stop at end-of-generation tokens
  int32_t logprobs = -1;                // >= 0: each token's logprob plus this many alternatives
  // >= 0: each prompt token after the first scored by the model (its logprob,
  // rank and this many alternatives: RequestOutput::prompt_logprobs), from
  // logits computed in the prompt's own forward passes. The request then
  // takes nothing from the prefix cache. Not with beam search.
  int32_t prompt_logprobs = -1;
  std::string cache_salt;               // prefixes are shared only between equal salts
  // Structured output: when set, every token is sampled from the tokens the
  // grammar allows next (the others' logits are -inf before the sampler), and
  // the request finishes with "stop" once the grammar is complete. Compiled
  // for this model's tokenizer (GrammarCompiler); each request gets its own
  // matcher, so n > 1 choices share one compiled grammar.
  std::shared_ptr<const CompiledGrammar> grammar;
  // The output may think before it answers (see ReasoningSpec): a grammar
  // then applies from the token after the thinking's end marker. An output
  // that opens `start` (several tokens, or one) is read as thinking; while it
  // may still be opening it, the allowed tokens are the grammar's plus those
  // that continue `start`. Nothing without a grammar.
  std::optional<ReasoningSpec> reasoning;
  // The text shows control tokens too ([TOOL_CALLS], <|im_start|>, ...), as
  // vLLM's skip_special_tokens=false does; a Mistral tool-call parser needs
  // its marker. The token that stops the request (EOS, a stop token) is still
  // left out of the text.
  bool render_special = false;
  // Beam search (vLLM's use_beam_search): the request runs as beam_width
  // beams, each a scheduler request, sharing their common prefix's KV blocks,
  // and its final output lists the beam_width best beams (RequestOutput::beams;
  // beam_search.h says how they are chosen). Sampling parameters are not used
  // (the candidates come from the raw logits' log-softmax, as vLLM's default
  // raw logprobs); the stop conditions, max_tokens and ignore_eos are. Not
  // with a grammar or logprobs; beams are never speculated.
  std::optional<BeamSearchParams> beam_search;
  // Prefill for a remote decode (a KV producer): when the request finishes,
  // its prompt's full blocks stay held under a lease, named in its final
  // output, until the consumer releases it or it expires.
  bool kv_hold_for_remote_decode = false;
  // The model's pooled output of the prompt instead of generated tokens
  // (Request::pooled; RequestOutput::embedding): for a model that can embed
  // or rank (ModelConfig::can_embed, can_rank). Sampling and stop parameters
  // are not used.
  bool pooled = false;
};

// The sampling seed of choice k of a request asking for several choices (the
// API's `n`): choices of one seeded request differ from each other, yet
// repeat exactly. Unseeded choices stay unseeded.
inline std::optional<uint64_t> choice_seed(std::optional<uint64_t> seed, int32_t k) {
  if (!seed) return std::nullopt;
  return *seed + static_cast<uint64_t>(k);
}

struct EngineStats {
  SchedulerStats scheduler;  // steps, tokens per step, KV blocks, prefix cache, preemptions
  int32_t kv_total_blocks = 0;      // usable blocks (the reserved null block excluded)
  DType kv_cache_dtype = kv::kDefaultKVCacheDType;  // what the KV cache keeps keys and values in
  bool kv_cache_skip_sliding_window = false;        // ... but its sliding-window layers in f16
  size_t kv_bytes_per_token = 0;    // one token's keys and values, every layer
  int64_t kv_capacity_tokens = 0;   // tokens of full context the usable blocks hold
  // A model with recurrent layers: the state slots (one per request that can
  // run at once), one sequence's state and every slot's bytes, the cache's
  // spare slot included (taken from the KV budget before the blocks). 0 otherwise.
  // Beside them, the prefix cache's state snapshots (in use: cached now) and
  // speculative decoding's checkpoints (one per running slot), the same size
  // each and counted in kv_state_bytes.
  int32_t kv_state_slots = 0;
  int32_t kv_state_snapshots = 0;
  int32_t kv_state_snapshots_cached = 0;
  int32_t kv_state_checkpoints = 0;
  size_t kv_state_bytes_per_sequence = 0;
  int64_t kv_state_bytes = 0;
  int64_t requests_added = 0;
  int64_t prompt_tokens = 0;           // of added requests
  int64_t computed_prompt_tokens = 0;  // prompt positions run through the model (recomputes included)
  int64_t generation_tokens = 0;       // tokens sampled
  int64_t computed_tokens = 0;         // all positions run through the model
  double forward_seconds = 0.0;        // time in ModelRunner::execute
  double draft_forward_seconds = 0.0;  // time in the draft model's passes
  CollectiveStats collectives;         // rank 0 of a tensor-parallel model: its collectives, else none
  SpeculativeStats speculative;        // drafts verified and accepted
  kvstore::OffloadStats offload;       // the offload tiers, if any
  kvtransfer::TransferStats kv_transfer;  // a consumer's pulls (and its agent's counts)
  kvtransfer::LeaseStats kv_leases;       // a producer's leases
  int64_t kv_lease_blocks = 0;            // blocks its leases hold now

  double mean_tokens_per_step() const {
    return scheduler.steps ? static_cast<double>(scheduler.scheduled_tokens) / scheduler.steps : 0.0;
  }
};

class Engine {
 public:
  // The model must outlive the engine (its executor owns the threads the
  // forward passes run on). Fails for a model that cannot generate, a bad
  // config, or a KV budget too small for one block.
  static Result<std::unique_ptr<Engine>> create(Model& model, const EngineConfig& config);
  // The model runner create() makes for `config` (its KV budget and block
  // cap); the other stages of a pipeline make theirs from the same.
  static ModelRunnerConfig runner_config(const Model& model, const EngineConfig& config);
  ~Engine();  // stops the loop; unfinished requests end with finish reason "abort"
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  struct Handle {
    std::string request_id;
    std::shared_ptr<RequestStream> stream;
  };
  // Any thread. Checks the request now (empty prompt, token ids outside the
  // vocabulary, bad sampling parameters, prompt + max_tokens beyond
  // max_model_len or beyond what the KV cache holds even alone, ...) and
  // queues it for the loop.
  Result<Handle> add_request(GenerationParams params);
  // Any thread, any moment: the request ends with "abort" and its KV blocks are
  // freed before the next step is scheduled. No-op for an unknown or finished id.
  void abort(const std::string& request_id);

  // Synchronous use (the loop stopped): every unfinished request, queued ones
  // included, ends now with "abort" and its final output is pushed.
  void abort_all();

  // Runs the loop on its own thread until stop() (or destruction).
  void start();
  // Stops and joins the loop thread; requests stay where they are.
  void stop();
  bool running() const { return loop_running_.load(); }

  // Synchronous use (not while the loop thread runs): applies queued commands,
  // runs one step, and returns the outputs it emitted (also pushed to streams).
  std::vector<RequestOutput> step();
  // Unfinished requests or queued commands remain (synchronous use).
  bool has_pending_work();

  // Called on the loop thread with the final output of every request, however
  // it ended (served, stopped, aborted): one place for per-request metrics and
  // logs, whether or not a client still reads the stream. Set before start().
  void set_finished_listener(std::function<void(const RequestOutput&)> listener) {
    finished_listener_ = std::move(listener);
  }

  // A KV consumer's transfer connector (register_pull before add_request,
  // forget after the request finished); null unless config.kv_transfer consumes.
  kvtransfer::TransferConnector* kv_transfer() { return transfer_.get(); }
  // The id a request's pull is registered under: the one the scheduler knows
  // its prompt by (a beam search's is its first beam's).
  static std::string kv_pull_id(const std::string& request_id, bool beam_search) {
    return beam_search ? request_id + kBeamSuffix + "0" : request_id;
  }
  // The port a KV producer's transfer agent listens on (0: none).
  uint16_t kv_transfer_port() const { return agent_ ? agent_->port() : 0; }

  EngineStats stats() const;  // any thread: a snapshot taken after the last step
  const EngineConfig& config() const { return config_; }
  const SchedulerConfig& scheduler_config() const { return scheduler_.config(); }
  // Scheduler and KV invariants, the offload tiers' (within their bounds,
  // their counts agreeing with what they hold), the draft model's cache's
  // too, which holds only running or waiting requests' sequences
  // (synchronous use).
  Status check_invariants() const;

 private:
  struct AddCommand {
    Request request;
    std::shared_ptr<RequestStream> stream;
    std::vector<std::string> stop;
    int32_t logprobs;
    int32_t prompt_logprobs;
    std::unique_ptr<GrammarMatcher> matcher;  // structured output, if any
    std::optional<ReasoningSpec> reasoning;   // the grammar waits for the thinking's end
    bool render_special = false;              // the decoder writes control tokens' text
    std::optional<BeamSearchParams> beam_search;
  };
  struct AbortCommand {
    std::string request_id;
  };
  using Command = std::variant<AddCommand, AbortCommand>;

  // A beam search's state: the search itself and, for each live beam, the
  // scheduler request that runs it.
  struct BeamGroup {
    explicit BeamGroup(BeamSearch s) : search(std::move(s)) {}
    BeamSearch search;
    std::vector<std::string> ids;  // ids[i]: live beam i's scheduler request
    std::optional<BeamText> text;  // the beams' text (stop strings, the final texts)
    int64_t next_beam = 1;  // numbers the forks' ids
  };
  // A beam group that took a step (before update()): its live beams' children.
  struct BeamAdvance {
    std::string request_id;
    std::vector<BeamChild> children;
  };

  // The engine's side of a request the scheduler tracks (a beam search: of
  // all its beams).
  struct Live {
    std::shared_ptr<RequestStream> stream;
    RequestText text;  // its detokenized text and stop strings (the output processor's)
    int32_t logprobs = -1;
    RequestMetrics metrics;
    // Structured output: the grammar state, which follows the output tokens
    // (one commit per sampled token; a preempted request keeps its output, so
    // its matcher simply continues after the recompute).
    std::unique_ptr<GrammarMatcher> matcher;
    // Reasoning before a grammar's answer: kOpen, the grammar applies;
    // kMaybe, the output may still be opening `reasoning->start` (gate_text
    // is what it wrote of it so far); kThinking, inside the thinking
    // (gate_text keeps the last bytes, where `end` may begin).
    enum class Gate { kOpen, kMaybe, kThinking };
    Gate gate = Gate::kOpen;
    std::optional<ReasoningSpec> reasoning;
    std::string gate_text;
    // kMaybe: the matcher has taken the marker's tokens written so far
    // (used), and allowed them all (ok: the answer could still begin so).
    bool gate_grammar_used = false, gate_grammar_ok = true;
    // kMaybe: the mask of this step (the marker's continuations, and the
    // grammar's allowed tokens) and the grammar's part of it, which
    // advance_grammar reads after sampling.
    std::vector<uint32_t> gate_mask = {}, gate_grammar_mask = {};
    std::optional<DraftLength> draft_length = {};  // speculation: drafts to propose next, made at the first proposal
    std::optional<NgramProposer> ngram = {};  // the n-gram method's proposer, made at the first proposal
    std::unique_ptr<BeamGroup> beams = {};  // beam search; null for one sequence
    uint64_t kv_lease_id = 0;          // prefill for a remote decode: its lease (Request::kv_lease_id)
    // Prompt logprobs scored (by the sampling stage) and not yet emitted.
    std::vector<SampledLogprobs> pending_prompt_logprobs = {};
    std::vector<float> pooled = {};  // a pooled request's output row, taken after its step
  };

  Engine(Model& model, const EngineConfig& config, const SchedulerConfig& sched, std::unique_ptr<ModelRunner> runner,
         std::unique_ptr<DraftModelProposer> drafter, std::unique_ptr<KVCacheBlocks> kv_blocks,
         std::unique_ptr<kvstore::TieredConnector> offload);
  // The KV transfer's agent, lease table and connector (config_.kv_transfer).
  Status start_kv_transfer(uint64_t fingerprint);
  // Frees the blocks of leases that ended (released by their consumer, or expired).
  void end_leases();
  void loop();
  // One step of the engine core: schedule -> execute -> update.
  std::vector<RequestOutput> run_step();  // step() without the check
  // What a step sampled, as the engine keeps it between execute() and update().
  struct StepSamples {
    double t_token = 0.0;                                     // when its tokens came
    std::vector<std::vector<SampledLogprobs>> logprobs;       // per scheduled request
    std::vector<std::string> pooled_done;                     // pooled requests whose one pass this was
    std::vector<BeamAdvance> beams;                           // the beam groups that took their step
  };
  void apply_commands();
  // Per-request metrics and the counters of what a step computes.
  void count_scheduled(const SchedulerOutput& out);
  // The forward pass and its sampling stage (ModelRunner::execute), and what
  // the step's clients take from it before update(): grammars follow their
  // tokens, proposers learn their drafts' acceptance, beam groups choose.
  StepSamples execute(const SchedulerOutput& out);
  // What execute() takes from the runner's samples of `out` (the grammar
  // errors of its prepare_sampling in grammar_errors_).
  StepSamples take_samples(const SchedulerOutput& out, ModelRunnerOutput& sampled);
  // Rank 0 of a pipeline: one round of batches in flight (see the .cpp).
  std::vector<RequestOutput> run_pipelined_step();
  // A batch handed to the pipeline whose samples have not come back.
  struct InFlightBatch {
    SchedulerOutput out;
    std::vector<std::string> grammar_errors;  // of its prepare_sampling
  };
  // Receives (and drops) the samples of every batch in flight.
  void drain_in_flight();
  // Scheduler::update with the step's tokens, then each request's output
  // (output_update), pooled requests' ends, beam forks, and next drafts.
  void update(const SchedulerOutput& out, StepSamples& step);
  // One request's delta (or final output) from its update: its text through
  // the output processor, stop strings and a complete grammar finish it.
  void output_update(RequestUpdate& u, std::vector<SampledLogprobs> logprobs, std::string grammar_error,
                     double t_token);
  // Speculation's client side after a verification: `tokens` (1..num_drafts + 1) were accepted.
  void drafts_verified(Live& live, int64_t num_drafts, const std::vector<int32_t>& tokens);
  void apply(Command& cmd);
  // Queues an output for the end of the step.
  void emit(const std::shared_ptr<RequestStream>& stream, RequestOutput out) { outputs_.emit(stream, std::move(out)); }
  // Ends a request the scheduler no longer holds with its final output.
  void finish(const std::string& id, RequestStatus status, RequestOutput out);
  // Publishes the stats, then pushes the step's outputs to their streams (so a
  // client that sees an output also sees the stats of the step that made it).
  std::vector<RequestOutput> end_step();
  // What the sampling stage needs to know of a scheduler request (a beam's:
  // of its group), registered with the runner when the request is added.
  SamplingRequest sampling_request(const Request& r, const Live& live, int32_t prompt_logprobs) const;
  // The engine's side of sampling before a step: the allowed tokens of each
  // request with a grammar that samples (into sampling_inputs_; a grammar
  // that fails records its error in grammar_errors_ and leaves the row free).
  void prepare_sampling(const SchedulerOutput& out);
  // The mask for a sequence that may still open its thinking: the tokens
  // that continue `start`, plus the grammar's allowed tokens while what was
  // written so far is also a valid start of the answer (into live.gate_mask).
  Status maybe_thinking_mask(Live& live, int64_t n_vocab);
  // After sampling `token`: gives it to the grammar, or to the thinking gate.
  Status advance_grammar(Live& live, int32_t token);
  // Token ids whose text continues `start` after its first k bytes, for each
  // k < start.size() (built once per marker, on the loop thread).
  const std::vector<std::vector<int32_t>>& start_continuations(const std::string& start);
  void publish_stats();
  // Drafts for the requests that just sampled and go on decoding.
  void propose_drafts(const std::vector<RequestUpdate>& updates);

  // A beam's scheduler id: its request's id, this, and its number.
  static constexpr char kBeamSuffix[] = "#beam";

  // The Live of a scheduler request: its own, or its beam search's.
  Live& owner(const std::string& scheduler_id);
  // Ends a request's work in the scheduler now: its request, or every live
  // beam of its beam search. False if the scheduler holds none of it.
  bool release(const std::string& request_id);
  // Beam search, between sampling and update(): each group whose every live
  // beam sampled this step (its candidates in sampled.requests[i] for
  // out.scheduled[i]) takes its step; the token of each beam's first child
  // goes to update() in sampled_. A group missing a beam waits: its beams'
  // candidates are not used (update() then feeds their last token again).
  std::vector<BeamAdvance> select_beams(const SchedulerOutput& out, const ModelRunnerOutput& sampled);
  // After update(): drops the beams with no child, forks the others' further
  // children, and ends the searches that are done.
  void apply_beams(const std::vector<BeamAdvance>& advanced, double t_token);
  // A finished search's final output: its beams, best first.
  void finish_beam_search(const std::string& request_id);

  Model& model_;
  const Tokenizer& tokenizer_;
  EngineConfig config_;
  std::unique_ptr<ModelRunner> runner_;
  Scheduler scheduler_;
  std::unique_ptr<DraftModelProposer> drafter_;  // the draft model's proposer, if one drafts
  // Offload tiers, if configured: the pool's blocks as the connector sees
  // them, and the connector the scheduler consults (destroyed before them).
  std::unique_ptr<KVCacheBlocks> kv_blocks_;
  std::unique_ptr<kvstore::TieredConnector> offload_;
  // The KV transfer, if configured (destroyed before the runner's pool: the
  // agent's reads into it stop first).
  std::unique_ptr<kvtransfer::LeaseTable> leases_;
  std::unique_ptr<kvtransfer::UcxAgent> agent_;
  std::unique_ptr<kvtransfer::TransferConnector> transfer_;
  // A consumer with offload tiers: both behind the scheduler's one connector.
  std::unique_ptr<kv::ChainedConnector> tiers_then_transfer_;
  std::atomic<uint64_t> next_lease_{0};  // random start: a restarted producer's leases never match old ones
  std::unordered_map<uint64_t, int64_t> lease_block_count_;  // held leases' blocks
  bool load_finished_ = false;  // the agent finished a pull (under cmd_mu_): the loop wakes
  std::vector<int32_t> eog_tokens_;  // end-of-generation tokens, stop tokens unless ignore_eos
  std::unordered_map<std::string, Live> live_;
  std::unordered_map<std::string, std::string> beam_owner_;  // a live beam's scheduler id -> its request's id
  std::vector<std::vector<int32_t>> sampled_;  // per scheduled request: its tokens this step, reused
  OutputProcessor outputs_;  // this step's outputs, pushed at its end
  StepSamplingInputs sampling_inputs_;  // this step's, reused
  std::vector<std::string> grammar_errors_;  // per scheduled request of this step, reused
  // Rank 0 of a pipeline: the batches that may be in it at once (one per
  // stage; 1 with speculative decoding), and those in it now, oldest first.
  int32_t pipeline_batches_ = 0;  // 0: no pipeline
  std::deque<InFlightBatch> in_flight_;
  std::unordered_map<std::string, std::vector<std::vector<int32_t>>> start_continuations_;
  std::function<void(const RequestOutput&)> finished_listener_;
  SpeculativeStats spec_stats_;

  // Counters kept by the loop, published with the stats snapshot.
  int64_t prompt_tokens_ = 0, computed_prompt_tokens_ = 0, generation_tokens_ = 0;
  int64_t computed_tokens_ = 0, requests_added_ = 0;
  double forward_seconds_ = 0.0;

  // Commands from any thread to the loop.
  std::mutex cmd_mu_;
  std::condition_variable cmd_cv_;
  std::vector<Command> commands_;
  bool stop_requested_ = false;
  uint64_t next_id_ = 0;

  mutable std::mutex stats_mu_;
  EngineStats stats_;

  std::thread thread_;
  std::atomic<bool> loop_running_{false};
};

}  // namespace inferd
