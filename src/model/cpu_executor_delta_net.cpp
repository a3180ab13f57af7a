// The CPU executor's Gated DeltaNet phase (model/layer_program.h:
// DeltaNetPhase), in llama.cpp's qwen35 graph's order and rounding: every
// elementwise step is the GGML op's (kernels/cpu/activation.h, rms_norm.h),
// the convolution and the delta rule are GGML's ssm_conv and fused
// gated_delta_net (kernels/cpu/short_conv.h, gated_delta_rule.h).
//
// A sequence's tokens go through the convolution and the delta rule in order,
// from the state its slot holds, so a prompt split into chunks, or decoded a
// token at a time, leaves the same state and gives the same outputs as one
// call. Threads split the conv channels and the value heads, which share
// nothing, and the tokens for the elementwise steps.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/gated_delta_rule.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/short_conv.h"
#include "model/cpu_executor.h"
#include "model/slice_state.h"

namespace inferd {

void CpuExecutor::prepare_delta_net_scratch(int64_t T) {
  const DeltaNetConfig& d = config_.delta_net;
  const int64_t C = d.conv_channels(), V = d.value_dim(), HV = d.n_v_heads;
  Scratch::DeltaNet& s = s_.dn;
  s.qkv.resize(T * C);
  s.conv.resize(T * C);
  s.z.resize(T * V);
  s.beta.resize(T * HV);
  s.decay.resize(T * HV);
  s.out.resize(T * V);
  for (const LayerLinears& L : linears_)
    if (L.delta_net()) L.dn_out.prepare(s.in_out, T);
}

void CpuExecutor::delta_net(const Pass& pass, int64_t l, const LinearInput& in_qkv, const LinearInput& in_z,
                            const LinearInput& in_beta, const LinearInput& in_alpha, int ti, int nt,
                            const BarrierIdle& idle) {
  const ModelConfig& c = config_;
  const DeltaNetConfig& d = c.delta_net;
  const ForwardBatch& batch = *pass.batch;
  ThreadPool& pool = *pass.pool;
  const LayerLinears& L = linears_[l];
  const DeltaNetWeights& W = weights_.layers[l].delta_net;
  Scratch::DeltaNet& s = s_.dn;
  KVCache& cache = *pass.cache;
  const int64_t T = batch.size(), C = d.conv_channels(), V = d.value_dim(), HV = d.n_v_heads, S = d.head_size;
  const int64_t KD = d.key_dim(), taps = d.conv_kernel;
  const auto [t0, t1] = ThreadPool::split(T, ti, nt);
  // A slice starting at position 0 starts from a zero state (a new request,
  // or one recomputed after preemption); the others continue their slot's.
  auto fresh = [&](const SequenceSlice& sl) { return batch.positions[sl.first_token] == 0; };

  // The projections of the norm's output.
  L.dn_qkv.compute(in_qkv, pass.tokens, s.qkv.data(), ti, nt);
  L.dn_z.compute(in_z, pass.tokens, s.z.data(), ti, nt);
  L.dn_beta.compute(in_beta, pass.tokens, s.beta.data(), ti, nt);
  L.dn_alpha.compute(in_alpha, pass.tokens, s.decay.data(), ti, nt);
  pool.barrier(idle);

  // The convolution, this thread's channels of each sequence in batch order.
  const auto [c0, c1] = ThreadPool::split(C, ti, nt);
  const StatePart window_part{taps - 1, C, c0, c1};
  const auto window_of = [&](int32_t slot) { return cache.conv_state(l, slot); };
  for (const SequenceSlice& sl : batch.sequences) {
    float* window = cache.conv_state(l, sl.state_slot);
    begin_slice_state(sl, fresh(sl), window_part, window_of);
    kernels::ShortConvArgs a;
    a.x = s.qkv.data() + sl.first_token * C;
    a.x_stride = static_cast<size_t>(C);
    a.n_tokens = sl.n_tokens;
    a.channels = C;
    a.weight = L.dn_conv.data();
    a.taps = taps;
    a.state = window;
    a.out = s.conv.data() + sl.first_token * C;
    a.out_stride = static_cast<size_t>(C);
    kernels::short_conv(a, c0, c1);
    end_slice_state(sl, window_part, window_of);
  }
  // This thread's tokens' write strengths and log decays: sigmoid(beta),
  // softplus(alpha + dt_bias) * a, each step rounded as GGML's ops.
  for (int64_t t = t0; t < t1; ++t) {
    float* beta = s.beta.data() + t * HV;
    float* g = s.decay.data() + t * HV;
    kernels::sigmoid(beta, beta, HV);
    for (int64_t h = 0; h < HV; ++h) g[h] += W.dt_bias.f32()[h];
    kernels::softplus(g, g, HV);
    for (int64_t h = 0; h < HV; ++h) g[h] *= W.a.f32()[h];
  }
  pool.barrier(idle);

  // SiLU of each token's conv output (GGML's silu runs a whole row of
  // channels), then each query and key head L2-normalized.
  for (int64_t t = t0; t < t1; ++t) {
    float* row = s.conv.data() + t * C;
    kernels::silu(row, row, C, flavour_);
    for (int64_t i = 0; i < 2 * KD; i += S) kernels::l2_norm_row(row + i, S, c.rms_eps);
  }
  pool.barrier(idle);

  // The delta rule on this thread's value heads of each sequence in batch
  // order; then each head's output RMS-normalized by ssm_norm and times
  // silu(z) (GGML's silu over rows of one head), ready for ssm_out.
  const auto [h0, h1] = ThreadPool::split(HV, ti, nt);
  thread_local std::vector<float> z_silu;
  z_silu.resize(S);
  // This thread's value heads: a head's matrix is S * S floats.
  const StatePart state_part{1, 0, h0 * S * S, h1 * S * S};
  const auto state_of = [&](int32_t slot) { return cache.recurrent_state(l, slot); };
  for (const SequenceSlice& sl : batch.sequences) {
    if (h0 >= h1) break;
    float* state = cache.recurrent_state(l, sl.state_slot);
    begin_slice_state(sl, fresh(sl), state_part, state_of);
    const float* conv = s.conv.data() + sl.first_token * C;
    kernels::GatedDeltaArgs a;
    a.q = conv;
    a.k = conv + KD;
    a.v = conv + 2 * KD;
    a.q_stride = a.k_stride = a.v_stride = static_cast<size_t>(C);
    a.g = s.decay.data() + sl.first_token * HV;
    a.beta = s.beta.data() + sl.first_token * HV;
    a.gb_stride = static_cast<size_t>(HV);
    a.n_tokens = sl.n_tokens;
    a.n_k_heads = d.n_k_heads;
    a.n_v_heads = HV;
    a.size = S;
    a.state = state;
    a.out = s.out.data() + sl.first_token * V;
    a.out_stride = static_cast<size_t>(V);
    kernels::gated_delta_rule(a, h0, h1, flavour_);
    end_slice_state(sl, state_part, state_of);
    for (int64_t t = sl.first_token; t < sl.first_token + sl.n_tokens; ++t) {
      for (int64_t h = h0; h < h1; ++h) {
        float* o = s.out.data() + t * V + h * S;
        kernels::rms_norm_row(o, nullptr, W.norm.f32(), S, c.rms_eps, 0, S, nullptr, o);
        kernels::silu(s.z.data() + t * V + h * S, z_silu.data(), S, flavour_);
        for (int64_t i = 0; i < S; ++i) o[i] *= z_silu[i];
      }
    }
  }
  pool.barrier(idle);
  L.dn_out.quantize(s.out.data(), t0, t1, pass.tokens, s.in_out);
  pool.barrier(idle);
  L.dn_out.compute(s.in_out, pass.tokens, s_.h.data(), ti, nt);
  pool.barrier(idle);
}

}  // namespace inferd
