#include "model/model.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <iterator>
#include <numeric>
#include <tuple>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/rms_norm.h"
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
    size_t packed_bytes = Linear::packed_bytes(m->weights_.output);
    for (const LayerWeights& L : m->weights_.layers) {
      for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
        packed_bytes += Linear::packed_bytes(*w);
    }
    if (packed_bytes > 0) m->packed_arena_ = std::make_unique<kernels::PackedArena>(packed_bytes);
    kernels::PackedArena* arena = m->packed_arena_.get();
    for (const LayerWeights& L : m->weights_.layers) {
      m->linears_.push_back({Linear::make(L.wq, arena), Linear::make(L.wk, arena), Linear::make(L.wv, arena),
                             Linear::make(L.wo, arena), Linear::make(L.w_gate, arena), Linear::make(L.w_up, arena),
                             Linear::make(L.w_down, arena)});
    }
    m->output_ = Linear::make(m->weights_.output, arena);
  }
  return m;
}

namespace {

void add_bias(float* y, const float* bias, int64_t n) {
  for (int64_t r = 0; r < n; ++r) y[r] += bias[r];
}

// The block size by which `linear` can quantize a row of `cols`, or 0 if it
// quantizes whole rows only (then a row is not split between threads).
int64_t quantize_block_of(const Linear& linear, int64_t cols) {
  const int64_t b = linear.quantize_block();
  return b > 0 && cols % b == 0 ? b : 0;
}

// A waiting thread prefetches its next weights (WeightPrefetcher) at most this
// far ahead of its reading, well inside its L2, a few lines between two polls
// of the barrier.
constexpr size_t kPrefetchLead = size_t{256} << 10;
constexpr int kPrefetchLinesPerPoll = 4;

// Steps of at most this many tokens (decode) have every thread normalize the
// whole row and quantize it into its own copy of the next projections' input:
// the thread then goes on to its rows of those projections without waiting
// for the others, two barriers less per layer. The norm and quantization are
// repeated by each thread, which costs less than a barrier for a few rows.
constexpr int64_t kOwnNormMaxTokens = 4;

bool prefetch_while_waiting(void* prefetcher) {
  return static_cast<WeightPrefetcher*>(prefetcher)->advance(kPrefetchLinesPerPoll, kPrefetchLead);
}

}  // namespace

int64_t Model::own_rows_align(const LayerLinears& L) const {
  const int64_t down_block = quantize_block_of(L.down, config_.n_ff);
  return down_block > 0 && L.gate.packed() && L.up.packed() ? down_block : 1;
}

// Q, K and V heads taken as one list (query heads, then key heads, then value
// heads) split evenly over the threads in units that keep every share on whole
// 16-row groups of the packed weights (one head when head_dim % 16 == 0).
Model::QkvHeads Model::qkv_heads(int ti, int nt) const {
  const int64_t H = config_.n_head, Hkv = config_.n_head_kv;
  const int64_t unit = kernels::kPackRows / std::gcd(config_.head_dim, int64_t{kernels::kPackRows});
  const int64_t uq = (H + unit - 1) / unit, ukv = (Hkv + unit - 1) / unit;
  const auto [u0, u1] = ThreadPool::split(uq + 2 * ukv, ti, nt);
  // This thread's heads of the matrix whose units start at `first` and that has n heads.
  auto heads = [&](int64_t first, int64_t n_units, int64_t n) {
    const int64_t a = std::clamp(u0 - first, int64_t{0}, n_units), b = std::clamp(u1 - first, int64_t{0}, n_units);
    return std::pair{std::min(a * unit, n), std::min(b * unit, n)};
  };
  const auto [q0, q1] = heads(0, uq, H);
  const auto [k0, k1] = heads(uq, ukv, Hkv);
  const auto [v0, v1] = heads(uq + ukv, ukv, Hkv);
  return {q0, q1, k0, k1, v0, v1};
}

