// The CPU executor: the hand-fused forward pass (see model/cpu_executor.h).
#include "model/cpu_executor.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <iterator>
#include <numeric>
#include <tuple>
#include <variant>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_fast.h"
#include "kernels/cpu/hadamard.h"
#include "kernels/cpu/packed_layout.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"
#include "model/pooling.h"
#include "kernels/cpu/short_conv.h"

namespace inferd {

CpuExecutor::CpuExecutor(const Model& model, std::shared_ptr<ThreadPool> pool)
    : pool_(std::move(pool)),
      config_(model.config()), programs_(model.layer_programs()), weights_(model.weights()),
      flavour_(model.ggml_flavour()), numerics_(model.numerics()),
      layer_begin_(model.layer_begin()), layer_end_(model.layer_end()), comm_(model.tensor_comm()),
      shard_(model.tensor_shard_plan()), n_logits_(model.n_logits()),
      experts_(comm_ && shard_.experts.count() > 0 ? shard_.experts.of(shard_.shard.index)
                                                    : ShardRange{0, config_.moe.n_expert}),
      pooled_(config_.returns_pooled()),
      head_here_(!pooled_ && model.head_rows().size() > 0),
      head_in_pass_(head_here_ && !model.head_shared()) {
  // Repack the projections for the packed kernels (a copy of the weights;
  // the embedding table is still read from the file for token lookups).
  // A pooled model never runs its LM head: it is not repacked.
  size_t packed_bytes = head_here_ ? Linear::packed_bytes(weights_.output, numerics_) : 0;
  for (int64_t l = layer_begin_; l < layer_end_; ++l) {
    const LayerWeights& L = weights_.layers[l];
    for (const WeightView& w : L.proj)
      if (w) packed_bytes += Linear::packed_bytes(w, numerics_);
    if (L.moe) {
      packed_bytes += Linear::packed_bytes(L.moe.router, numerics_);
      for (const ExpertsView* experts : {&L.moe.gate, &L.moe.up, &L.moe.down})
        packed_bytes += Linear::packed_bytes(experts->expert(0), numerics_) * static_cast<size_t>(experts->n_expert);
      for (const WeightView* w : {&L.moe.gate_shexp, &L.moe.up_shexp, &L.moe.down_shexp, &L.moe.gate_inp_shexp})
        if (*w) packed_bytes += Linear::packed_bytes(*w, numerics_);
    }
    if (L.delta_net) {
      const DeltaNetWeights& d = L.delta_net;
      for (const WeightView* w : {&d.qkv, &d.z, &d.beta, &d.alpha, &d.out}) packed_bytes += Linear::packed_bytes(*w);
    }
    if (L.mamba2)
      for (const WeightView* w : {&L.mamba2.in, &L.mamba2.out}) packed_bytes += Linear::packed_bytes(*w, numerics_);
    if (L.mla) {
      for (const WeightView* w : {&L.mla.q, &L.mla.q_a, &L.mla.q_b, &L.mla.kv_a})
        if (*w) packed_bytes += Linear::packed_bytes(*w, numerics_);
      for (const ExpertsView* heads : {&L.mla.k_b, &L.mla.v_b})
        packed_bytes += Linear::packed_bytes(heads->expert(0), numerics_) * static_cast<size_t>(heads->n_expert);
    }
  }
  if (packed_bytes > 0) packed_arena_ = std::make_unique<kernels::PackedArena>(packed_bytes);
  kernels::PackedArena* arena = packed_arena_.get();
  // Once a weight's rows are repacked, the file's pages of them are no longer
  // read: give them back as the repack passes them, or the process holds
  // those weights twice (for Q4_K_M 1.5B, 0.6 GB) and, for a large output
  // head, peaks at that while loading. A tied output matrix's pages go back
  // too: token lookups read a few embedding rows a step, and the kernel maps
  // those pages again (from the page cache) as they are read.
  //
  // A read fault on a file mapping maps the whole aligned window of pages
  // around it that the page cache holds (Linux's fault-around, 64 KiB unless
  // an administrator changed it; madvise does not turn it off), so reading the
  // next rows maps again pages just given back, and the first rows of a
  // matrix map the tail of the one before: each release starts at the window
  // of where the last one ended. A page given back that something still reads
  // (a norm beside a matrix) is only mapped again on its next read.
  constexpr uintptr_t kFaultAroundBytes = 64 * 1024;
  const gguf::File& file = model.file();
  const auto window_of = [&file](const uint8_t* p) {
    const auto start = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(p) & ~(kFaultAroundBytes - 1));
    return std::max(file.image(), start);
  };
  const auto make = [&](const WeightView& w) {
    const auto* base = static_cast<const uint8_t*>(w.data);
    const size_t row = row_bytes(w.dtype, w.cols);
    const uint8_t* from = window_of(base);  // the next release starts here
    return Linear::make(w, arena, flavour_, numerics_, [&](int64_t rows_done) {
      const uint8_t* to = base + row * static_cast<size_t>(rows_done);
      file.release_pages(from, static_cast<uint64_t>(to - from));  // whole pages within only
      from = window_of(to);
    });
  };
  // Other stages' layers keep empty entries: linears_ is indexed by layer.
  linears_.resize(weights_.layers.size());
  for (int64_t l = layer_begin_; l < layer_end_; ++l) {
    const LayerWeights& L = weights_.layers[l];
    LayerLinears& linears = linears_[l];
    for (int p = 0; p < kNumProjections; ++p)
      if (L.proj[p]) linears.proj[p] = make(L.proj[p]);
    if (L.moe) {
      linears.router = make(L.moe.router);
      for (int64_t e = 0; e < L.moe.gate.n_expert; ++e) {
        linears.gate_exps.push_back(make(L.moe.gate.expert(e)));
        linears.up_exps.push_back(make(L.moe.up.expert(e)));
        linears.down_exps.push_back(make(L.moe.down.expert(e)));
      }
      if (L.moe.gate_shexp) {
        linears.gate_shexp = make(L.moe.gate_shexp);
        linears.up_shexp = make(L.moe.up_shexp);
        linears.down_shexp = make(L.moe.down_shexp);
      }
      if (L.moe.gate_inp_shexp) linears.gate_inp_shexp = make(L.moe.gate_inp_shexp);
    }
    if (const DeltaNetWeights& d = L.delta_net; d) {
      linears.dn_qkv = make(d.qkv);
      linears.dn_z = make(d.z);
      linears.dn_beta = make(d.beta);
      linears.dn_alpha = make(d.alpha);
      linears.dn_out = make(d.out);
      linears.dn_conv.resize(static_cast<size_t>(d.conv.cols * d.conv.rows));
      kernels::short_conv_weight_tap_major(d.conv.f32(), d.conv.cols, d.conv.rows, linears.dn_conv.data());
    }
    if (const Mamba2Weights& m = L.mamba2; m) {
      linears.m_in = make(m.in);
      linears.m_out = make(m.out);
      linears.m_conv.resize(static_cast<size_t>(m.conv.cols * m.conv.rows));
      kernels::short_conv_weight_tap_major(m.conv.f32(), m.conv.cols, m.conv.rows, linears.m_conv.data());
    }
    if (L.mla) {
      linears.mla_q = make(L.mla.q ? L.mla.q : L.mla.q_a);
      if (L.mla.q_b) linears.mla_q_b = make(L.mla.q_b);
      linears.mla_kv_a = make(L.mla.kv_a);
      for (int64_t h = 0; h < L.mla.k_b.n_expert; ++h) {
        linears.mla_k_b.push_back(make(L.mla.k_b.expert(h)));
        linears.mla_v_b.push_back(make(L.mla.v_b.expert(h)));
      }
    }
  }
  if (head_here_) output_ = make(weights_.output);
}

