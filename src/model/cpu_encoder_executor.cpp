// The encoder's CPU pass (see model/cpu_encoder_executor.h).
#include "model/cpu_encoder_executor.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <variant>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/dense_attention.h"
#include "kernels/cpu/quants.h"
#include "model/pooling.h"

namespace inferd {

namespace {

// Phases split tokens (norms, activations, quantizing a projection's input),
// weight rows (projections) or (token, head) items (attention) over the
// threads, with a barrier between.
template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};

void add_bias(float* y, const float* bias, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += bias[i];
}


}  // namespace

CpuEncoderExecutor::CpuEncoderExecutor(const Model& model, std::shared_ptr<ThreadPool> pool)
    : pool_(std::move(pool)), config_(model.config()), programs_(model.layer_programs()), weights_(model.weights()) {
  size_t packed_bytes = 0;
  for (const LayerWeights& L : weights_.layers)
    for (Projection p : {Projection::kQ, Projection::kK, Projection::kV, Projection::kO, Projection::kUp,
                         Projection::kDown})
      packed_bytes += Linear::packed_bytes(L[p], model.numerics());
  if (packed_bytes > 0) packed_arena_ = std::make_unique<kernels::PackedArena>(packed_bytes);
  const auto make = [&](const WeightView& w) {
    return Linear::make(w, packed_arena_.get(), model.ggml_flavour(), model.numerics());
  };
  for (const LayerWeights& L : weights_.layers) {
    linears_.push_back(LayerLinears{make(L[Projection::kQ]), make(L[Projection::kK]), make(L[Projection::kV]),
                                    make(L[Projection::kO]), make(L[Projection::kUp]), make(L[Projection::kDown])});
  }
}

int64_t CpuEncoderExecutor::output_width() const {
  return config_.pooling == PoolingType::kRank ? weights_.cls_out.rows : config_.n_embd;
}

void CpuEncoderExecutor::forward(const ForwardBatch& batch, KVCache&, std::vector<float>& outputs) {
  const ModelConfig& c = config_;
  const int64_t T = batch.size();
  s_.x.resize(T * c.n_embd);
  s_.h.resize(T * c.n_embd);
  s_.q.resize(T * c.q_dim());
  s_.k.resize(T * c.kv_dim());
  s_.v.resize(T * c.kv_dim());
  s_.attn.resize(T * c.q_dim());
  s_.up.resize(T * c.n_ff);
  for (const LayerLinears& L : linears_) {
    L.q.prepare(s_.in_q, T);
    if (!L.k.same_input(L.q)) L.k.prepare(s_.in_k, T);
    if (!L.v.same_input(L.q)) L.v.prepare(s_.in_v, T);
    L.o.prepare(s_.in_o, T);
    L.up.prepare(s_.in_up, T);
    L.down.prepare(s_.in_down, T);
  }
  s_.places.resize(T);
  s_.token_seq.resize(T);
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const SequenceSlice& sl = batch.sequences[i];
    for (int32_t j = 0; j < sl.n_tokens; ++j) {
      s_.places[sl.first_token + j] = kernels::TokenPlace{sl.n_tokens, j};
      s_.token_seq[sl.first_token + j] = static_cast<int32_t>(i);
    }
  }
  outputs.resize(batch.logit_rows.size() * static_cast<size_t>(output_width()));
  const Pass pass{&batch, outputs.data(), {T, s_.places.data()}};
  const Pass* p = &pass;
  pool_->run([this, p](int ti, int nt) { forward_thread(*p, ti, nt); });
}

void CpuEncoderExecutor::add_layer_norm(float* x, const float* h, const float* bias, const float* weight,
                                        const float* norm_bias, int64_t t0, int64_t t1) const {
  const int64_t E = config_.n_embd;
  for (int64_t t = t0; t < t1; ++t) {
    float* row = x + t * E;
    if (h)
      for (int64_t i = 0; i < E; ++i) row[i] += h[t * E + i] + (bias ? bias[i] : 0.0f);
    double sum = 0.0;
    for (int64_t i = 0; i < E; ++i) sum += row[i];
    const float mean = static_cast<float>(sum / static_cast<double>(E));
    double var = 0.0;
    for (int64_t i = 0; i < E; ++i) var += static_cast<double>(row[i] - mean) * (row[i] - mean);
    const float inv = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(E) + config_.layer_norm_eps));
    for (int64_t i = 0; i < E; ++i) row[i] = (row[i] - mean) * inv * weight[i] + norm_bias[i];
  }
}