// Each thread's share of every projection in the order forward_thread reads
// them: seven per layer, then the output projection. Fixed for a thread count.
void Model::plan_prefetch(int n_threads) {
  s_.prefetch.resize(n_threads);
  for (int ti = 0; ti < n_threads; ++ti) {
    WeightPrefetcher& pf = s_.prefetch[ti];
    pf.clear();
    const QkvHeads mine = qkv_heads(ti, n_threads);
    const int64_t D = config_.head_dim;
    for (const LayerLinears& L : linears_) {
      for (const auto& [linear, h0, h1] : {std::tuple{&L.wq, mine.q0, mine.q1}, {&L.wk, mine.k0, mine.k1},
                                           {&L.wv, mine.v0, mine.v1}}) {
        const auto [bytes, n] = linear->rows_bytes(h0 * D, h1 * D);
        pf.add(bytes, n);
      }
      const int64_t align = own_rows_align(L);
      for (const auto& [linear, a] : {std::pair{&L.wo, int64_t{1}}, {&L.gate, align}, {&L.up, align}, {&L.down, 1}}) {
        const auto [bytes, n] = linear->thread_bytes(ti, n_threads, a);
        pf.add(bytes, n);
      }
    }
    const auto [bytes, n] = output_.thread_bytes(ti, n_threads);
    pf.add(bytes, n);
  }
}

// What every thread of one forward pass reads.
struct Model::Pass {
  const ForwardBatch* batch;
  KVCache* cache;
  float* logits;
  ThreadPool* pool;
};

void Model::attention(const Pass& pass, int64_t layer, int ti, int nt, int64_t o_block) {
  const ModelConfig& c = config_;
  const ForwardBatch& batch = *pass.batch;
  const int64_t D = c.head_dim, H = c.n_head, group = c.n_head / c.n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const uint16_t* kc = pass.cache->k(layer);
  const uint16_t* vc = pass.cache->v(layer);
  // One work item per (token, head); items are dealt out in contiguous runs,
  // and the heads of a run that share a key/value head are computed together.
  const auto [begin, end] = ThreadPool::split(batch.size() * H, ti, nt);
  size_t seq = 0;
  for (int64_t item = begin, n_heads = 0; item < end; item += n_heads) {
    const int64_t t = item / H, h = item % H;
    n_heads = std::min(end - item, group - h % group);
    while (t >= batch.sequences[seq].first_token + batch.sequences[seq].n_tokens) ++seq;
    const SequenceSlice& sl = batch.sequences[seq];
    kernels::PagedKV kv{kc, vc, c.kv_dim(), pass.cache->block_size(), sl.block_table.data()};
    const int64_t pos = batch.positions[t];
    int64_t first = 0;
    if (c.sliding_window > 0 && pos + 1 > c.sliding_window) first = pos + 1 - c.sliding_window;
    const auto attn_pass = sl.n_tokens > 1 ? kernels::AttentionPass::kPrefill : kernels::AttentionPass::kDecode;
    kernels::attend_heads(s_.q.data() + t * c.q_dim() + h * D, n_heads, kv, (h / group) * D, D, first, pos + 1,
                          scale, attn_pass, s_.attn.data() + t * c.q_dim() + h * D);
    if (o_block > 0) {
      linears_[layer].wo.quantize_blocks(s_.attn.data(), t, h * D / o_block, (h + n_heads) * D / o_block, s_.in_o);
    }
  }
}

void Model::prepare_scratch(const ForwardBatch& batch, int n_threads) {
  const ModelConfig& c = config_;
  const int64_t T = batch.size(), R = static_cast<int64_t>(batch.logit_rows.size());
  s_.x.resize(T * c.n_embd);
  s_.x2.resize(T * c.n_embd);
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
    L.wo.prepare(s_.in_o, T);
    L.down.prepare(s_.in_down, T);
  }
  output_.prepare(s_.in_out, R);
  prepare_norm_outputs(s_.norm, T);
  s_.own.resize(T <= kOwnNormMaxTokens && n_threads > 1 ? n_threads : 0);
  for (NormOutputs& own : s_.own) prepare_norm_outputs(own, T);
}

void Model::prepare_norm_outputs(NormOutputs& out, int64_t T) const {
  out.xn.resize(T * config_.n_embd);
  for (const LayerLinears& L : linears_) {
    L.wq.prepare(out.q, T);
    if (!L.wk.same_input(L.wq)) L.wk.prepare(out.k, T);
    if (!L.wv.same_input(L.wq)) L.wv.prepare(out.v, T);
    L.gate.prepare(out.gate, T);
    if (!L.up.same_input(L.gate)) L.up.prepare(out.up, T);
  }
}