namespace {

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

int64_t CpuExecutor::own_rows_align(const Linear& down, int64_t width, int n_threads) const {
  // A tensor-parallel rank quantizes the down projection's input only once
  // every rank's part of it is gathered.
  if (comm_) return 1;
  const int64_t down_block = quantize_block_of(down, width);
  // Gate and up split on the down projection's input blocks (Linear::compute
  // takes multiples of the 16-row group). Large blocks (Q8_K's 256) can leave
  // one thread a larger share: past 5% more than an even one, the barrier and
  // a token split of the activation cost less than the threads' wait.
  if (down_block <= 1 || down_block % kernels::kPackRows != 0) return 1;
  const int64_t units = width / down_block, largest = (units + n_threads - 1) / n_threads;
  return largest * n_threads * 20 <= units * 21 ? down_block : 1;
}

// Q, K and V heads taken as one list (query heads, then key heads, then value
// heads) split evenly over the threads in units that keep every share on whole
// 16-row groups of the packed weights (one head when head_dim % 16 == 0).
CpuExecutor::QkvHeads CpuExecutor::qkv_heads(int ti, int nt) const {
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
// them: the layers' programs, phase by phase (a mixture-of-experts phase's
// router only), then the output projection. Fixed for a thread count.
void CpuExecutor::plan_prefetch(int n_threads) {
  s_.prefetch.resize(n_threads);
  for (int ti = 0; ti < n_threads; ++ti) {
    WeightPrefetcher& pf = s_.prefetch[ti];
    pf.clear();
    const QkvHeads mine = qkv_heads(ti, n_threads);
    const int64_t D = config_.head_dim;
    auto add = [&pf](std::pair<const void*, size_t> range) { pf.add(range.first, range.second); };
    for (int64_t l = layer_begin_; l < layer_end_; ++l) {
      const LayerLinears& L = linears_[l];
      for (const Phase& phase : programs_[l].phases) {
        if (const auto* qkv = std::get_if<QkvPhase>(&phase)) {
          const int64_t QR = qkv->output_gate ? 2 * D : D;  // query rows per head
          add(L[Projection::kQ].rows_bytes(mine.q0 * QR, mine.q1 * QR));
          add(L[Projection::kK].rows_bytes(mine.k0 * D, mine.k1 * D));
          add(L[Projection::kV].rows_bytes(mine.v0 * D, mine.v1 * D));
        } else if (const auto* mla = std::get_if<MlaQkvPhase>(&phase)) {
          // The per-head attn_k_b and attn_v_b are small: not prefetched.
          add(L.mla_q.thread_bytes(ti, n_threads));
          add(L.mla_kv_a.thread_bytes(ti, n_threads));
          if (mla->q_lora) add(L.mla_q_b.thread_bytes(ti, n_threads));
        } else if (std::holds_alternative<DeltaNetPhase>(phase)) {
          add(L.dn_qkv.thread_bytes(ti, n_threads));
          add(L.dn_z.thread_bytes(ti, n_threads));
          add(L.dn_beta.thread_bytes(ti, n_threads));
          add(L.dn_alpha.thread_bytes(ti, n_threads));
          add(L.dn_out.thread_bytes(ti, n_threads));
        } else if (std::holds_alternative<Mamba2Phase>(phase)) {
          add(L.m_in.thread_bytes(ti, n_threads));
          add(L.m_out.thread_bytes(ti, n_threads));
        } else if (std::holds_alternative<OutputPhase>(phase)) {
          add(L[Projection::kO].thread_bytes(ti, n_threads));
        } else if (const auto* dense = std::get_if<DenseFfnPhase>(&phase); dense && !dense->gated) {
          add(L[Projection::kUp].thread_bytes(ti, n_threads));
          add(L[Projection::kDown].thread_bytes(ti, n_threads));
        } else if (std::holds_alternative<DenseFfnPhase>(phase)) {
          const int64_t align = own_rows_align(L[Projection::kDown], config_.n_ff, n_threads);
          add(L[Projection::kGate].thread_bytes(ti, n_threads, align));
          add(L[Projection::kUp].thread_bytes(ti, n_threads, align));
          add(L[Projection::kDown].thread_bytes(ti, n_threads));
        } else if (const auto* moe = std::get_if<MoeFfnPhase>(&phase)) {
          if (moe->shared_expert) {  // run first, as a dense MLP
            const int64_t align = own_rows_align(L.down_shexp, config_.moe.shared_width(), n_threads);
            add(L.gate_shexp.thread_bytes(ti, n_threads, align));
            add(L.up_shexp.thread_bytes(ti, n_threads, align));
            add(L.down_shexp.thread_bytes(ti, n_threads));
          }
          // Which experts a step reads is known only once it has routed.
          add(L.router.thread_bytes(ti, n_threads));
        }
      }
    }
    if (head_in_pass_) add(output_.thread_bytes(ti, n_threads));
  }
}

// Q, K and V split by whole heads, so that each thread goes on to the biases,
// per-head norms, RoPE and cache writes of the heads it computed without a
// barrier.
void CpuExecutor::qkv(const Pass& pass, int64_t l, const QkvPhase& phase, const LinearInput& in_q,
                      const LinearInput& in_k, const LinearInput& in_v, int ti, int nt) {
  const ModelConfig& c = config_;
  const ForwardBatch& batch = *pass.batch;
  const LayerWeights& W = weights_.layers[l];
  const LayerLinears& L = linears_[l];
  const int64_t T = batch.size(), QD = c.q_dim(), KVD = c.kv_dim(), D = c.head_dim, half = c.rope_dim / 2;
  const auto rope_pairs =
      phase.rope_style == RopeStyle::kNeox ? kernels::RopePairs::kHalves : kernels::RopePairs::kAdjacent;
  const QkvHeads mine = qkv_heads(ti, nt);
  if (phase.output_gate) {
    // Each head's query then its gate: the queries go where the rest of the
    // phase reads them, the gates' sigmoids where attention() multiplies.
    L[Projection::kQ].compute_rows(in_q, pass.tokens, s_.q_gated.data(), mine.q0 * 2 * D, mine.q1 * 2 * D);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = mine.q0; h < mine.q1; ++h) {
        const float* qg = s_.q_gated.data() + t * 2 * QD + h * 2 * D;
        std::copy(qg, qg + D, s_.q.data() + t * QD + h * D);
        kernels::sigmoid(qg + D, s_.attn_gate.data() + t * QD + h * D, D);
      }
    }
  } else {
    L[Projection::kQ].compute_rows(in_q, pass.tokens, s_.q.data(), mine.q0 * D, mine.q1 * D);
  }
  L[Projection::kK].compute_rows(in_k, pass.tokens, s_.k.data(), mine.k0 * D, mine.k1 * D);
  L[Projection::kV].compute_rows(in_v, pass.tokens, s_.v.data(), mine.v0 * D, mine.v1 * D);
  const float* q_norm = phase.qk_norm ? W.q_norm.f32() : nullptr;
  const float* k_norm = phase.qk_norm ? W.k_norm.f32() : nullptr;
  // A quantized cache keeps keys and values rotated (kv::KVCacheSpec::
  // key_rotation); queries turn with the keys, so their products do not.
  const kv::KVCacheSpec& kv_spec = pass.cache->layer_spec(l);
  const int64_t k_rot = kv_spec.key_rotation(), v_rot = kv_spec.value_rotation();
  for (int64_t t = 0; t < T; ++t) {
    // No RoPE (nemotron_h's attention): positions reach it through the recurrent layers.
    const bool rope = phase.rope != QkvPhase::kNoRope;
    const float* cos_t = rope ? &s_.rope_cos[phase.rope][t * half] : nullptr;
    const float* sin_t = rope ? &s_.rope_sin[phase.rope][t * half] : nullptr;
    for (int64_t h = mine.q0; h < mine.q1; ++h) {
      float* q = s_.q.data() + t * QD + h * D;
      if (W.bq) add_bias(q, W.bq.f32() + h * D, D);
      if (q_norm) kernels::rms_norm_row(q, nullptr, q_norm, D, c.rms_eps, 0, D, nullptr, q);
      if (rope) kernels::rope_head(q, c.rope_dim, rope_pairs, cos_t, sin_t);
      if (phase.query_scale != 1.0f)
        for (int64_t i = 0; i < D; ++i) q[i] *= phase.query_scale;
      if (k_rot > 0) kernels::hadamard_rotate(q, D, k_rot);
    }
    const int64_t slot = batch.slots[pass.cache->group(l)][t];
    // Keys and values are written as the layer's spec says (its dtype, its
    // strides).
    const DType kv_dtype = kv_spec.dtype;
    const size_t head_bytes = kv_spec.head_bytes();
    // The next position's slot is most often the next one: have its cache
    // lines owned by the time that token writes them (a write to a line not
    // in cache waits for memory, and the barrier after this phase drains it).
    auto prefetch_next_slot = [&](const std::byte* cache, int64_t head) {
      if (slot + 1 >= pass.cache->n_slots()) return;
      const size_t next = pass.cache->head_offset(l, slot + 1, head);
      for (size_t byte = 0; byte < head_bytes; byte += 64) __builtin_prefetch(cache + next + byte, 1);
    };
    for (int64_t g = mine.k0; g < mine.k1; ++g) {
      float* k = s_.k.data() + t * KVD + g * D;
      if (W.bk) add_bias(k, W.bk.f32() + g * D, D);
      if (k_norm) kernels::rms_norm_row(k, nullptr, k_norm, D, c.rms_eps, 0, D, nullptr, k);
      if (rope) kernels::rope_head(k, c.rope_dim, rope_pairs, cos_t, sin_t);
      if (k_rot > 0) kernels::hadamard_rotate(k, D, k_rot);
      kernels::quantize_row(kv_dtype, k, pass.cache->k(l) + pass.cache->head_offset(l, slot, g), D);
      prefetch_next_slot(pass.cache->k(l), g);
    }
    for (int64_t g = mine.v0; g < mine.v1; ++g) {
      float* v = s_.v.data() + t * KVD + g * D;
      if (W.bv) add_bias(v, W.bv.f32() + g * D, D);
      if (v_rot > 0) kernels::hadamard_rotate(v, D, v_rot);
      kernels::quantize_row(kv_dtype, v, pass.cache->v(l) + pass.cache->head_offset(l, slot, g), D);
      prefetch_next_slot(pass.cache->v(l), g);
    }
  }
}

