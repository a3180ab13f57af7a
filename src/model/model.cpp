#include "model/model.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/quants.h"

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
  return m;
}

namespace {

// out = x / rms(x) * weight, one row of n. Sum of squares in double, in order,
// so the result does not depend on the batch.
void rms_norm(const float* x, const float* weight, float* out, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void add_bias(float* y, const float* bias, int64_t rows, int64_t n_tokens) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t r = 0; r < rows; ++r) y[t * rows + r] += bias[r];
}

void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool,
            kernels::Workspace& ws) {
  kernels::matmul(w.dtype, w.data, w.rows, w.cols, x, n_tokens, y, pool, ws);
}

// Rotates `n_heads` heads of `head_dim` in place for one token.
void apply_rope(float* v, int64_t n_heads, int64_t head_dim, int64_t rope_dim, RopeStyle style,
                const float* cos_t, const float* sin_t) {
  const int64_t half = rope_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* x = v + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = style == RopeStyle::Interleaved ? 2 * i : i;
      const int64_t b = style == RopeStyle::Interleaved ? 2 * i + 1 : i + half;
      const float x0 = x[a], x1 = x[b];
      x[a] = x0 * cos_t[i] - x1 * sin_t[i];
      x[b] = x0 * sin_t[i] + x1 * cos_t[i];
    }
  }
}

}  // namespace

void Model::attention(const ForwardBatch& batch, KVCache& cache, int64_t layer, ThreadPool& pool) {
  const ModelConfig& c = config_;
  const int64_t D = c.head_dim, H = c.n_head, group = c.n_head / c.n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const uint16_t* kc = cache.k(layer);
  const uint16_t* vc = cache.v(layer);
  // One work item per (token, head); items are dealt out in contiguous runs.
  const int64_t n_items = batch.size() * H;
  pool.run([&](int ti, int nt) {
    auto [begin, end] = ThreadPool::split(n_items, ti, nt);
    size_t seq = 0;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / H, h = item % H;
      while (t >= batch.sequences[seq].first_token + batch.sequences[seq].n_tokens) ++seq;
      const SequenceSlice& s = batch.sequences[seq];
      kernels::PagedKV kv{kc, vc, c.kv_dim(), cache.block_size(), s.block_table.data()};
      const int64_t pos = batch.positions[t];
      int64_t first = 0;
      if (c.sliding_window > 0 && pos + 1 > c.sliding_window) first = pos + 1 - c.sliding_window;
      kernels::attend_one_head(s_.q.data() + t * c.q_dim() + h * D, kv, (h / group) * D, D, first,
                               pos + 1, scale, s_.attn.data() + t * c.q_dim() + h * D);
    }
  });
}

void Model::forward(const ForwardBatch& batch, KVCache& cache, std::vector<float>& logits,
                    ThreadPool& pool) {
  const ModelConfig& c = config_;
  const int64_t T = batch.size(), E = c.n_embd, QD = c.q_dim(), KVD = c.kv_dim();
  s_.x.resize(T * E);
  s_.h.resize(T * E);
  s_.q.resize(T * QD);
  s_.k.resize(T * KVD);
  s_.v.resize(T * KVD);
  s_.attn.resize(T * QD);
  s_.gate.resize(T * c.n_ff);
  s_.up.resize(T * c.n_ff);

  // Token embeddings.
  const size_t embd_row_bytes = row_bytes(weights_.tok_embd.dtype, E);
  for (int64_t t = 0; t < T; ++t) {
    const auto* row = static_cast<const uint8_t*>(weights_.tok_embd.data) +
                      static_cast<size_t>(batch.tokens[t]) * embd_row_bytes;
    kernels::dequantize_row(weights_.tok_embd.dtype, row, s_.x.data() + t * E, E);
  }

  // Rotary angles per token: theta_i = pos * base^(-2i / rope_dim).
  const int64_t half = c.rope_dim / 2;
  s_.rope_cos.resize(T * half);
  s_.rope_sin.resize(T * half);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float freq = std::pow(c.rope_freq_base, -2.0f * i / c.rope_dim);
      const float theta = batch.positions[t] * freq;
      s_.rope_cos[t * half + i] = std::cos(theta);
      s_.rope_sin[t * half + i] = std::sin(theta);
    }
  }

  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = weights_.layers[l];
    for (int64_t t = 0; t < T; ++t)
      rms_norm(s_.x.data() + t * E, L.attn_norm.f32(), s_.h.data() + t * E, E, c.rms_eps);
    matmul(L.wq, s_.h.data(), T, s_.q.data(), pool, s_.ws);
    matmul(L.wk, s_.h.data(), T, s_.k.data(), pool, s_.ws);
    matmul(L.wv, s_.h.data(), T, s_.v.data(), pool, s_.ws);
    if (L.bq) add_bias(s_.q.data(), L.bq.f32(), QD, T);
    if (L.bk) add_bias(s_.k.data(), L.bk.f32(), KVD, T);
    if (L.bv) add_bias(s_.v.data(), L.bv.f32(), KVD, T);

    uint16_t* kc = cache.k(l);
    uint16_t* vc = cache.v(l);
    for (int64_t t = 0; t < T; ++t) {
      float* q = s_.q.data() + t * QD;
      float* k = s_.k.data() + t * KVD;
      apply_rope(q, c.n_head, c.head_dim, c.rope_dim, c.rope_style, &s_.rope_cos[t * half],
                 &s_.rope_sin[t * half]);
      apply_rope(k, c.n_head_kv, c.head_dim, c.rope_dim, c.rope_style, &s_.rope_cos[t * half],
                 &s_.rope_sin[t * half]);
      uint16_t* kdst = kc + batch.slots[t] * KVD;
      uint16_t* vdst = vc + batch.slots[t] * KVD;
      const float* v = s_.v.data() + t * KVD;
      for (int64_t i = 0; i < KVD; ++i) {
        kdst[i] = kernels::f32_to_f16(k[i]);
        vdst[i] = kernels::f32_to_f16(v[i]);
      }
    }
    attention(batch, cache, l, pool);
    matmul(L.wo, s_.attn.data(), T, s_.h.data(), pool, s_.ws);
    for (int64_t i = 0; i < T * E; ++i) s_.x[i] += s_.h[i];

    for (int64_t t = 0; t < T; ++t)
      rms_norm(s_.x.data() + t * E, L.ffn_norm.f32(), s_.h.data() + t * E, E, c.rms_eps);
    matmul(L.w_gate, s_.h.data(), T, s_.gate.data(), pool, s_.ws);
    matmul(L.w_up, s_.h.data(), T, s_.up.data(), pool, s_.ws);
    for (int64_t i = 0; i < T * c.n_ff; ++i) {
      const float g = s_.gate[i];
      s_.gate[i] = g / (1.0f + std::exp(-g)) * s_.up[i];
    }
    matmul(L.w_down, s_.gate.data(), T, s_.h.data(), pool, s_.ws);
    for (int64_t i = 0; i < T * E; ++i) s_.x[i] += s_.h[i];
  }

  // Final norm and output projection, only for the rows whose logits are wanted.
  const int64_t R = static_cast<int64_t>(batch.logit_rows.size());
  s_.logits_in.resize(R * E);
  for (int64_t r = 0; r < R; ++r)
    rms_norm(s_.x.data() + int64_t{batch.logit_rows[r]} * E, weights_.output_norm.f32(),
             s_.logits_in.data() + r * E, E, c.rms_eps);
  logits.resize(R * c.n_vocab);
  if (R > 0) matmul(weights_.output, s_.logits_in.data(), R, logits.data(), pool, s_.ws);
}

}  // namespace inferd
