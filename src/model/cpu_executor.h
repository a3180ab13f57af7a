// The CPU executor: one hand-fused, barrier-synchronised forward pass over a
// ForwardBatch on a thread pool (GUIDE section 6). It owns what only the CPU
// needs beside the model's weights: the thread pool, the projections repacked
// for the packed kernels, the activations' scratch and each thread's
// weight-prefetch plan.
// It reads the model's per-layer data (ModelConfig, the layer plan) once per
// phase, never in the kernels' inner loops.
#pragma once
#include <array>
#include <atomic>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/flavour.h"
#include "kv/kv_cache_dtype.h"
#include "model/linear.h"
#include "model/model.h"
#include "model/weight_prefetch.h"

namespace inferd {

class CpuExecutor final : public Executor {
 public:
  CpuExecutor(const Model& model, std::shared_ptr<ThreadPool> pool);

  void forward(const ForwardBatch& batch, KVCache& cache, std::vector<float>& logits) override {
    forward_stage(batch, cache, nullptr, logits);
  }
  void forward_stage(const ForwardBatch& batch, KVCache& cache, const float* hidden_in,
                     std::vector<float>& out) override;
  void head_logits(const float* normed, int64_t n_rows, std::vector<float>& logits) override;
  std::shared_ptr<ThreadPool> thread_pool() const override { return pool_; }
  // Its attention kernels read F16, BF16, F8_E4M3, Q8_0 and Q4_0 keys and
  // values, latent caches included (kernels/cpu/attention.h); all but F16 in
  // heads of whole 32-element blocks.
  Status supports_kv_cache(const kv::KVCacheSpec& spec) const override {
    const std::string name = kv::kv_cache_dtype_name(spec.dtype);
    if (!kernels::attention_reads_kv(spec.dtype))
      return make_error("a KV cache of " + name +
                        " is not supported: the CPU attention kernels read f16, bf16, fp8_e4m3, q8_0 and q4_0 keys "
                        "and values");
    if (spec.dtype != DType::F16 && spec.head_size % 32 != 0)
      return make_error("a KV cache of " + name + " needs heads of whole 32-element blocks (this model's head is " +
                        std::to_string(spec.head_size) + "); use f16");
    return {};
  }

 private:
  std::shared_ptr<ThreadPool> pool_;  // possibly shared with another model's executor
  const ModelConfig& config_;
  const std::vector<LayerProgram>& programs_;  // each layer's phases, walked by forward_thread
  const ModelWeights& weights_;   // views of the model's file
  kernels::GgmlFlavour flavour_;  // whose rounding the kernels reproduce
  kernels::Numerics numerics_;    // exact: those bits; fast: the fast tier's kernels (linear.h)
  // The layers this executor runs (a pipeline stage's, Model::layer_begin):
  // only theirs are repacked; the head only on the last stage.
  const int64_t layer_begin_, layer_end_;
  bool last_stage() const { return layer_end_ == config_.n_layer; }
  // A tensor-parallel rank's exchange with the others (null: a whole model):
  // the heads' outputs, the activated FFN hidden and the output rows of
  // attn_output and ffn_down (or a mixture's experts' output rows) are
  // gathered on every rank, the head's logits to the root (model/tensor_parallel_comm.h), split as shard_ says.
  const std::shared_ptr<TensorParallelComm> comm_;
  const TensorShardPlan& shard_;
  const int64_t n_logits_;  // the whole head's rows (a rank computes its share)
  // The experts this executor holds, in the router's numbering: all, or an
  // expert-parallel rank's (its linears' expert i is expert experts_.begin + i).
  const ShardRange experts_;
  // With comm_: every rank's columns of `rows` rows of `part` put in place in
  // `whole` by one thread while the others wait; ends at a barrier.
  void gather_over_ranks(const float* part, int64_t rows, float* whole, const ShardSplit& split, int thread_index,
                         ThreadPool& pool, const BarrierIdle& idle);