void CpuExecutor::attention(const Pass& pass, int64_t layer, const AttentionPhase& phase, int ti, int nt,
                            int64_t o_block) {
  const ModelConfig& c = config_;
  const ForwardBatch& batch = *pass.batch;
  const int64_t D = c.head_dim, H = c.n_head, group = c.n_head / c.n_head_kv;
  const int64_t window = phase.window;
  // The cache's dtype is one the kernels read (checked when the cache was made: Executor::supports_kv_cache).
  const kv::KVCacheSpec& kv_spec = pass.cache->layer_spec(layer);
  const std::byte* kc = pass.cache->k(layer);
  const std::byte* vc = pass.cache->v(layer);
  // A block's slots lie head by head (kv::KVCacheSpec): consecutive slots of
  // a head are a head apart, and head g's run starts g * block_size heads in.
  const int64_t slot_stride = kv_spec.head_size;
  const auto block_stride = static_cast<int64_t>(pass.cache->block_stride());
  const int32_t kv_group = pass.cache->group(layer);
  const Linear& wo = linears_[layer][Projection::kO];
  const float* sinks = phase.sinks ? weights_.layers[layer].attn_sinks.f32() : nullptr;
  const int64_t n_kv = H / group;
  const int64_t v_rot = kv_spec.value_rotation();
  auto range_of = [&](int64_t t) {  // positions token t attends to
    const int64_t pos = batch.positions[t];
    return std::pair<int64_t, int64_t>{window > 0 && pos + 1 > window ? pos + 1 - window : 0, pos + 1};
  };
  auto view_of = [&](const SequenceSlice& sl) {
    return kernels::PagedKV{kc, vc, slot_stride, kv_spec.block_size, sl.block_tables[kv_group].data(), kv_spec.dtype,
                            block_stride};
  };
  // After attention: heads [h, h + n_heads) of token t turned back from the
  // values' rotation, gated, and quantized for the output projection.
  auto finish = [&](int64_t t, int64_t h, int64_t n_heads) {
    float* out = s_.attn.data() + t * c.q_dim() + h * D;
    // Values were stored rotated: the weighted sum turns back (H is its own inverse).
    if (v_rot > 0) kernels::hadamard_rotate(out, n_heads * D, v_rot);
    if (phase.output_gate) {  // times the gates' sigmoids (qkv), as GGML's mul
      const float* gate = s_.attn_gate.data() + t * c.q_dim() + h * D;
      for (int64_t i = 0; i < n_heads * D; ++i) out[i] *= gate[i];
    }
    if (o_block > 0) wo.quantize_blocks(s_.attn.data(), t, h * D / o_block, (h + n_heads) * D / o_block, pass.tokens, s_.in_o);
  };
  // A prompt pass's tokens (SequenceSlice::prompt_pass: a chunk of several
  // tokens, or a prompt's piece of one) go in tiles of kAttentionTileTokens consecutive tokens: one work
  // item per (tile, key/value head), ordered sequence, key/value head, tile,
  // so that a thread's consecutive tiles read the same keys and values. Each
  // token's result has the bits of its own attend_heads call
  // (kernels::attend_heads_tile). The items are split over the threads by
  // cost (the positions their tokens read, plus a token's fixed share), not
  // count: a causal prefill's last tokens read the most.
  // The fast tier reads f16 caches through its own kernels (attention_fast.h:
  // matrix products, larger tiles; decode split over the context, below).
  const bool fast = numerics_ == kernels::Numerics::kFast && kernels::fast_attention_reads(kv_spec.dtype, D);
  constexpr int64_t kMaxTile = std::max(kernels::kAttentionTileTokens, kernels::kFastAttentionTileTokens);
  const int64_t kTile = fast ? kernels::kFastAttentionTileTokens : kernels::kAttentionTileTokens;
  constexpr int64_t kTokenCost = 64;
  int64_t total = 0, n_other = 0;  // the tiles' cost (one key/value head's), the other tokens
  for (const SequenceSlice& sl : batch.sequences) {
    if (!sl.prompt_pass()) {
      n_other += sl.n_tokens;
      continue;
    }
    for (int64_t t = sl.first_token; t < sl.first_token + sl.n_tokens; ++t) {
      const auto [first, end] = range_of(t);
      total += end - first + kTokenCost;
    }
  }
  if (total > 0) {
    const int64_t share_begin = total * n_kv * ti / nt, share_end = total * n_kv * (ti + 1) / nt;
    int64_t at = 0;  // cost of the items before this one
    for (const SequenceSlice& sl : batch.sequences) {
      if (!sl.prompt_pass()) continue;
      const kernels::PagedKV kv = view_of(sl);
      for (int64_t g = 0; g < n_kv; ++g) {
        for (int64_t t0 = sl.first_token; t0 < sl.first_token + sl.n_tokens; t0 += kTile) {
          const int64_t n = std::min<int64_t>(kTile, sl.first_token + sl.n_tokens - t0);
          int64_t pos_begin[kMaxTile], pos_end[kMaxTile], cost = 0;
          for (int64_t i = 0; i < n; ++i) {
            std::tie(pos_begin[i], pos_end[i]) = range_of(t0 + i);
            cost += pos_end[i] - pos_begin[i] + kTokenCost;
          }
          const bool mine = at >= share_begin && at < share_end;
          at += cost;
          if (!mine) continue;
          const int64_t h = g * group;
          const kernels::AttentionTile tile{s_.q.data() + t0 * c.q_dim() + h * D, c.q_dim(),
                                            s_.attn.data() + t0 * c.q_dim() + h * D, c.q_dim(), n, pos_begin, pos_end};
          const int64_t head_offset = g * kv_spec.block_size * kv_spec.head_size;
          if (fast)
            kernels::attend_heads_tile_fast(tile, group, kv, head_offset, D, phase.kq_scale, sinks ? sinks + h : nullptr);
          else
            kernels::attend_heads_tile(tile, group, kv, head_offset, D, phase.kq_scale, flavour_,
                                       sinks ? sinks + h : nullptr);
          for (int64_t i = 0; i < n; ++i) finish(t0 + i, h, group);
        }
      }
    }
  }
  if (n_other == 0) return;
  if (fast) {
    // The fast tier's decode split over the context (attention_fast.h,
    // flash-decoding): one work item per (token, key/value head, part of
    // kFastDecodeSplit positions), dealt out by cost like the prompt tiles, so
    // that both cores share one long request. A thread runs its items of one
    // (token, key/value head) in one call; the thread that completes a
    // token's head group joins its parts (their order is fixed, not who joins).
    constexpr int64_t kPartCost = 16;  // a part's fixed share: its state out and its join
    int64_t decode_total = 0;
    for (const SequenceSlice& sl : batch.sequences) {
      if (sl.prompt_pass()) continue;
      for (int64_t t = sl.first_token; t < sl.first_token + sl.n_tokens; ++t) {
        const auto [first, end] = range_of(t);
        decode_total += n_kv * (end - first + kPartCost * kernels::fast_decode_parts(first, end));
      }
    }
    const int64_t share_begin = decode_total * ti / nt, share_end = decode_total * (ti + 1) / nt;
    int64_t at = 0, row = 0, o = 0;  // cost and state rows before this item, other tokens before this one
    for (const SequenceSlice& sl : batch.sequences) {
      if (sl.prompt_pass()) continue;
      const kernels::PagedKV kv = view_of(sl);
      for (int64_t t = sl.first_token; t < sl.first_token + sl.n_tokens; ++t, ++o) {
        const auto [first, end] = range_of(t);
        const int64_t n_parts = kernels::fast_decode_parts(first, end), k_first = first / kernels::kFastDecodeSplit;
        for (int64_t g = 0; g < n_kv; ++g, row += n_parts * group) {
          if (at >= share_end) return;
          int64_t run_begin = -1, run_end = -1;  // this thread's parts of (t, g)
          for (int64_t k = 0; k < n_parts; ++k) {
            const int64_t part_begin = std::max(first, (k_first + k) * kernels::kFastDecodeSplit);
            const int64_t part_end = std::min(end, (k_first + k + 1) * kernels::kFastDecodeSplit);
            if (at >= share_begin && at < share_end) {
              if (run_begin < 0) run_begin = k;
              run_end = k + 1;
            }
            at += part_end - part_begin + kPartCost;
          }
          if (run_begin < 0) continue;
          const int64_t h = g * group, r0 = row + run_begin * group;
          const kernels::FastAttentionState parts{s_.part_m.data() + row, s_.part_lanes.data() + 8 * row,
                                                  s_.part_o.data() + row * D};
          kernels::attend_heads_fast_parts(
              s_.q.data() + t * c.q_dim() + h * D, group, kv, h / group * kv_spec.block_size * kv_spec.head_size, D,
              std::max(first, (k_first + run_begin) * kernels::kFastDecodeSplit),
              std::min(end, (k_first + run_end) * kernels::kFastDecodeSplit), phase.kq_scale,
              kernels::FastAttentionState{s_.part_m.data() + r0, s_.part_lanes.data() + 8 * r0,
                                          s_.part_o.data() + r0 * D});
          std::atomic<int32_t>& done = s_.parts_done[o * n_kv + g];
          const int64_t run = run_end - run_begin;
          if (run < n_parts && done.fetch_add(static_cast<int32_t>(run), std::memory_order_acq_rel) + run < n_parts)
            continue;  // another thread's parts are still to come: it joins
          done.store(0, std::memory_order_relaxed);
          kernels::join_fast_attention_states(parts, n_parts, group, D, sinks ? sinks + h : nullptr,
                                              s_.attn.data() + t * c.q_dim() + h * D);
          finish(t, h, group);
        }
      }
    }
    return;
  }
  // The other tokens (decode steps, and slices computed each as a one-token
  // decode), in a decode's order: one work item per (token, head); items are
  // dealt out in contiguous runs, and the heads of a run that share a
  // key/value head are computed together.
  const auto [begin, end] = ThreadPool::split(n_other * H, ti, nt);
  size_t seq = 0;
  int64_t seq_other = 0;  // the other tokens before sequence seq
  auto next_other = [&] {  // to the next sequence whose tokens are not tiled
    while (batch.sequences[seq].prompt_pass()) ++seq;
  };
  next_other();
  for (int64_t item = begin, n_heads = 0; item < end; item += n_heads) {
    const int64_t o = item / H, h = item % H;
    n_heads = std::min(end - item, group - h % group);
    while (o >= seq_other + batch.sequences[seq].n_tokens) {
      seq_other += batch.sequences[seq].n_tokens;
      ++seq;
      next_other();
    }
    const SequenceSlice& sl = batch.sequences[seq];
    const int64_t t = sl.first_token + (o - seq_other);
    const auto [first, pos_end] = range_of(t);
    const int64_t kv_head_run = (h / group) * kv_spec.block_size * kv_spec.head_size;
    kernels::attend_heads(s_.q.data() + t * c.q_dim() + h * D, n_heads, view_of(sl), kv_head_run, D, first, pos_end,
                          phase.kq_scale, kernels::AttentionPass::kDecode, s_.attn.data() + t * c.q_dim() + h * D, flavour_,
                          sinks ? sinks + h : nullptr);
    finish(t, h, n_heads);
  }
}