// Softmax attention of each (sequence, head) over the sequence's own keys:
// every one of them (non-causal), or those up to each token's own (causal).
void CpuEncoderExecutor::attention(const Pass& pass, const AttentionPhase& phase, int ti, int nt) {
  const ModelConfig& c = config_;
  const ForwardBatch& batch = *pass.batch;
  const int64_t H = c.n_head, D = c.head_dim, group = c.n_head / c.n_head_kv, QD = c.q_dim(), KVD = c.kv_dim();
  const int64_t n_seq = static_cast<int64_t>(batch.sequences.size());
  const auto [begin, end] = ThreadPool::split(n_seq * H, ti, nt);
  for (int64_t item = begin; item < end; ++item) {
    const SequenceSlice& sl = batch.sequences[item / H];
    const int64_t h = item % H, g = h / group, first = sl.first_token;
    kernels::DenseAttentionArgs a;
    a.q = s_.q.data() + first * QD + h * D;
    a.k = s_.k.data() + first * KVD + g * D;
    a.v = s_.v.data() + first * KVD + g * D;
    a.out = s_.attn.data() + first * QD + h * D;
    a.q_stride = a.out_stride = QD;
    a.kv_stride = KVD;
    a.n = sl.n_tokens, a.D = D, a.scale = phase.kq_scale, a.causal = phase.causal;
    kernels::dense_attention(a);
  }
}

void CpuEncoderExecutor::forward_thread(const Pass& pass, int ti, int nt) {
  const ModelConfig& c = config_;
  const ForwardBatch& batch = *pass.batch;
  ThreadPool& pool = *pool_;
  const int64_t T = batch.size(), E = c.n_embd, F = c.n_ff;
  const auto [t0, t1] = ThreadPool::split(T, ti, nt);
  float* x = s_.x.data();

  // Token, position and token-type (row 0, "sentence A", as llama.cpp) embeddings, then their LayerNorm.
  const size_t tok_row = row_bytes(weights_.tok_embd.dtype, E), pos_row = row_bytes(weights_.position_embd.dtype, E);
  thread_local std::vector<float> row;
  row.resize(E);
  for (int64_t t = t0; t < t1; ++t) {
    float* xt = x + t * E;
    kernels::dequantize_row(weights_.tok_embd.dtype,
                            static_cast<const uint8_t*>(weights_.tok_embd.data) + batch.tokens[t] * tok_row, xt, E);
    const int64_t pos = std::min<int64_t>(batch.positions[t], c.context_length - 1);  // the engine refuses longer inputs
    kernels::dequantize_row(weights_.position_embd.dtype,
                            static_cast<const uint8_t*>(weights_.position_embd.data) + pos * pos_row, row.data(), E);
    for (int64_t i = 0; i < E; ++i) xt[i] += row[i];
    kernels::dequantize_row(weights_.token_types.dtype, weights_.token_types.data, row.data(), E);
    for (int64_t i = 0; i < E; ++i) xt[i] += row[i];
  }
  add_layer_norm(x, nullptr, nullptr, weights_.token_embd_norm.f32(), weights_.token_embd_norm_b.f32(), t0, t1);
  pool.barrier();

  // The branch output waiting for the next LayerNormPhase's add (in s_.h), with its bias.
  const float* pending_bias = nullptr;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& W = weights_.layers[l];
    const LayerLinears& L = linears_[l];
    for (const Phase& phase : programs_[l].phases) {
      std::visit(
          Overloaded{
              [&](const QkvPhase&) {
                LinearInput& in_k = L.k.same_input(L.q) ? s_.in_q : s_.in_k;
                LinearInput& in_v = L.v.same_input(L.q) ? s_.in_q : s_.in_v;
                L.q.quantize(x, t0, t1, pass.tokens, s_.in_q);
                if (&in_k != &s_.in_q) L.k.quantize(x, t0, t1, pass.tokens, in_k);
                if (&in_v != &s_.in_q) L.v.quantize(x, t0, t1, pass.tokens, in_v);
                pool.barrier();
                L.q.compute(s_.in_q, pass.tokens, s_.q.data(), ti, nt);
                L.k.compute(in_k, pass.tokens, s_.k.data(), ti, nt);
                L.v.compute(in_v, pass.tokens, s_.v.data(), ti, nt);
                pool.barrier();
                const int64_t QD = c.q_dim(), KVD = c.kv_dim();
                for (int64_t t = t0; t < t1; ++t) {
                  if (W.bq) add_bias(s_.q.data() + t * QD, W.bq.f32(), QD);
                  if (W.bk) add_bias(s_.k.data() + t * KVD, W.bk.f32(), KVD);
                  if (W.bv) add_bias(s_.v.data() + t * KVD, W.bv.f32(), KVD);
                }
                pool.barrier();
              },
              [&](const AttentionPhase& ph) {
                attention(pass, ph, ti, nt);
                pool.barrier();
                L.o.quantize(s_.attn.data(), t0, t1, pass.tokens, s_.in_o);
                pool.barrier();
              },
              [&](const OutputPhase&) {
                L.o.compute(s_.in_o, pass.tokens, s_.h.data(), ti, nt);
                pending_bias = W.bo ? W.bo.f32() : nullptr;
                pool.barrier();
              },
              [&](const LayerNormPhase& ph) {
                const bool attn = ph.after == NormPhase::Branch::kAttention;
                const WeightView &w = attn ? W.attn_norm : W.ffn_norm, &b = attn ? W.attn_norm_b : W.ffn_norm_b;
                add_layer_norm(x, s_.h.data(), pending_bias, w.f32(), b.f32(), t0, t1);
                pending_bias = nullptr;
                pool.barrier();
              },
              [&](const PlainFfnPhase& ph) {
                assert(ph.activation == Activation::kGelu);
                L.up.quantize(x, t0, t1, pass.tokens, s_.in_up);
                pool.barrier();
                L.up.compute(s_.in_up, pass.tokens, s_.up.data(), ti, nt);
                pool.barrier();
                for (int64_t t = t0; t < t1; ++t) {
                  float* u = s_.up.data() + t * F;
                  add_bias(u, W.b_up.f32(), F);
                  kernels::gelu(u, u, F);
                }
                L.down.quantize(s_.up.data(), t0, t1, pass.tokens, s_.in_down);
                pool.barrier();
                L.down.compute(s_.in_down, pass.tokens, s_.h.data(), ti, nt);
                pending_bias = W.b_down.f32();
                pool.barrier();
              },
              // A decoder's phases: never in an encoder's program (build_layer_programs).
              [&](const auto&) { assert(false); },
          },
          phase);
    }
  }

  // Each output row's sequence pooled.
  const int64_t R = static_cast<int64_t>(batch.logit_rows.size()), width = output_width();
  const auto [r0, r1] = ThreadPool::split(R, ti, nt);
  for (int64_t r = r0; r < r1; ++r)
    pool_sequence(batch.sequences[s_.token_seq[batch.logit_rows[r]]], pass.outputs + r * width);
}