  // What every thread of one forward pass reads.
  struct Pass {
    const ForwardBatch* batch;
    KVCache* cache;
    float* logits;  // or, before the last stage, the residual stream it hands on
    const float* hidden_in;  // after the first stage: the residual stream handed to it
    ThreadPool* pool;
    StepTokens tokens;   // every token of the batch
    StepTokens outputs;  // the rows the final norm computes: whose logits are returned, or (pooled) every token
    const int32_t* output_tokens;  // the batch token of each output row (null: row r is token r)
  };
  // A decoder embedding model (ModelConfig::returns_pooled): every token's
  // final-normed hidden state, pooled per sequence, instead of the LM head.
  const bool pooled_;
  // Whether it holds LM head rows (Model::head_rows), and whether its passes
  // run them (else head_logits does: a pipeline's shared head).
  const bool head_here_, head_in_pass_;
  void prepare_scratch(const ForwardBatch& batch, int n_threads);
  // A pooled model's last phase, after the final norm: this thread's share of
  // the output rows, each its sequence's pooled hidden states (model/pooling.h).
  void pool_outputs(const Pass& pass, int thread_index, int n_threads) const;
  // A stage before the last one's end: this thread's tokens of the residual
  // stream, with the pending branch output h (normalized by h_weight first
  // where given) added, into pass.logits.
  void hand_on_stream(const Pass& pass, const float* x, const float* h, const float* h_weight, int thread_index,
                      int n_threads) const;
  void prepare_moe_scratch(int64_t n_tokens, int n_threads);
  // One thread's part of the whole forward pass; phases end at pool barriers.
  void forward_thread(const Pass& pass, int thread_index, int n_threads);
  // A layer's phases (model/layer_program.h), each ending where forward_thread
  // says: Q/K/V with biases, norms, RoPE and the cache writes of this
  // thread's heads; attention over (token, head) items, each head's output
  // quantized for the output projection when o_block > 0.
  void qkv(const Pass& pass, int64_t layer, const QkvPhase& phase, const LinearInput& in_q, const LinearInput& in_k,
           const LinearInput& in_v, int thread_index, int n_threads);
  void attention(const Pass& pass, int64_t layer, const AttentionPhase& phase, int thread_index, int n_threads,
                 int64_t o_block);
  // Latent attention's phases (cpu_executor_mla.cpp), each ending at a
  // barrier: the queries (absorbed into the latent space) and the latent
  // cache's writes, from the norm's inputs for the query's first projection
  // and attn_kv_a_mqa; then attention over the latent cache, attn_v_b, and
  // the output projection's input.
  void mla_qkv(const Pass& pass, int64_t layer, const MlaQkvPhase& phase, const LinearInput& in_q,
               const LinearInput& in_kv, int thread_index, int n_threads, const BarrierIdle& idle);
  void mla_attention(const Pass& pass, int64_t layer, const MlaAttentionPhase& phase, int thread_index, int n_threads,
                     const BarrierIdle& idle);
  void prepare_mla_scratch(int64_t n_tokens);
  // A Gated DeltaNet layer's mixer (cpu_executor_delta_net.cpp): its four
  // projections from the norm's inputs, the short convolution and the gated
  // delta rule over each sequence's state slot (zeroed where the sequence
  // starts at position 0), the gated output norm and ssm_out into s_.h. Ends
  // at a barrier.
  void delta_net(const Pass& pass, int64_t layer, const LinearInput& in_qkv, const LinearInput& in_z,
                 const LinearInput& in_beta, const LinearInput& in_alpha, int thread_index, int n_threads,
                 const BarrierIdle& idle);
  void prepare_delta_net_scratch(int64_t n_tokens);
  // A Mamba-2 layer's mixer (cpu_executor_mamba2.cpp): ssm_in from the norm's
  // input, the short convolution and the selective scan over each sequence's
  // state slot (zeroed where the sequence starts at position 0), the skip,
  // the z gate, the grouped norm and ssm_out into s_.h. Ends at a barrier.
  void mamba2(const Pass& pass, int64_t layer, const LinearInput& in, int thread_index, int n_threads,
              const BarrierIdle& idle);
  void prepare_mamba2_scratch(int64_t n_tokens);
  struct NormTarget {
    const Linear* linear;
    LinearInput* in;
    const StepTokens* places = nullptr;  // the token places its input is quantized for (null: the phase's rows)
  };
  // whole_rows: this thread normalizes every row into its own xn and targets
  // (Scratch::own), and writes only its share of x_out. h_weight: h is
  // RMS-normalized with these weights before it is added (sandwich norms).
  // h_by_row: h holds the phase's rows, not the batch's tokens.
  void norm_phase(int thread_index, int n_threads, const StepTokens& rows, const int32_t* row_token, const float* x,
                  const float* h, const float* h_weight, float* x_out, const float* weight, float* xn,
                  std::initializer_list<NormTarget> all_targets, bool whole_rows = false, bool h_by_row = false);