void CpuExecutor::prepare_scratch(const ForwardBatch& batch, int n_threads) {
  const ModelConfig& c = config_;
  const int64_t T = batch.size(), R = pooled_ ? T : static_cast<int64_t>(batch.logit_rows.size());
  s_.x.resize(T * c.n_embd);
  s_.x2.resize(T * c.n_embd);
  s_.h.resize(T * c.n_embd);
  s_.q.resize(T * c.q_dim());
  if (c.attn_output_gate) {
    s_.q_gated.resize(T * c.q_proj_dim());
    s_.attn_gate.resize(T * c.q_dim());
  }
  s_.k.resize(T * c.kv_dim());
  s_.v.resize(T * c.kv_dim());
  s_.attn.resize(T * c.attn_out_dim());
  if (numerics_ == kernels::Numerics::kFast) {  // the decode parts' states (attention), for ranges from 0 (no window)
    int64_t part_rows = 0, n_decode = 0;
    for (const SequenceSlice& sl : batch.sequences) {
      if (sl.prompt_pass()) continue;
      for (int64_t t = sl.first_token; t < sl.first_token + sl.n_tokens; ++t, ++n_decode)
        part_rows += c.n_head * kernels::fast_decode_parts(0, batch.positions[t] + 1);
    }
    s_.part_m.resize(part_rows);
    s_.part_lanes.resize(8 * part_rows);
    s_.part_o.resize(part_rows * c.head_dim);
    const auto counters = static_cast<size_t>(n_decode * std::max<int64_t>(c.n_head_kv, 1));
    if (s_.parts_done.size() < counters) s_.parts_done = std::vector<std::atomic<int32_t>>(counters);
  }
  if (comm_) {  // the whole model's widths (config_ is this rank's shard)
    s_.attn_gathered.resize(T * shard_.attn.whole());
    s_.hidden_gathered.resize(T * std::max(shard_.ffn.whole(), shard_.shared.whole()));
    s_.shard_rows.resize(T * shard_.embd.of(shard_.shard.index).size());
  }
  const int64_t mlp_width = std::max(c.n_ff, c.moe.shared_width());  // the dense FFN's, or a shared expert's
  s_.gate.resize(T * mlp_width);
  s_.up.resize(T * mlp_width);
  s_.logits_in.resize(R * c.n_embd);
  s_.rope_cos.resize(c.ropes.size());
  s_.rope_sin.resize(c.ropes.size());
  for (size_t r = 0; r < c.ropes.size(); ++r) {
    s_.rope_cos[r].resize(T * (c.rope_dim / 2));
    s_.rope_sin[r].resize(T * (c.rope_dim / 2));
  }
  for (int64_t l = layer_begin_; l < layer_end_; ++l) {
    const LayerLinears& L = linears_[l];
    if (L[Projection::kO].rows() > 0) L[Projection::kO].prepare(s_.in_o, T);
    if (L.shared_expert()) L.down_shexp.prepare(s_.in_down_shexp, T);
    if (!L.down_exps.empty() || L[Projection::kDown].rows() == 0) continue;
    L[Projection::kDown].prepare(s_.in_down, T);
  }
  if (head_in_pass_) output_.prepare(s_.in_out, R);
  if (c.moe.n_expert > 0) prepare_moe_scratch(T, n_threads);
  if (c.mla) prepare_mla_scratch(T);
  if (c.delta_net) prepare_delta_net_scratch(T);
  if (c.mamba2) prepare_mamba2_scratch(T);
  prepare_norm_outputs(s_.norm, T);
  s_.own.resize(T <= kOwnNormMaxTokens && n_threads > 1 ? n_threads : 0);
  for (NormOutputs& own : s_.own) prepare_norm_outputs(own, T);
}