void Model::forward(const ForwardBatch& batch, KVCache& cache, std::vector<float>& logits, ThreadPool& pool) {
  prepare_scratch(batch, pool.size());
  logits.resize(batch.logit_rows.size() * config_.n_vocab);
  if (s_.prefetch.size() != static_cast<size_t>(pool.size())) plan_prefetch(pool.size());
  const Pass pass{&batch, &cache, logits.data(), &pool};
  const Pass* p = &pass;  // one pointer captured: std::function keeps it inline, no allocation
  pool.run([this, p](int ti, int nt) { forward_thread(*p, ti, nt); });
}

// RMSNorm rows, each row r reading token row_token[r] (or r): x + h (when h is
// given) into x_out (when given), the normalized row into xn[r], then the
// inputs of `targets` quantized from xn (a target whose input an earlier one
// already fills, Linear::same_input, is skipped). When every target quantizes
// by 32-column blocks, threads split (row, block) items, so one token keeps
// both busy; x_out must then not alias x (another thread may still be reading it).
void Model::norm_phase(int ti, int nt, int64_t n_rows, const int32_t* row_token, const float* x, const float* h,
                       float* x_out, const float* weight, float* xn, std::initializer_list<NormTarget> all_targets,
                       bool whole_rows) {
  const int64_t E = config_.n_embd;
  const float eps = config_.rms_eps;
  NormTarget targets[4] = {};
  int n_targets = 0;
  assert(all_targets.size() <= std::size(targets));
  for (const NormTarget& tg : all_targets) {
    bool filled = false;
    for (int i = 0; i < n_targets; ++i) filled = filled || targets[i].in == tg.in;
    if (!filled) targets[n_targets++] = tg;
  }
  // The block every target quantizes by, or 0 when they differ or one
  // quantizes whole rows only.
  int64_t block = quantize_block_of(*targets[0].linear, E);
  for (int i = 1; i < n_targets; ++i)
    if (quantize_block_of(*targets[i].linear, E) != block) block = 0;
  auto token = [row_token](int64_t r) { return row_token ? int64_t{row_token[r]} : r; };
  if (whole_rows) {
    const auto [c0, c1] = ThreadPool::split(E, ti, nt);
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t t = token(r);
      kernels::rms_norm_row(x + t * E, h ? h + t * E : nullptr, weight, E, eps, 0, E, nullptr, xn + r * E);
      if (!x_out) continue;
      for (int64_t i = c0; i < c1; ++i) x_out[t * E + i] = h ? x[t * E + i] + h[t * E + i] : x[t * E + i];
    }
    for (int i = 0; i < n_targets; ++i) targets[i].linear->quantize(xn, 0, n_rows, *targets[i].in);
    return;
  }
  if (block == 0) {
    const auto [r0, r1] = ThreadPool::split(n_rows, ti, nt);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = token(r);
      kernels::rms_norm_row(x + t * E, h ? h + t * E : nullptr, weight, E, eps, 0, E, x_out ? x_out + t * E : nullptr,
                        xn + r * E);
    }
    for (int i = 0; i < n_targets; ++i) targets[i].linear->quantize(xn, r0, r1, *targets[i].in);
    return;
  }
  // Items are (row, block) pairs, row-major; this thread's run [i0, i1) covers
  // blocks [b0, b1) of each row it touches.
  const int64_t nb = E / block;
  const auto [i0, i1] = ThreadPool::split(n_rows * nb, ti, nt);
  for (int64_t r = i0 / nb; r < n_rows && r * nb < i1; ++r) {
    const int64_t b0 = std::max(i0 - r * nb, int64_t{0}), b1 = std::min(i1 - r * nb, nb);
    const int64_t t = token(r);
    kernels::rms_norm_row(x + t * E, h ? h + t * E : nullptr, weight, E, eps, b0 * block, b1 * block,
                      x_out ? x_out + t * E : nullptr, xn + r * E);
    for (int i = 0; i < n_targets; ++i) targets[i].linear->quantize_blocks(xn, r, b0, b1, *targets[i].in);
  }
}