  // A layer's projections (the layer plan, model/weights.h), in the form the
  // kernels run fastest (repacked or mapped).
  struct LayerLinears {
    std::array<Linear, kNumProjections> proj;  // a mixture-of-experts layer's FFN projections are empty
    // A mixture-of-experts FFN: the router and every expert's projections.
    Linear router;
    std::vector<Linear> gate_exps, up_exps, down_exps;
    Linear gate_shexp, up_shexp, down_shexp;  // its shared expert, else empty
    Linear gate_inp_shexp;                    // that expert's gate (one row, the router's input), else empty
    bool shared_expert() const { return gate_shexp.rows() > 0; }
    // Latent attention (MlaWeights), else empty: the query's first
    // projection (attn_q or attn_q_a), attn_q_b, attn_kv_a_mqa, and per head
    // attn_k_b and attn_v_b.
    Linear mla_q, mla_q_b, mla_kv_a;
    std::vector<Linear> mla_k_b, mla_v_b;
    bool latent_attention() const { return mla_kv_a.rows() > 0; }
    // A Gated DeltaNet layer (DeltaNetWeights), else empty: its projections
    // and its convolution kernel tap-major (kernels/cpu/short_conv.h).
    Linear dn_qkv, dn_z, dn_beta, dn_alpha, dn_out;
    std::vector<float> dn_conv;
    bool delta_net() const { return dn_qkv.rows() > 0; }
    // A Mamba-2 layer (Mamba2Weights), else empty: ssm_in, ssm_out and the
    // convolution kernel tap-major.
    Linear m_in, m_out;
    std::vector<float> m_conv;
    bool mamba2() const { return m_in.rows() > 0; }
    const Linear& operator[](Projection p) const { return proj[static_cast<int>(p)]; }
  };
  // y += bias over n elements (GGML's add, and add_id for per-expert rows).
  static void add_bias(float* y, const float* bias, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += bias[i];
  }
  // gate <- act(gate) * up over n elements, act as the architecture says.
  static void gated_activation(Activation act, float* gate, const float* up, int64_t n, kernels::GgmlFlavour flavour);
  // x <- act(x) over n elements (a non-gated MLP: DenseFfnPhase::gated false).
  static void plain_activation(Activation act, float* x, int64_t n);
  // The mixture-of-experts FFN of layer l after its norm phase (which filled
  // the router's and the experts' inputs): routing, each chosen expert's gated
  // MLP on the tokens routed to it (its weights read once per step), and the
  // weighted sum into h. Ends at a barrier. cpu_executor_moe.cpp.
  // With a shared expert, h already holds its output (by FFN row), and the
  // routed sum is added to it: routed + shared, as llama.cpp's ggml_add.
  // On an expert-parallel rank (shard_.experts) the rank computes its
  // experts' rows only and every rank's are gathered before the sum.
  void moe_ffn(const Pass& pass, int64_t l, const MoeFfnPhase& phase, const StepTokens& ffn,
               const LinearInput& in_router, const LinearInput& in_gate, const LinearInput& in_up, int ti, int nt,
               const BarrierIdle& idle);
  // The row alignment of gate/up's thread shares: the down projection's input
  // block when each thread can run the gated activation and that quantize on
  // its own rows right after gate/up (with shares nearly even), else 1.
  // down: the MLP's down projection, width its input's columns.
  int64_t own_rows_align(const Linear& down, int64_t width, int n_threads) const;
  // The query, key and value heads [q0, q1), [k0, k1), [v0, v1) a thread
  // computes and then rotates and writes to the cache.
  struct QkvHeads {
    int64_t q0, q1, k0, k1, v0, v1;
  };
  QkvHeads qkv_heads(int thread_index, int n_threads) const;
  // Builds s_.prefetch for a pool of n_threads (see forward_thread).
  void plan_prefetch(int n_threads);
  std::unique_ptr<kernels::PackedArena> packed_arena_;  // the repacked or copied weights; outlives the Linears
  std::vector<LayerLinears> linears_;
  Linear output_;

  // A norm's output rows and the quantized projection inputs made from them;
  // k, v and up are used only when those weights want another form than wq/gate.
  struct NormOutputs {
    std::vector<float> xn;
    LinearInput q, k, v, gate, up, router;
    LinearInput shexp_gate, shexp_up;  // a shared expert's (the batch's token places, not the experts')
    LinearInput dn_qkv, dn_z, dn_beta, dn_alpha;  // a Gated DeltaNet layer's projections'
    LinearInput m_in;                             // a Mamba-2 layer's ssm_in's
  };
  void prepare_norm_outputs(NormOutputs& out, int64_t n_tokens) const;