void CpuExecutor::prepare_norm_outputs(NormOutputs& out, int64_t T) const {
  out.xn.resize(T * config_.n_embd);
  for (int64_t l = layer_begin_; l < layer_end_; ++l) {
    const LayerLinears& L = linears_[l];
    if (L.delta_net()) {
      L.dn_qkv.prepare(out.dn_qkv, T);
      if (!L.dn_z.same_input(L.dn_qkv)) L.dn_z.prepare(out.dn_z, T);
      if (!L.dn_beta.same_input(L.dn_qkv)) L.dn_beta.prepare(out.dn_beta, T);
      if (!L.dn_alpha.same_input(L.dn_qkv)) L.dn_alpha.prepare(out.dn_alpha, T);
    } else if (L.mamba2()) {
      L.m_in.prepare(out.m_in, T);
    } else if (L.latent_attention()) {
      L.mla_q.prepare(out.q, T);
      if (!L.mla_kv_a.same_input(L.mla_q)) L.mla_kv_a.prepare(out.k, T);
    } else if (L[Projection::kQ].rows() > 0) {
      const Linear& wq = L[Projection::kQ];
      wq.prepare(out.q, T);
      if (!L[Projection::kK].same_input(wq)) L[Projection::kK].prepare(out.k, T);
      if (!L[Projection::kV].same_input(wq)) L[Projection::kV].prepare(out.v, T);
    }
    const bool moe = !L.gate_exps.empty();
    const Linear& gate = moe ? L.gate_exps[0] : L[Projection::kGate];
    const Linear& up = moe ? L.up_exps[0] : L[Projection::kUp];
    if (gate.rows() > 0) gate.prepare(out.gate, T);
    if (up.rows() > 0 && (gate.rows() == 0 || !up.same_input(gate))) up.prepare(out.up, T);
    if (moe) L.router.prepare(out.router, T);
    if (L.shared_expert()) {
      L.gate_shexp.prepare(out.shexp_gate, T);
      if (!L.up_shexp.same_input(L.gate_shexp)) L.up_shexp.prepare(out.shexp_up, T);
    }
  }
}

void CpuExecutor::forward_stage(const ForwardBatch& batch, KVCache& cache, const float* hidden_in,
                                std::vector<float>& logits) {
  ThreadPool& pool = *pool_;
  prepare_scratch(batch, pool.size());
  const auto n_rows = static_cast<int64_t>(batch.logit_rows.size());
  // A tensor-parallel last stage (or whole model) computes its vocabulary
  // rows, then gathers them; a stage before the last hands on the whole
  // stream, which every rank has (the gathered residual).
  const bool gather_logits = comm_ && last_stage();
  if (gather_logits) {
    s_.shard_logits.resize(static_cast<size_t>(n_rows * output_.rows()));
    logits.resize(comm_->root() ? static_cast<size_t>(n_rows * n_logits_) : 0);
  } else if (last_stage())
    logits.resize(static_cast<size_t>(n_rows * (head_in_pass_ ? output_.rows() : config_.n_embd)));
  else
    logits.resize(static_cast<size_t>(batch.size() * config_.n_embd));
  if (s_.prefetch.size() != static_cast<size_t>(pool.size())) plan_prefetch(pool.size());
  // Each token's place in its sequence's share of the step, and the output
  // rows, each alone: llama.cpp runs a sequence's chunk as one batch and its
  // last layer's FFN on the output rows only (Linear, StepTokens). Tokens
  // verified as decodes are each alone too.
  s_.places.resize(batch.size());
  for (const SequenceSlice& sl : batch.sequences)
    for (int32_t i = 0; i < sl.n_tokens; ++i)
      s_.places[sl.first_token + i] = sl.decode_each ? kernels::TokenPlace{1, 0} : kernels::TokenPlace{sl.n_tokens, i};
  s_.output_places.assign(batch.logit_rows.size(), kernels::TokenPlace{1, 0});
  StepTokens outputs{static_cast<int64_t>(batch.logit_rows.size()), s_.output_places.data()};
  const int32_t* output_tokens = batch.logit_rows.data();
  if (pooled_) {
    // Every token is an output, its last FFN run with its chunk as llama.cpp
    // runs an embedding batch (all outputs, no row selection).
    outputs = {batch.size(), s_.places.data()};
    output_tokens = nullptr;
    s_.token_seq.resize(batch.size());
    for (size_t i = 0; i < batch.sequences.size(); ++i)
      std::fill_n(s_.token_seq.begin() + batch.sequences[i].first_token, batch.sequences[i].n_tokens,
                  static_cast<int32_t>(i));
  }
  const Pass pass{&batch, &cache, gather_logits ? s_.shard_logits.data() : logits.data(), hidden_in, &pool,
                  {batch.size(), s_.places.data()}, outputs, output_tokens};
  const Pass* p = &pass;  // one pointer captured: std::function keeps it inline, no allocation
  pool.run([this, p](int ti, int nt) { forward_thread(*p, ti, nt); });
  if (gather_logits) comm_->gather_columns(s_.shard_logits.data(), n_rows, logits.data(), shard_.vocab);
}

void CpuExecutor::head_logits(const float* normed, int64_t n_rows, std::vector<float>& logits) {
  assert(head_here_ && !head_in_pass_);
  ThreadPool& pool = *pool_;
  logits.resize(static_cast<size_t>(n_rows * output_.rows()));
  if (n_rows == 0) return;
  output_.prepare(s_.in_out, n_rows);
  // Each row alone, as the pass's output rows are (forward_stage).
  s_.output_places.assign(static_cast<size_t>(n_rows), kernels::TokenPlace{1, 0});
  const StepTokens rows{n_rows, s_.output_places.data()};
  float* out = logits.data();
  pool.run([&](int ti, int nt) {
    // The quantized rows are the pass's (the same rows, the same
    // quantization): the head's products are the whole model's.
    const auto [r0, r1] = ThreadPool::split(n_rows, ti, nt);
    output_.quantize(normed, r0, r1, rows, s_.in_out);
    pool.barrier();
    output_.compute(s_.in_out, rows, out, ti, nt);
  });
}

void CpuExecutor::gather_over_ranks(const float* part, int64_t rows, float* whole, const ShardSplit& split, int ti,
                                    ThreadPool& pool, const BarrierIdle& idle) {
  if (ti == 0) comm_->all_gather_columns(part, rows, whole, split);
  pool.barrier(idle);
}