// Phases alternate between splitting tokens, or (token, column block) items,
// across threads (norms, SwiGLU, quantizing a projection's input) and
// splitting weight rows (projections) or (token, head) pairs (RoPE,
// attention), with a barrier between. The residual stream alternates between
// two buffers, so a norm phase can read one while writing the other.
void Model::forward_thread(const Pass& pass, int ti, int nt) {
  const ModelConfig& c = config_;
  const ForwardBatch& batch = *pass.batch;
  ThreadPool& pool = *pass.pool;
  const int64_t T = batch.size(), E = c.n_embd, QD = c.q_dim(), KVD = c.kv_dim(), F = c.n_ff;
  const int64_t half = c.rope_dim / 2, D = c.head_dim;
  const auto rope_pairs = c.rope_style == RopeStyle::Neox ? kernels::RopePairs::kHalves : kernels::RopePairs::kAdjacent;
  float* x = s_.x.data();
  float* x_next = s_.x2.data();

  // This thread's weights, prefetched while it waits at barriers;
  // read_weights(n) tells it the next n projections have been read.
  WeightPrefetcher& pf = s_.prefetch[ti];
  pf.restart();
  const BarrierIdle idle{prefetch_while_waiting, &pf};
  size_t ranges_read = 0;
  auto read_weights = [&](size_t n) {
    ranges_read += n;
    pf.read_first(ranges_read);
  };

  // Token embeddings and rotary angles (theta_i = pos * base^(-2i / rope_dim)).
  const auto [t0, t1] = ThreadPool::split(T, ti, nt);
  const size_t embd_row_bytes = row_bytes(weights_.tok_embd.dtype, E);
  // theta_i = pos * theta_scale^i, by repeated multiplication as GGML computes it.
  const float theta_scale = std::pow(c.rope_freq_base, -2.0f / c.rope_dim);
  for (int64_t t = t0; t < t1; ++t) {
    const auto* row = static_cast<const uint8_t*>(weights_.tok_embd.data) +
                      static_cast<size_t>(batch.tokens[t]) * embd_row_bytes;
    kernels::dequantize_row(weights_.tok_embd.dtype, row, x + t * E, E);
    float theta = static_cast<float>(batch.positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      s_.rope_cos[t * half + i] = std::cos(theta);
      s_.rope_sin[t * half + i] = std::sin(theta);
      theta *= theta_scale;
    }
  }
  pool.barrier(idle);

  // The norms' outputs: this thread's own (kOwnNormMaxTokens), or shared.
  const bool own = !s_.own.empty();
  NormOutputs& norm = own ? s_.own[ti] : s_.norm;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& W = weights_.layers[l];
    const LayerLinears& L = linears_[l];
    float* xn = norm.xn.data();
    LinearInput& in_q = norm.q;
    LinearInput& in_k = L.wk.same_input(L.wq) ? norm.q : norm.k;
    LinearInput& in_v = L.wv.same_input(L.wq) ? norm.q : norm.v;
    LinearInput& in_gate = norm.gate;
    LinearInput& in_up = L.up.same_input(L.gate) ? norm.gate : norm.up;

    // (The previous layer's residual,) attention norm, Q/K/V input.
    norm_phase(ti, nt, T, nullptr, x, l > 0 ? s_.h.data() : nullptr, l > 0 ? x_next : nullptr, W.attn_norm.f32(),
               xn, {{&L.wq, &in_q}, {&L.wk, &in_k}, {&L.wv, &in_v}}, own);
    if (l > 0) std::swap(x, x_next);
    if (!own) pool.barrier(idle);

    // Q, K and V split by whole heads, so that each thread goes on to the
    // biases, RoPE and cache writes of the heads it computed without a barrier.
    const QkvHeads mine = qkv_heads(ti, nt);
    L.wq.compute_rows(in_q, T, s_.q.data(), mine.q0 * D, mine.q1 * D);
    L.wk.compute_rows(in_k, T, s_.k.data(), mine.k0 * D, mine.k1 * D);
    L.wv.compute_rows(in_v, T, s_.v.data(), mine.v0 * D, mine.v1 * D);
    read_weights(3);
    for (int64_t t = 0; t < T; ++t) {
      const float* cos_t = &s_.rope_cos[t * half];
      const float* sin_t = &s_.rope_sin[t * half];
      for (int64_t h = mine.q0; h < mine.q1; ++h) {
        float* q = s_.q.data() + t * QD + h * D;
        if (W.bq) add_bias(q, W.bq.f32() + h * D, D);
        kernels::rope_head(q, c.rope_dim, rope_pairs, cos_t, sin_t);
      }
      const int64_t slot = batch.slots[t];
      // The next position's slot is most often the next one: have its cache
      // lines owned by the time that token writes them (a write to a line not
      // in cache waits for memory, and the barrier after this phase drains it).
      auto prefetch_next_slot = [&](const uint16_t* cache, int64_t offset) {
        if (slot + 1 >= pass.cache->n_slots()) return;
        for (int64_t byte = 0; byte < D * 2; byte += 64)
          __builtin_prefetch(reinterpret_cast<const char*>(cache + (slot + 1) * KVD + offset) + byte, 1);
      };
      for (int64_t g = mine.k0; g < mine.k1; ++g) {
        float* k = s_.k.data() + t * KVD + g * D;
        if (W.bk) add_bias(k, W.bk.f32() + g * D, D);
        kernels::rope_head(k, c.rope_dim, rope_pairs, cos_t, sin_t);
        kernels::quantize_row(DType::F16, k, pass.cache->k(l) + slot * KVD + g * D, D);
        prefetch_next_slot(pass.cache->k(l), g * D);
      }
      for (int64_t g = mine.v0; g < mine.v1; ++g) {
        float* v = s_.v.data() + t * KVD + g * D;
        if (W.bv) add_bias(v, W.bv.f32() + g * D, D);
        kernels::quantize_row(DType::F16, v, pass.cache->v(l) + slot * KVD + g * D, D);
        prefetch_next_slot(pass.cache->v(l), g * D);
      }
    }
    pool.barrier(idle);

    // Attention; each head's output is quantized for the output projection
    // right away when its columns are whole quantize blocks.
    const int64_t o_block = quantize_block_of(L.wo, D);
    attention(pass, l, ti, nt, o_block);
    if (o_block == 0) {
      pool.barrier(idle);
      L.wo.quantize(s_.attn.data(), t0, t1, s_.in_o);
    }
    pool.barrier(idle);
    L.wo.compute(s_.in_o, T, s_.h.data(), ti, nt);
    read_weights(1);
    pool.barrier(idle);

    // Residual, FFN norm, gate/up input.
    norm_phase(ti, nt, T, nullptr, x, s_.h.data(), x_next, W.ffn_norm.f32(), xn, {{&L.gate, &in_gate}, {&L.up, &in_up}},
               own);
    std::swap(x, x_next);
    if (!own) pool.barrier(idle);

    // Gate and up, then SwiGLU and the down-projection input. When the input
    // quantizes by blocks and gate and up are packed, each thread goes on to
    // its own rows' outputs (split on whole blocks) without a barrier.
    const int64_t align = own_rows_align(L);  // the down projection's input block, or 1
    const bool own_rows = align > 1;
    L.gate.compute(in_gate, T, s_.gate.data(), ti, nt, align);
    L.up.compute(in_up, T, s_.up.data(), ti, nt, align);
    read_weights(2);
    if (own_rows) {
      const auto [r0, r1] = L.gate.thread_rows(ti, nt, align);
      for (int64_t t = 0; t < T && r0 < r1; ++t) {
        float* g = s_.gate.data() + t * F;
        kernels::swiglu(g + r0, s_.up.data() + t * F + r0, g + r0, r1 - r0);
        L.down.quantize_blocks(s_.gate.data(), t, r0 / align, r1 / align, s_.in_down);
      }
    } else {
      pool.barrier(idle);
      kernels::swiglu(s_.gate.data() + t0 * F, s_.up.data() + t0 * F, s_.gate.data() + t0 * F, (t1 - t0) * F);
      L.down.quantize(s_.gate.data(), t0, t1, s_.in_down);
    }
    pool.barrier(idle);
    L.down.compute(s_.in_down, T, s_.h.data(), ti, nt);
    read_weights(1);
    pool.barrier(idle);
  }

  // The last residual, the final norm and the output projection's input, for
  // the rows whose logits are wanted.
  const int64_t R = static_cast<int64_t>(batch.logit_rows.size());
  norm_phase(ti, nt, R, batch.logit_rows.data(), x, s_.h.data(), nullptr, weights_.output_norm.f32(),
             s_.logits_in.data(), {{&output_, &s_.in_out}});
  pool.barrier(idle);
  assert(ranges_read + 1 == pf.size());  // plan_prefetch lists the projections in this order
  if (R > 0) output_.compute(s_.in_out, R, pass.logits, ti, nt);
}

}  // namespace inferd