  // Activations for the current step, grown on demand and then reused.
  struct Scratch {
    std::vector<float> x, x2, h, q, k, v, attn, gate, up, logits_in;  // x, x2: the residual stream
    // A tensor-parallel rank's: its share of the logits, before the gather;
    // the heads' outputs and the activated FFN hidden of every rank
    // (gathered); its rows of attn_output's or ffn_down's outputs.
    std::vector<float> shard_logits, attn_gathered, hidden_gathered, shard_rows;
    // With an attention output gate: the query projection's rows (each head's
    // query, then its gate), and the gates' sigmoids by head as attn holds them.
    std::vector<float> q_gated, attn_gate;
    // The fast tier's decode split over the context (kernels::attend_heads_fast_parts):
    // the parts' softmax states (rows of a query head each: maximum, 8 lane
    // sums, D outputs), and per (decode token, key/value head) how many of its
    // parts are done; the thread that completes them joins them (and sets it back to 0).
    std::vector<float> part_m, part_lanes, part_o;
    std::vector<std::atomic<int32_t>> parts_done;
    // Per RoPE table (ModelConfig::ropes), per token, rope_dim/2 each.
    std::vector<std::vector<float>> rope_cos, rope_sin;
    // The norms' outputs, shared by the threads; in steps of at most
    // kOwnNormMaxTokens tokens each thread has its own instead (`own`, one per
    // thread, empty otherwise; see forward_thread).
    NormOutputs norm;
    std::vector<NormOutputs> own;
    // The other quantized projection inputs.
    LinearInput in_o, in_down, in_out;
    LinearInput in_down_shexp;  // a shared expert's down projection's (its width, not n_ff)
    std::vector<WeightPrefetcher> prefetch;  // one per thread
    std::vector<kernels::TokenPlace> places, output_places;  // see Pass::tokens, Pass::outputs
    std::vector<int32_t> token_seq;  // a pooled model's: each token's sequence in the batch
    // Every expert matmul runs in GGML's mul_mat_id order: one row at a time
    // (TokenPlace {1, 0}), whatever the batch (T x n_expert_used entries).
    std::vector<kernels::TokenPlace> expert_places;
    StepTokens expert_tokens;
    // A mixture-of-experts layer's step (cpu_executor_moe.cpp). "Choices"
    // are (token, chosen expert) pairs, t * n_expert_used + j; "routed rows"
    // are the same pairs grouped by expert, each expert's in token order.
    struct Moe {
      std::vector<float> logits;    // router logits, then probabilities: per token, n_expert
      std::vector<float> shared_gate;  // per token: the shared expert's gate logit, then its sigmoid
      std::vector<int32_t> chosen;  // per choice: the expert
      std::vector<float> weights;   // per choice: its weight
      // Per thread (each builds the same grouping, saving a barrier): routed
      // rows [first[e], first[e + 1]) are expert e's; row_choice and
      // choice_row map routed rows and choices to each other.
      std::vector<std::vector<int64_t>> first, row_choice, choice_row;
      LinearInput in_gate, in_up, in_down;  // gathered per routed row
      std::vector<float> gate, up, out;     // per routed row: n_ff_exp, n_ff_exp, n_embd
      ShardSplit gathered_rows;             // expert parallelism: each rank's routed rows
    } moe;
    // A latent-attention layer's step (cpu_executor_mla.cpp); R is kv_lora_rank,
    // W the latent and RoPE key (R + qk_rope), Wc the cache's slot: W, or W
    // padded with zeros to whole 32-element blocks for a quantized cache
    // (kv::KVCacheSpec::latent).
    struct Mla {
      std::vector<float> q_a;       // per token: q_lora_rank (normalized in place)
      std::vector<float> q;         // per token: n_head x (qk_nope + qk_rope)
      std::vector<float> kv;        // per token: W (latent, then the RoPE key)
      std::vector<float> q_nope;    // per head, per token: qk_nope (attn_k_b's input)
      std::vector<float> absorbed;  // per head, per token: R (attn_k_b's output)
      std::vector<float> q_latent;  // per token, per head: Wc (the attention's query, zero-padded)
      std::vector<float> out;       // per head, per token: R (the attention's output)
      std::vector<float> value;     // per head, per token: v_head (attn_v_b's output)
      LinearInput in_q_b;
      std::vector<LinearInput> in_k_b, in_v_b;  // per head
    } mla;
    // A Gated DeltaNet layer's step (cpu_executor_delta_net.cpp), per token:
    // C conv channels, V = value heads x head size, HV value heads.
    struct DeltaNet {
      std::vector<float> qkv;         // C: attn_qkv's output, the convolution's input
      std::vector<float> conv;        // C: its output, SiLU'd, queries and keys L2-normalized in place
      std::vector<float> z;           // V: attn_gate's output
      std::vector<float> beta, decay; // HV: sigmoid(ssm_beta x); ssm_alpha x, then the log decay
      std::vector<float> out;         // V: the delta rule's output, then gated and normalized
      LinearInput in_out;             // ssm_out's input
    } dn;
    // A Mamba-2 layer's step (cpu_executor_mamba2.cpp), per token: ssm_in's
    // rows (z, the conv channels, the time steps), the convolution's output
    // (x, B, C; SiLU'd) and the scan's output (gated and normalized in place).
    struct Mamba2 {
      std::vector<float> zxbcdt, conv, y;
      LinearInput in_out;  // ssm_out's input
    } m2;
  } s_;
};

}  // namespace inferd
