#include "model/model.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/rope.h"

namespace inferd {

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const LoadOptions& options) {
  auto file = gguf::File::open(path);
  if (!file) return file.error();
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(*file);
  auto config = ModelConfig::from_gguf(*m->file_);
  if (!config) return make_error(path + ": " + config.error().message);
  m->config_ = *config;
  auto tok = Tokenizer::from_gguf(*m->file_);
  if (!tok) return make_error(path + ": " + tok.error().message);
  m->tokenizer_ = std::move(*tok);
  if (m->can_generate()) {
    auto w = ModelWeights::from_gguf(*m->file_, m->config_);
    if (!w) return make_error(path + ": " + w.error().message);
    m->weights_ = std::move(*w);
  }
  if (options.prefault) m->file_->prefault(options.progress ? options.progress : [](double) {});
  if (m->can_generate()) {
    // Repack the projections for the packed kernels (a copy of the weights;
    // the embedding table is still read from the file for token lookups).
    for (const LayerWeights& L : m->weights_.layers) {
      m->linears_.push_back({Linear::make(L.wq), Linear::make(L.wk), Linear::make(L.wv), Linear::make(L.wo),
                             Linear::make(L.w_gate), Linear::make(L.w_up), Linear::make(L.w_down)});
    }
    m->output_ = Linear::make(m->weights_.output);
  }
  return m;
}

namespace {

// out = x / rms(x) * weight, one row of n. As GGML does it: squares in float,
// summed in double, in order (so the result does not depend on the batch).
void rms_norm(const float* x, const float* weight, float* out, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void add_bias(float* y, const float* bias, int64_t n) {
  for (int64_t r = 0; r < n; ++r) y[r] += bias[r];
}

}  // namespace

// What every thread of one forward pass reads.
struct Model::Pass {
  const ForwardBatch* batch;
  KVCache* cache;
  float* logits;
  ThreadPool* pool;
};

void Model::attention(const Pass& pass, int64_t layer, int ti, int nt) {
  const ModelConfig& c = config_;
  const ForwardBatch& batch = *pass.batch;
  const int64_t D = c.head_dim, H = c.n_head, group = c.n_head / c.n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const uint16_t* kc = pass.cache->k(layer);
  const uint16_t* vc = pass.cache->v(layer);
  // One work item per (token, head); items are dealt out in contiguous runs.
  const auto [begin, end] = ThreadPool::split(batch.size() * H, ti, nt);
  size_t seq = 0;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t t = item / H, h = item % H;
    while (t >= batch.sequences[seq].first_token + batch.sequences[seq].n_tokens) ++seq;
    const SequenceSlice& sl = batch.sequences[seq];
    kernels::PagedKV kv{kc, vc, c.kv_dim(), pass.cache->block_size(), sl.block_table.data()};
    const int64_t pos = batch.positions[t];
    int64_t first = 0;
    if (c.sliding_window > 0 && pos + 1 > c.sliding_window) first = pos + 1 - c.sliding_window;
    const auto attn_pass = sl.n_tokens > 1 ? kernels::AttentionPass::kPrefill : kernels::AttentionPass::kDecode;
    kernels::attend_one_head(s_.q.data() + t * c.q_dim() + h * D, kv, (h / group) * D, D, first, pos + 1, scale,
                             attn_pass, s_.attn.data() + t * c.q_dim() + h * D);
  }
}

void Model::prepare_scratch(const ForwardBatch& batch) {
  const ModelConfig& c = config_;
  const int64_t T = batch.size(), R = static_cast<int64_t>(batch.logit_rows.size());
  s_.x.resize(T * c.n_embd);
  s_.h.resize(T * c.n_embd);
  s_.q.resize(T * c.q_dim());
  s_.k.resize(T * c.kv_dim());
  s_.v.resize(T * c.kv_dim());
  s_.attn.resize(T * c.q_dim());
  s_.gate.resize(T * c.n_ff);
  s_.up.resize(T * c.n_ff);
  s_.logits_in.resize(R * c.n_embd);
  s_.rope_cos.resize(T * (c.rope_dim / 2));
  s_.rope_sin.resize(T * (c.rope_dim / 2));
  for (const LayerLinears& L : linears_) {
    L.wq.prepare(s_.in_q, T);
    if (!L.wk.same_input(L.wq)) L.wk.prepare(s_.in_k, T);
    if (!L.wv.same_input(L.wq)) L.wv.prepare(s_.in_v, T);
    L.wo.prepare(s_.in_o, T);
    L.gate.prepare(s_.in_gate, T);
    if (!L.up.same_input(L.gate)) L.up.prepare(s_.in_up, T);
    L.down.prepare(s_.in_down, T);
  }
  output_.prepare(s_.in_out, R);
}