// RMSNorm rows, each row r reading token row_token[r] (or r): x + h (when h is
// given; h RMS-normalized with h_weight first when that is given) into x_out
// (when given), the normalized row into xn[r], then the inputs of `targets`
// quantized from xn (a target whose input an earlier one already fills,
// Linear::same_input, is skipped). When every target quantizes by 32-column
// blocks, threads split (row, block) items, so one token keeps both busy;
// x_out must then not alias x (another thread may still be reading it).
void CpuExecutor::norm_phase(int ti, int nt, const StepTokens& rows, const int32_t* row_token, const float* x,
                       const float* h, const float* h_weight, float* x_out, const float* weight, float* xn,
                       std::initializer_list<NormTarget> all_targets, bool whole_rows, bool h_by_row) {
  const int64_t n_rows = rows.n;
  const int64_t E = config_.n_embd;
  const float eps = config_.rms_eps;
  NormTarget targets[6] = {};
  int n_targets = 0;
  assert(all_targets.size() <= std::size(targets));
  for (const NormTarget& tg : all_targets) {
    bool filled = false;
    for (int i = 0; i < n_targets; ++i) filled = filled || targets[i].in == tg.in;
    if (!filled) targets[n_targets++] = tg;
  }
  // The block every target quantizes by, or 0 when they differ or one
  // quantizes whole rows only.
  int64_t block = n_targets > 0 ? quantize_block_of(*targets[0].linear, E) : 0;  // none: the rows alone
  for (int i = 1; i < n_targets; ++i)
    if (quantize_block_of(*targets[i].linear, E) != block) block = 0;
  auto token = [row_token](int64_t r) { return row_token ? int64_t{row_token[r]} : r; };
  auto places_of = [&rows](const NormTarget& tg) -> const StepTokens& { return tg.places ? *tg.places : rows; };
  // Token t's h as it is added: a sandwich norm's output is needed whole (its
  // scale reads every column) by each thread that touches the row, so each
  // makes its own copy rather than waiting at a barrier for a shared one.
  thread_local std::vector<float> h_normed;
  auto h_row = [&](int64_t r) -> const float* {
    if (!h) return nullptr;
    const float* hr = h + (h_by_row ? r : token(r)) * E;
    if (!h_weight) return hr;
    h_normed.resize(E);
    kernels::rms_norm_row(hr, nullptr, h_weight, E, eps, 0, E, nullptr, h_normed.data());
    return h_normed.data();
  };
  if (whole_rows) {
    const auto [c0, c1] = ThreadPool::split(E, ti, nt);
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t t = token(r);
      const float* hr = h_row(r);
      kernels::rms_norm_row(x + t * E, hr, weight, E, eps, 0, E, nullptr, xn + r * E);
      if (!x_out) continue;
      for (int64_t i = c0; i < c1; ++i) x_out[t * E + i] = hr ? x[t * E + i] + hr[i] : x[t * E + i];
    }
    for (int i = 0; i < n_targets; ++i) targets[i].linear->quantize(xn, 0, n_rows, places_of(targets[i]), *targets[i].in);
    return;
  }
  if (block == 0) {
    const auto [r0, r1] = ThreadPool::split(n_rows, ti, nt);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = token(r);
      kernels::rms_norm_row(x + t * E, h_row(r), weight, E, eps, 0, E, x_out ? x_out + t * E : nullptr, xn + r * E);
    }
    for (int i = 0; i < n_targets; ++i) targets[i].linear->quantize(xn, r0, r1, places_of(targets[i]), *targets[i].in);
    return;
  }
  // Items are (row, block) pairs, row-major; this thread's run [i0, i1) covers
  // blocks [b0, b1) of each row it touches.
  const int64_t nb = E / block;
  const auto [i0, i1] = ThreadPool::split(n_rows * nb, ti, nt);
  for (int64_t r = i0 / nb; r < n_rows && r * nb < i1; ++r) {
    const int64_t b0 = std::max(i0 - r * nb, int64_t{0}), b1 = std::min(i1 - r * nb, nb);
    const int64_t t = token(r);
    kernels::rms_norm_row(x + t * E, h_row(r), weight, E, eps, b0 * block, b1 * block, x_out ? x_out + t * E : nullptr,
                          xn + r * E);
    for (int i = 0; i < n_targets; ++i)
      targets[i].linear->quantize_blocks(xn, r, b0, b1, places_of(targets[i]), *targets[i].in);
  }
}

namespace {

// Rotary angles of one table for one position, as GGML's rope cache computes
// them (ggml_rope_cache_init, rope_yarn): theta_i = pos * theta_scale^i by
// repeated multiplication, divided by the dimension's factor, times the
// frequency scale; with YaRN mixed with the unscaled angle by the ramp, and
// cos and sin times the attention factor. GGML's CPU build fuses rope_yarn's
// two multiply-adds (it is compiled with FMA instructions): so do these.
void rope_angles(const RopeConfig& rope, const float* factors, int64_t half, int64_t rope_dim, int32_t pos,
                 float* cos_out, float* sin_out) {
  const float theta_scale = std::pow(rope.freq_base, -2.0f / static_cast<float>(rope_dim));
  float mscale = rope.attn_factor;
  if (rope.ext_factor != 0.0f) mscale *= std::fma(0.1f, std::log(1.0f / rope.freq_scale), 1.0f);
  float theta = static_cast<float>(pos);
  for (int64_t i = 0; i < half; ++i) {
    const float extrapolated = rope.freq_factors ? theta / factors[i] : theta;
    float angle = rope.freq_scale * extrapolated;
    if (rope.ext_factor != 0.0f) {
      const float y = (static_cast<float>(i) - rope.corr_dims[0]) / std::max(0.001f, rope.corr_dims[1] - rope.corr_dims[0]);
      const float ramp_mix = (1 - std::min(1.0f, std::max(0.0f, y))) * rope.ext_factor;
      angle = std::fma(angle, 1 - ramp_mix, extrapolated * ramp_mix);
    }
    cos_out[i] = std::cos(angle) * mscale;
    sin_out[i] = std::sin(angle) * mscale;
    theta *= theta_scale;
  }
}


}  // namespace

void CpuExecutor::gated_activation(Activation act, float* gate, const float* up, int64_t n,
                                   kernels::GgmlFlavour flavour) {
  if (act == Activation::kGeGLU) {
    kernels::geglu(gate, up, gate, n, flavour);
  } else if (act == Activation::kSwiGLUOai) {
    kernels::swiglu_oai(gate, up, gate, n);
  } else {
    kernels::swiglu(gate, up, gate, n, flavour);
  }
}

void CpuExecutor::plain_activation(Activation act, float* x, int64_t n) {
  // The only non-gated activation the decoder pass runs (the encoders' GELU
  // is the encoder executor's): GGML's relu, then its sqr.
  assert(act == Activation::kReluSquared);
  (void)act;
  for (int64_t i = 0; i < n; ++i) {
    const float r = x[i] > 0.0f ? x[i] : 0.0f;
    x[i] = r * r;
  }
}