void CpuEncoderExecutor::pool_sequence(const SequenceSlice& sl, float* out) const {
  const int64_t E = config_.n_embd;
  const float* x = s_.x.data();
  const float* first = x + static_cast<int64_t>(sl.first_token) * E;
  if (config_.pooling != PoolingType::kRank) return pool_rows(config_.pooling, first, sl.n_tokens, E, out);
  // The [CLS] row through the classification head: tanh(cls x + b), then cls.output.
  thread_local std::vector<float> hidden, w;
  hidden.assign(first, first + E);
  w.resize(E);
  auto matvec = [&](const WeightView& m, const WeightView& b, const std::vector<float>& in, float* y) {
    for (int64_t o = 0; o < m.rows; ++o) {
      kernels::dequantize_row(m.dtype, static_cast<const uint8_t*>(m.data) + o * row_bytes(m.dtype, m.cols),
                              w.data(), m.cols);
      double dot = 0.0;
      for (int64_t i = 0; i < m.cols; ++i) dot += static_cast<double>(w[i]) * in[i];
      y[o] = static_cast<float>(dot) + (b ? b.f32()[o] : 0.0f);
    }
  };
  if (weights_.cls) {
    std::vector<float> dense(E);
    matvec(weights_.cls, weights_.cls_b, hidden, dense.data());
    for (int64_t i = 0; i < E; ++i) hidden[i] = std::tanh(dense[i]);
  }
  matvec(weights_.cls_out, weights_.cls_out_b, hidden, out);
}

}  // namespace inferd