void Model::forward(const ForwardBatch& batch, KVCache& cache, std::vector<float>& logits, ThreadPool& pool) {
  prepare_scratch(batch);
  logits.resize(batch.logit_rows.size() * config_.n_vocab);
  const Pass pass{&batch, &cache, logits.data(), &pool};
  const Pass* p = &pass;  // one pointer captured: std::function keeps it inline, no allocation
  pool.run([this, p](int ti, int nt) { forward_thread(*p, ti, nt); });
}

// Phases alternate between splitting tokens across threads (norms, RoPE,
// quantizing a projection's input: each thread owns the same tokens in every
// such phase, so two in a row need no barrier) and splitting weight rows
// (projections) or (token, head) pairs (attention).
void Model::forward_thread(const Pass& pass, int ti, int nt) {
  const ModelConfig& c = config_;
  const ForwardBatch& batch = *pass.batch;
  ThreadPool& pool = *pass.pool;
  const int64_t T = batch.size(), E = c.n_embd, QD = c.q_dim(), KVD = c.kv_dim(), F = c.n_ff;
  const int64_t half = c.rope_dim / 2, D = c.head_dim;
  const auto rope_pairs = c.rope_style == RopeStyle::Neox ? kernels::RopePairs::kHalves : kernels::RopePairs::kAdjacent;
  const auto [t0, t1] = ThreadPool::split(T, ti, nt);

  // Token embeddings and rotary angles (theta_i = pos * base^(-2i / rope_dim)).
  const size_t embd_row_bytes = row_bytes(weights_.tok_embd.dtype, E);
  for (int64_t t = t0; t < t1; ++t) {
    const auto* row = static_cast<const uint8_t*>(weights_.tok_embd.data) +
                      static_cast<size_t>(batch.tokens[t]) * embd_row_bytes;
    kernels::dequantize_row(weights_.tok_embd.dtype, row, s_.x.data() + t * E, E);
    // theta_i = pos * scale^i, by repeated multiplication as GGML computes it.
    const float theta_scale = std::pow(c.rope_freq_base, -2.0f / c.rope_dim);
    float theta = static_cast<float>(batch.positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      s_.rope_cos[t * half + i] = std::cos(theta);
      s_.rope_sin[t * half + i] = std::sin(theta);
      theta *= theta_scale;
    }
  }

  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& W = weights_.layers[l];
    const LayerLinears& L = linears_[l];
    LinearInput& in_k = L.wk.same_input(L.wq) ? s_.in_q : s_.in_k;
    LinearInput& in_v = L.wv.same_input(L.wq) ? s_.in_q : s_.in_v;
    LinearInput& in_up = L.up.same_input(L.gate) ? s_.in_gate : s_.in_up;

    // Tokens: (the previous layer's residual,) attention norm, Q/K/V input.
    for (int64_t t = t0; t < t1; ++t) {
      float* x = s_.x.data() + t * E;
      if (l > 0) {
        const float* h = s_.h.data() + t * E;
        for (int64_t i = 0; i < E; ++i) x[i] += h[i];
      }
      rms_norm(x, W.attn_norm.f32(), s_.h.data() + t * E, E, c.rms_eps);
    }
    L.wq.quantize(s_.h.data(), t0, t1, s_.in_q);
    if (&in_k != &s_.in_q) L.wk.quantize(s_.h.data(), t0, t1, in_k);
    if (&in_v != &s_.in_q) L.wv.quantize(s_.h.data(), t0, t1, in_v);
    pool.barrier();

    L.wq.compute(s_.in_q, T, s_.q.data(), ti, nt);
    L.wk.compute(in_k, T, s_.k.data(), ti, nt);
    L.wv.compute(in_v, T, s_.v.data(), ti, nt);
    pool.barrier();

    // (Token, head) items, so that one token keeps both threads busy: a query
    // head, or a key head and its value head. Biases, RoPE, keys and values
    // into the cache.
    const int64_t heads_per_token = c.n_head + c.n_head_kv;
    const auto [i0, i1] = ThreadPool::split(T * heads_per_token, ti, nt);
    for (int64_t item = i0; item < i1; ++item) {
      const int64_t t = item / heads_per_token, h = item % heads_per_token;
      const float* cos_t = &s_.rope_cos[t * half];
      const float* sin_t = &s_.rope_sin[t * half];
      if (h < c.n_head) {
        float* q = s_.q.data() + t * QD + h * D;
        if (W.bq) add_bias(q, W.bq.f32() + h * D, D);
        kernels::rope_head(q, c.rope_dim, rope_pairs, cos_t, sin_t);
        continue;
      }
      const int64_t offset = (h - c.n_head) * D;
      float* k = s_.k.data() + t * KVD + offset;
      float* v = s_.v.data() + t * KVD + offset;
      if (W.bk) add_bias(k, W.bk.f32() + offset, D);
      if (W.bv) add_bias(v, W.bv.f32() + offset, D);
      kernels::rope_head(k, c.rope_dim, rope_pairs, cos_t, sin_t);
      kernels::quantize_row(DType::F16, k, pass.cache->k(l) + batch.slots[t] * KVD + offset, D);
      kernels::quantize_row(DType::F16, v, pass.cache->v(l) + batch.slots[t] * KVD + offset, D);
    }
    pool.barrier();

    attention(pass, l, ti, nt);
    pool.barrier();

    L.wo.quantize(s_.attn.data(), t0, t1, s_.in_o);
    pool.barrier();
    L.wo.compute(s_.in_o, T, s_.h.data(), ti, nt);
    pool.barrier();

    // Tokens: residual, FFN norm, gate/up input.
    for (int64_t t = t0; t < t1; ++t) {
      float* x = s_.x.data() + t * E;
      const float* h = s_.h.data() + t * E;
      for (int64_t i = 0; i < E; ++i) x[i] += h[i];
      rms_norm(x, W.ffn_norm.f32(), s_.h.data() + t * E, E, c.rms_eps);
    }
    L.gate.quantize(s_.h.data(), t0, t1, s_.in_gate);
    if (&in_up != &s_.in_gate) L.up.quantize(s_.h.data(), t0, t1, in_up);
    pool.barrier();

    L.gate.compute(s_.in_gate, T, s_.gate.data(), ti, nt);
    L.up.compute(in_up, T, s_.up.data(), ti, nt);
    pool.barrier();

    // Tokens: SwiGLU, down-projection input.
    kernels::swiglu(s_.gate.data() + t0 * F, s_.up.data() + t0 * F, s_.gate.data() + t0 * F, (t1 - t0) * F);
    L.down.quantize(s_.gate.data(), t0, t1, s_.in_down);
    pool.barrier();
    L.down.compute(s_.in_down, T, s_.h.data(), ti, nt);
    pool.barrier();
  }

  // Tokens: the last residual; final norm and output input for the rows whose
  // logits are wanted.
  for (int64_t t = t0; t < t1; ++t) {
    float* x = s_.x.data() + t * E;
    const float* h = s_.h.data() + t * E;
    for (int64_t i = 0; i < E; ++i) x[i] += h[i];
  }
  const int64_t R = static_cast<int64_t>(batch.logit_rows.size());
  for (int64_t r = 0; r < R; ++r) {
    const int64_t t = batch.logit_rows[r];
    if (t < t0 || t >= t1) continue;
    rms_norm(s_.x.data() + t * E, weights_.output_norm.f32(), s_.logits_in.data() + r * E, E, c.rms_eps);
    output_.quantize(s_.logits_in.data(), r, r + 1, s_.in_out);
  }
  pool.barrier();
  if (R > 0) output_.compute(s_.in_out, R, pass.logits, ti, nt);
}

}  // namespace inferd