// Phases alternate between splitting tokens, or (token, column block) items,
// across threads (norms, the gated activation, quantizing a projection's
// input) and splitting weight rows (projections) or (token, head) pairs
// (RoPE, attention), with a barrier between. The residual stream alternates
// between two buffers, so a norm phase can read one while writing the other.
// What differs between architectures and layers is read from config_ once per
// phase (ModelConfig, LayerConfig), never inside the kernels' loops.
void CpuExecutor::forward_thread(const Pass& pass, int ti, int nt) {
  const ModelConfig& c = config_;
  const ForwardBatch& batch = *pass.batch;
  ThreadPool& pool = *pass.pool;
  const int64_t T = batch.size(), E = c.n_embd, F = c.n_ff;
  const int64_t half = c.rope_dim / 2, D = c.head_dim;
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

  // Token embeddings (scaled where the architecture says) and rotary angles.
  const auto [t0, t1] = ThreadPool::split(T, ti, nt);
  const size_t embd_row_bytes = row_bytes(weights_.tok_embd.dtype, E);
  const float* rope_factors = weights_.rope_freqs ? weights_.rope_freqs.f32() : nullptr;
  for (int64_t t = t0; t < t1; ++t) {
    if (pass.hidden_in) {  // a later stage: the stream as the stage before left it
      std::copy_n(pass.hidden_in + t * E, E, x + t * E);
    } else {
      const auto* row = static_cast<const uint8_t*>(weights_.tok_embd.data) +
                        static_cast<size_t>(batch.tokens[t]) * embd_row_bytes;
      kernels::dequantize_row(weights_.tok_embd.dtype, row, x + t * E, E);
      if (c.embedding_scale != 0.0f)
        for (int64_t i = 0; i < E; ++i) x[t * E + i] *= c.embedding_scale;
    }
    for (size_t r = 0; r < c.ropes.size(); ++r)
      rope_angles(c.ropes[r], rope_factors, half, c.rope_dim, batch.positions[t], &s_.rope_cos[r][t * half],
                  &s_.rope_sin[r][t * half]);
  }
  pool.barrier(idle);

  // The FFN's activated hidden as the down projection reads it: `mine`, or
  // on a tensor-parallel rank every rank's columns of it (split as `split`)
  // gathered (once every thread's rows are activated).
  auto hidden_of_all_ranks = [&](const float* mine, int64_t rows, const ShardSplit& split) -> const float* {
    if (!comm_) return mine;
    pool.barrier(idle);
    gather_over_ranks(mine, rows, s_.hidden_gathered.data(), split, ti, pool, idle);
    return s_.hidden_gathered.data();
  };
  // A projection onto the residual stream (attn_output, ffn_down, with its
  // bias if any) into s_.h; on a tensor-parallel rank its own output rows,
  // then every rank's gathered into s_.h. Ends at a barrier.
  auto project_to_stream = [&](const Linear& w, const LinearInput& in, const StepTokens& rows,
                               const WeightView& bias) {
    float* out = comm_ ? s_.shard_rows.data() : s_.h.data();
    w.compute(in, rows, out, ti, nt);
    if (bias) {  // each thread adds the bias to the rows it computed
      const auto [r0, r1] = w.thread_rows(ti, nt);
      for (int64_t t = 0; t < rows.n && r0 < r1; ++t) add_bias(out + t * w.rows() + r0, bias.f32() + r0, r1 - r0);
    }
    read_weights(1);
    pool.barrier(idle);
    if (comm_) gather_over_ranks(s_.shard_rows.data(), rows.n, s_.h.data(), shard_.embd, ti, pool, idle);
  };

  // A gated MLP of `width` on the FFN rows into s_.h: a dense FFN, or a
  // mixture's shared expert (on a tensor-parallel rank, its hidden is split
  // as `split`). Gate and up, then the gated activation and the
  // down-projection input. When the down projection's input quantizes by
  // blocks, each thread goes on to its own rows' outputs (gate and up split on
  // whole blocks) without a barrier. Ends at a barrier.
  auto gated_mlp = [&](const Linear& gate, const Linear& up, const Linear& down, int64_t width, Activation act,
                       const LinearInput& in_gate, const LinearInput& in_up, LinearInput& in_down,
                       const StepTokens& ffn, const ShardSplit& split) {
    const int64_t TF = ffn.n;
    const int64_t align = own_rows_align(down, width, nt);  // the down projection's input block, or 1
    gate.compute(in_gate, ffn, s_.gate.data(), ti, nt, align);
    up.compute(in_up, ffn, s_.up.data(), ti, nt, align);
    read_weights(2);
    if (align > 1) {
      // Shares start on whole blocks, so a share's tail is the row's tail.
      const auto [r0, r1] = gate.thread_rows(ti, nt, align);
      for (int64_t t = 0; t < TF && r0 < r1; ++t) {
        gated_activation(act, s_.gate.data() + t * width + r0, s_.up.data() + t * width + r0, r1 - r0, flavour_);
        down.quantize_blocks(s_.gate.data(), t, r0 / align, r1 / align, ffn, in_down);
      }
    } else {
      pool.barrier(idle);
      const auto [f0, f1] = ThreadPool::split(TF, ti, nt);
      // Row by row: GGML's AVX2 SwiGLU treats a row's last n % 8 elements apart.
      for (int64_t t = f0; t < f1; ++t)
        gated_activation(act, s_.gate.data() + t * width, s_.up.data() + t * width, width, flavour_);
      down.quantize(hidden_of_all_ranks(s_.gate.data(), TF, split), f0, f1, ffn, in_down);
    }
    pool.barrier(idle);
    project_to_stream(down, in_down, ffn, {});
  };

  // A non-gated MLP of `width` on the FFN rows into s_.h: up, the activation
  // (row by row, in s_.gate) and down. Ends at a barrier.
  auto plain_mlp = [&](const Linear& up, const Linear& down, int64_t width, Activation act, const LinearInput& in_up,
                       LinearInput& in_down, const StepTokens& ffn) {
    up.compute(in_up, ffn, s_.gate.data(), ti, nt);
    read_weights(1);
    pool.barrier(idle);
    const auto [f0, f1] = ThreadPool::split(ffn.n, ti, nt);
    for (int64_t t = f0; t < f1; ++t) plain_activation(act, s_.gate.data() + t * width, width);
    down.quantize(hidden_of_all_ranks(s_.gate.data(), ffn.n, shard_.ffn), f0, f1, ffn, in_down);
    pool.barrier(idle);
    project_to_stream(down, in_down, ffn, {});
  };

  // The norms' outputs: this thread's own (kOwnNormMaxTokens), or shared.
  const bool own = !s_.own.empty();
  NormOutputs& norm = own ? s_.own[ti] : s_.norm;
  float* xn = norm.xn.data();
  // The branch output waiting for the next norm phase's residual add (in
  // s_.h), and the norm it goes through first (sandwich norms), if any.
  bool pending = false;
  const float* pending_norm = nullptr;
  for (int64_t l = layer_begin_; l < layer_end_; ++l) {
    const LayerWeights& W = weights_.layers[l];
    const LayerLinears& L = linears_[l];
    const std::vector<Phase>& phases = programs_[l].phases;
    // The last layer's FFN runs on the output rows only, as llama.cpp's graphs
    // do: no other row is read again (its h is then indexed by output row).
    const bool last = l + 1 == c.n_layer && !c.traits->last_layer_on_every_token;
    const StepTokens& ffn = last ? pass.outputs : pass.tokens;
    // What a norm phase quantized for the phase after it.
    LinearInput *in_q = nullptr, *in_k = nullptr, *in_v = nullptr, *in_gate = nullptr, *in_up = nullptr;
    LinearInput *in_shexp_gate = nullptr, *in_shexp_up = nullptr;
    for (size_t i = 0; i < phases.size(); ++i) {
      const Phase& phase = phases[i];
      if (const auto* ph = std::get_if<NormPhase>(&phase)) {
        const Phase& next = phases.at(i + 1);
        const bool for_ffn = ph->branch == NormPhase::Branch::kFfn;
        const WeightView& weight = for_ffn ? W.ffn_norm : W.attn_norm;
        const StepTokens& rows = for_ffn ? ffn : pass.tokens;
        const int32_t* row_token = for_ffn && last ? pass.output_tokens : nullptr;
        float* x_out = pending ? x_next : nullptr;
        const float* h = pending ? s_.h.data() : nullptr;
        if (std::holds_alternative<QkvPhase>(next)) {
          const Linear &wq = L[Projection::kQ], &wk = L[Projection::kK], &wv = L[Projection::kV];
          in_q = &norm.q;
          in_k = wk.same_input(wq) ? &norm.q : &norm.k;
          in_v = wv.same_input(wq) ? &norm.q : &norm.v;
          norm_phase(ti, nt, rows, row_token, x, h, pending_norm, x_out, weight.f32(), xn,
                     {{&wq, in_q}, {&wk, in_k}, {&wv, in_v}}, own);
        } else if (std::holds_alternative<DeltaNetPhase>(next)) {
          // attn_qkv, attn_gate, ssm_beta and ssm_alpha (in_q, in_k, in_v, in_gate).
          in_q = &norm.dn_qkv;
          in_k = L.dn_z.same_input(L.dn_qkv) ? &norm.dn_qkv : &norm.dn_z;
          in_v = L.dn_beta.same_input(L.dn_qkv) ? &norm.dn_qkv : &norm.dn_beta;
          in_gate = L.dn_alpha.same_input(L.dn_qkv) ? &norm.dn_qkv : &norm.dn_alpha;
          norm_phase(ti, nt, rows, row_token, x, h, pending_norm, x_out, weight.f32(), xn,
                     {{&L.dn_qkv, in_q}, {&L.dn_z, in_k}, {&L.dn_beta, in_v}, {&L.dn_alpha, in_gate}}, own);
        } else if (std::holds_alternative<Mamba2Phase>(next)) {
          in_q = &norm.m_in;  // ssm_in's input
          norm_phase(ti, nt, rows, row_token, x, h, pending_norm, x_out, weight.f32(), xn, {{&L.m_in, in_q}}, own);
        } else if (const auto* dense = std::get_if<DenseFfnPhase>(&next); dense && !dense->gated) {
          in_up = &norm.up;
          norm_phase(ti, nt, rows, row_token, x, h, pending_norm, x_out, weight.f32(), xn,
                     {{&L[Projection::kUp], in_up}}, own);
        } else if (std::holds_alternative<MlaQkvPhase>(next)) {
          // The query's first projection and attn_kv_a_mqa (in_q, in_k).
          in_q = &norm.q;
          in_k = L.mla_kv_a.same_input(L.mla_q) ? &norm.q : &norm.k;
          norm_phase(ti, nt, rows, row_token, x, h, pending_norm, x_out, weight.f32(), xn,
                     {{&L.mla_q, in_q}, {&L.mla_kv_a, in_k}}, own);
        } else if (std::holds_alternative<MoeFfnPhase>(next)) {
          // The router's input and the experts' (quantized once per token, in
          // GGML's mul_mat_id order).
          // A shared expert's inputs are quantized for the batch's token
          // places, as a dense FFN's (it runs as one: ggml_mul_mat).
          const Linear& expert_gate = L.gate_exps[0];
          in_gate = &norm.gate;
          in_up = L.up_exps[0].same_input(expert_gate) ? &norm.gate : &norm.up;
          if (L.shared_expert()) {
            in_shexp_gate = &norm.shexp_gate;
            in_shexp_up = L.up_shexp.same_input(L.gate_shexp) ? &norm.shexp_gate : &norm.shexp_up;
            norm_phase(ti, nt, rows, row_token, x, h, pending_norm, x_out, weight.f32(), xn,
                       {{&L.router, &norm.router},
                        {&expert_gate, in_gate, &s_.expert_tokens},
                        {&L.up_exps[0], in_up, &s_.expert_tokens},
                        {&L.gate_shexp, in_shexp_gate},
                        {&L.up_shexp, in_shexp_up}},
                       own);
          } else {
            norm_phase(ti, nt, rows, row_token, x, h, pending_norm, x_out, weight.f32(), xn,
                       {{&L.router, &norm.router},
                        {&expert_gate, in_gate, &s_.expert_tokens},
                        {&L.up_exps[0], in_up, &s_.expert_tokens}},
                       own);
          }
        } else {
          const Linear &gate = L[Projection::kGate], &up = L[Projection::kUp];
          in_gate = &norm.gate;
          in_up = up.same_input(gate) ? &norm.gate : &norm.up;
          norm_phase(ti, nt, rows, row_token, x, h, pending_norm, x_out, weight.f32(), xn,
                     {{&gate, in_gate}, {&up, in_up}}, own);
        }
        if (pending) std::swap(x, x_next);
        pending = false;
        if (!own) pool.barrier(idle);
      } else if (const auto* ph = std::get_if<QkvPhase>(&phase)) {
        qkv(pass, l, *ph, *in_q, *in_k, *in_v, ti, nt);
        read_weights(3);
        pool.barrier(idle);
      } else if (const auto* ph = std::get_if<AttentionPhase>(&phase)) {
        // Each head's output is quantized for the output projection right
        // away when its columns are whole quantize blocks.
        // A tensor-parallel rank quantizes the whole rows once every rank's
        // heads are gathered.
        const Linear& wo = L[Projection::kO];
        const int64_t o_block = comm_ ? 0 : quantize_block_of(wo, D);
        attention(pass, l, *ph, ti, nt, o_block);
        if (o_block == 0) {
          pool.barrier(idle);
          const float* heads = s_.attn.data();
          if (comm_) {
            gather_over_ranks(heads, T, s_.attn_gathered.data(), shard_.attn, ti, pool, idle);
            heads = s_.attn_gathered.data();
          }
          wo.quantize(heads, t0, t1, pass.tokens, s_.in_o);
        }
        pool.barrier(idle);
      } else if (const auto* ph = std::get_if<MlaQkvPhase>(&phase)) {
        mla_qkv(pass, l, *ph, *in_q, *in_k, ti, nt, idle);
        read_weights(ph->q_lora ? 3 : 2);
      } else if (const auto* ph = std::get_if<MlaAttentionPhase>(&phase)) {
        mla_attention(pass, l, *ph, ti, nt, idle);
      } else if (std::holds_alternative<DeltaNetPhase>(phase)) {
        delta_net(pass, l, *in_q, *in_k, *in_v, *in_gate, ti, nt, idle);
        read_weights(5);
        pending = true;
        pending_norm = nullptr;
      } else if (std::holds_alternative<Mamba2Phase>(phase)) {
        mamba2(pass, l, *in_q, ti, nt, idle);
        read_weights(2);
        pending = true;
        pending_norm = nullptr;
      } else if (const auto* ph = std::get_if<OutputPhase>(&phase)) {
        project_to_stream(L[Projection::kO], s_.in_o, pass.tokens, W.bo);
        pending = true;
        pending_norm = ph->post_norm ? W.post_attn_norm.f32() : nullptr;
      } else if (const auto* ph = std::get_if<MoeFfnPhase>(&phase)) {
        if (ph->shared_expert) {
          gated_mlp(L.gate_shexp, L.up_shexp, L.down_shexp, c.moe.shared_width(), ph->activation, *in_shexp_gate,
                    *in_shexp_up, s_.in_down_shexp, ffn, shard_.shared);
        }
        moe_ffn(pass, l, *ph, ffn, norm.router, *in_gate, *in_up, ti, nt, idle);
        read_weights(1);
        pending = true;
        pending_norm = ph->post_norm ? W.post_ffn_norm.f32() : nullptr;
      } else if (const auto* ph = std::get_if<DenseFfnPhase>(&phase); ph && !ph->gated) {
        plain_mlp(L[Projection::kUp], L[Projection::kDown], F, ph->activation, *in_up, s_.in_down, ffn);
        pending = true;
        pending_norm = ph->post_norm ? W.post_ffn_norm.f32() : nullptr;
      } else if (const auto* ph = std::get_if<DenseFfnPhase>(&phase)) {
        gated_mlp(L[Projection::kGate], L[Projection::kUp], L[Projection::kDown], F, ph->activation, *in_gate, *in_up,
                  s_.in_down, ffn, shard_.ffn);
        pending = true;
        pending_norm = ph->post_norm ? W.post_ffn_norm.f32() : nullptr;
      }
    }
  }

  if (!last_stage()) return hand_on_stream(pass, x, pending ? s_.h.data() : nullptr, pending_norm, ti, nt);

  // The last residual (through the last branch's own norm where there is
  // one), the final norm and the output projection's input, for the rows
  // whose logits are wanted.
  if (pooled_) {
    norm_phase(ti, nt, pass.outputs, nullptr, x, s_.h.data(), pending_norm, nullptr, weights_.output_norm.f32(),
               s_.logits_in.data(), {}, false, /*h_by_row=*/true);
    pool.barrier(idle);
    return pool_outputs(pass, ti, nt);
  }
  if (!head_in_pass_) {  // a shared head: the final norm's rows go to head_logits, here and on the first stage
    norm_phase(ti, nt, pass.outputs, pass.output_tokens, x, s_.h.data(), pending_norm, nullptr,
               weights_.output_norm.f32(), pass.logits, {}, false, /*h_by_row=*/!c.traits->last_layer_on_every_token);
    return;
  }
  norm_phase(ti, nt, pass.outputs, pass.output_tokens, x, s_.h.data(), pending_norm, nullptr,
             weights_.output_norm.f32(), s_.logits_in.data(), {{&output_, &s_.in_out}}, false,
             /*h_by_row=*/!c.traits->last_layer_on_every_token);
  pool.barrier(idle);
  assert(ranges_read + 1 == pf.size());  // plan_prefetch lists the projections in this order
  output_.compute(s_.in_out, pass.outputs, pass.logits, ti, nt);
}

