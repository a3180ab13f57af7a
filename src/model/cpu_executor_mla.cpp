// The CPU executor's multi-head latent attention (see model/cpu_executor.h),
// as llama.cpp's deepseek2 graph computes it when the file has attn_k_b and
// attn_v_b: the cache keeps one latent (normalized) and one RoPE key per token
// and layer; each head's query is taken into the latent space (q_nope times
// attn_k_b, the "absorbed" form), attends over latent + RoPE key as one
// shared head (MQA), and its output, still a latent, is taken out to the
// head's value by attn_v_b. Prompts run the same absorbed path (correctness
// first; docs/design.md says what a faster prefill would do).
#include <algorithm>
#include <cstring>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"
#include "model/cpu_executor.h"

namespace inferd {

void CpuExecutor::prepare_mla_scratch(int64_t T) {
  const ModelConfig& c = config_;
  const MlaConfig& m = c.mla;
  const int64_t H = c.n_head, R = m.kv_lora_rank, W = m.latent_width();
  auto& s = s_.mla;
  s.q_a.resize(T * m.q_lora_rank);
  s.q.resize(T * H * m.q_head());
  s.kv.resize(T * W);
  s.q_nope.resize(H * T * m.qk_nope);
  s.absorbed.resize(H * T * R);
  // The widest slot a cache of any dtype gives (kv::KVCacheSpec::latent).
  s.q_latent.resize(T * H * kv::KVCacheSpec::latent_head_size(DType::Q8_0, static_cast<int32_t>(W)));
  s.out.resize(H * T * R);
  s.value.resize(H * T * m.v_head);
  s.in_k_b.resize(H);
  s.in_v_b.resize(H);
  for (const LayerLinears& L : linears_) {
    if (!L.latent_attention()) continue;
    if (L.mla_q_b.rows() > 0) L.mla_q_b.prepare(s.in_q_b, T);
    for (int64_t h = 0; h < H; ++h) {
      L.mla_k_b[h].prepare(s.in_k_b[h], T);
      L.mla_v_b[h].prepare(s.in_v_b[h], T);
    }
  }
}

void CpuExecutor::mla_qkv(const Pass& pass, int64_t l, const MlaQkvPhase& phase, const LinearInput& in_q,
                          const LinearInput& in_kv, int ti, int nt, const BarrierIdle& idle) {
  const ModelConfig& c = config_;
  const MlaConfig& m = c.mla;
  const ForwardBatch& batch = *pass.batch;
  ThreadPool& pool = *pass.pool;
  const LayerWeights& Wt = weights_.layers[l];
  const LayerLinears& L = linears_[l];
  auto& s = s_.mla;
  const int64_t T = batch.size(), H = c.n_head, R = m.kv_lora_rank, W = m.latent_width();
  const int64_t QH = m.q_head(), NOPE = m.qk_nope, half = m.qk_rope / 2;
  const auto [t0, t1] = ThreadPool::split(T, ti, nt);

  // The query's first projection and the compressed KV, rows split.
  L.mla_q.compute(in_q, pass.tokens, phase.q_lora ? s.q_a.data() : s.q.data(), ti, nt);
  L.mla_kv_a.compute(in_kv, pass.tokens, s.kv.data(), ti, nt);
  pool.barrier(idle);
  if (phase.q_lora) {  // attn_q_a's output RMS-normalized, then attn_q_b
    const int64_t Q = m.q_lora_rank;
    for (int64_t t = t0; t < t1; ++t)
      kernels::rms_norm_row(s.q_a.data() + t * Q, nullptr, Wt.mla.q_a_norm.f32(), Q, c.rms_eps, 0, Q, nullptr,
                            s.q_a.data() + t * Q);
    L.mla_q_b.quantize(s.q_a.data(), t0, t1, pass.tokens, s.in_q_b);
    pool.barrier(idle);
    L.mla_q_b.compute(s.in_q_b, pass.tokens, s.q.data(), ti, nt);
    pool.barrier(idle);
  }

  // Per token: the latent normalized and the RoPE key rotated, both written to
  // the cache (latent first, as llama.cpp concatenates them; zeros after them
  // to the slot's Wc); each head's query rotated in its RoPE part, its no-RoPE
  // part set out per head for attn_k_b.
  const auto pairs = phase.rope_style == RopeStyle::kNeox ? kernels::RopePairs::kHalves : kernels::RopePairs::kAdjacent;
  const DType kv_dtype = pass.cache->layer_spec(l).dtype;
  const int64_t Wc = pass.cache->layer_spec(l).head_size;
  thread_local std::vector<float> padded;
  padded.assign(static_cast<size_t>(Wc), 0.0f);
  for (int64_t t = t0; t < t1; ++t) {
    const float* cos_t = &s_.rope_cos[phase.rope][t * half];
    const float* sin_t = &s_.rope_sin[phase.rope][t * half];
    float* kv = s.kv.data() + t * W;
    kernels::rms_norm_row(kv, nullptr, Wt.mla.kv_a_norm.f32(), R, c.rms_eps, 0, R, nullptr, kv);
    kernels::rope_head(kv + R, m.qk_rope, pairs, cos_t, sin_t);
    const int64_t slot = batch.slots[pass.cache->group(l)][t];
    if (Wc > W) kv = static_cast<float*>(std::memcpy(padded.data(), kv, W * sizeof(float)));
    kernels::quantize_row(kv_dtype, kv, pass.cache->k(l) + pass.cache->head_offset(l, slot, 0), Wc);
    for (int64_t h = 0; h < H; ++h) {
      float* q = s.q.data() + (t * H + h) * QH;
      kernels::rope_head(q + NOPE, m.qk_rope, pairs, cos_t, sin_t);
      float* q_latent = s.q_latent.data() + (t * H + h) * Wc;
      std::memcpy(q_latent + R, q + NOPE, m.qk_rope * sizeof(float));
      std::fill(q_latent + W, q_latent + Wc, 0.0f);
      std::memcpy(s.q_nope.data() + (h * T + t) * NOPE, q, NOPE * sizeof(float));
    }
  }
  for (int64_t h = 0; h < H; ++h)
    L.mla_k_b[h].quantize(s.q_nope.data() + h * T * NOPE, t0, t1, pass.tokens, s.in_k_b[h]);
  pool.barrier(idle);

  // Each head's no-RoPE query into the latent space (heads split): the
  // absorbed query is [q_nope attn_k_b, q_pe], llama.cpp's concatenation.
  const auto [h0, h1] = ThreadPool::split(H, ti, nt);
  for (int64_t h = h0; h < h1; ++h) {
    float* absorbed = s.absorbed.data() + h * T * R;
    L.mla_k_b[h].compute_rows(s.in_k_b[h], pass.tokens, absorbed, 0, R);
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(s.q_latent.data() + (t * H + h) * Wc, absorbed + t * R, R * sizeof(float));
  }
  pool.barrier(idle);
}

void CpuExecutor::mla_attention(const Pass& pass, int64_t layer, const MlaAttentionPhase& phase, int ti, int nt,
                                const BarrierIdle& idle) {
  const ModelConfig& c = config_;
  const MlaConfig& m = c.mla;
  const ForwardBatch& batch = *pass.batch;
  ThreadPool& pool = *pass.pool;
  const LayerLinears& L = linears_[layer];
  auto& s = s_.mla;
  const kv::KVCacheSpec& spec = pass.cache->layer_spec(layer);
  const int64_t T = batch.size(), H = c.n_head, R = m.kv_lora_rank, Wc = spec.head_size, V = m.v_head;
  const std::byte* latent = pass.cache->k(layer);
  const int32_t kv_group = pass.cache->group(layer);
  const auto block_stride = static_cast<int64_t>(pass.cache->block_stride());

  // One work item per (token, head): the head's latent output, quantized at
  // once for attn_v_b (a row of that head's input).
  const auto [begin, end] = ThreadPool::split(T * H, ti, nt);
  size_t seq = 0;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t t = item / H, h = item % H;
    while (t >= batch.sequences[seq].first_token + batch.sequences[seq].n_tokens) ++seq;
    const SequenceSlice& sl = batch.sequences[seq];
    // Values are the keys' first R elements: the same slots read twice.
    const kernels::PagedKV kv{latent, latent, Wc, spec.block_size, sl.block_tables[kv_group].data(), spec.dtype,
                              block_stride};
    const auto attn_pass =
        sl.prompt_pass() ? kernels::AttentionPass::kPrefill : kernels::AttentionPass::kDecode;
    float* out = s.out.data() + (h * T + t) * R;
    kernels::attend_latent_heads(s.q_latent.data() + (t * H + h) * Wc, 1, kv, Wc, R, 0, batch.positions[t] + 1,
                                 phase.kq_scale, attn_pass, out, flavour_);
    L.mla_v_b[h].quantize(s.out.data() + h * T * R, t, t + 1, pass.tokens, s.in_v_b[h]);
  }
  pool.barrier(idle);

  // Each head's latent output to its value (heads split), into the output
  // projection's input row: the heads' values side by side.
  const auto [h0, h1] = ThreadPool::split(H, ti, nt);
  for (int64_t h = h0; h < h1; ++h) {
    float* value = s.value.data() + h * T * V;
    L.mla_v_b[h].compute_rows(s.in_v_b[h], pass.tokens, value, 0, V);
    for (int64_t t = 0; t < T; ++t) std::memcpy(s_.attn.data() + (t * H + h) * V, value + t * V, V * sizeof(float));
  }
  pool.barrier(idle);
  const auto [t0, t1] = ThreadPool::split(T, ti, nt);
  L[Projection::kO].quantize(s_.attn.data(), t0, t1, pass.tokens, s_.in_o);
  pool.barrier(idle);
}

}  // namespace inferd