// The residual add the next stage's first norm phase would make, made here
// (the same float sums: rms_norm_row adds x + h before it reads the row), so
// that one stream of batch.size() x n_embd crosses to the next stage.
void CpuExecutor::hand_on_stream(const Pass& pass, const float* x, const float* h, const float* h_weight, int ti,
                                 int nt) const {
  const int64_t E = config_.n_embd;
  thread_local std::vector<float> h_normed;  // grown once, not per step
  h_normed.resize(h_weight ? E : 0);
  const auto [t0, t1] = ThreadPool::split(pass.batch->size(), ti, nt);
  for (int64_t t = t0; t < t1; ++t) {
    const float* hr = h ? h + t * E : nullptr;
    if (hr && h_weight) {  // a sandwich norm's output, normalized before it is added
      kernels::rms_norm_row(hr, nullptr, h_weight, E, config_.rms_eps, 0, E, nullptr, h_normed.data());
      hr = h_normed.data();
    }
    for (int64_t i = 0; i < E; ++i) pass.logits[t * E + i] = hr ? x[t * E + i] + hr[i] : x[t * E + i];
  }
}

void CpuExecutor::pool_outputs(const Pass& pass, int ti, int nt) const {
  const ForwardBatch& batch = *pass.batch;
  const int64_t E = config_.n_embd;
  const auto [r0, r1] = ThreadPool::split(static_cast<int64_t>(batch.logit_rows.size()), ti, nt);
  for (int64_t r = r0; r < r1; ++r) {
    const SequenceSlice& sl = batch.sequences[s_.token_seq[batch.logit_rows[r]]];
    pool_rows(config_.pooling, s_.logits_in.data() + static_cast<int64_t>(sl.first_token) * E, sl.n_tokens, E,
              pass.logits + r * E);
  }
}

}  // namespace inferd
