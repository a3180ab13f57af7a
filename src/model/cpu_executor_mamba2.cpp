// The CPU executor's Mamba-2 phase (model/layer_program.h: Mamba2Phase), in
// llama.cpp's build_mamba2_layer's order and rounding: every elementwise step
// is the GGML op's (kernels/cpu/activation.h, rms_norm.h), the convolution
// and the scan are GGML's ssm_conv and ssm_scan (kernels/cpu/short_conv.h,
// selective_scan.h).
//
// A sequence's tokens go through the convolution and the scan in order, from
// the state its slot holds, so a prompt split into chunks, or decoded a token
// at a time, leaves the same state and gives the same outputs as one call.
// Threads split the conv channels and the heads, which share nothing, and the
// tokens for the row-wise steps (SiLU, the z gate's rows, the group norms).
#include <algorithm>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/selective_scan.h"
#include "kernels/cpu/short_conv.h"
#include "model/cpu_executor.h"
#include "model/slice_state.h"

namespace inferd {

void CpuExecutor::prepare_mamba2_scratch(int64_t T) {
  const Mamba2Config& m = config_.mamba2;
  Scratch::Mamba2& s = s_.m2;
  s.zxbcdt.resize(T * m.in_proj_rows());
  s.conv.resize(T * m.conv_channels());
  s.y.resize(T * m.inner);
  for (const LayerLinears& L : linears_)
    if (L.mamba2()) L.m_out.prepare(s.in_out, T);
}

void CpuExecutor::mamba2(const Pass& pass, int64_t l, const LinearInput& in, int ti, int nt, const BarrierIdle& idle) {
  const ModelConfig& c = config_;
  const Mamba2Config& m = c.mamba2;
  const ForwardBatch& batch = *pass.batch;
  ThreadPool& pool = *pass.pool;
  const LayerLinears& L = linears_[l];
  const Mamba2Weights& W = weights_.layers[l].mamba2;
  Scratch::Mamba2& s = s_.m2;
  KVCache& cache = *pass.cache;
  const int64_t T = batch.size(), R = m.in_proj_rows(), C = m.conv_channels(), I = m.inner, H = m.n_heads;
  const int64_t P = m.head_dim(), N = m.d_state, G = m.n_groups, taps = m.conv_kernel;
  const auto [t0, t1] = ThreadPool::split(T, ti, nt);
  // A slice starting at position 0 starts from a zero state (a new request,
  // or one recomputed after preemption); one with load_state_from starts from
  // that slot's (a prefix snapshot, or the checkpoint before rejected drafts);
  // the others continue their slot's. save_state_to gets the state after the
  // slice's last token (forward_batch.h).
  auto fresh = [&](const SequenceSlice& sl) { return batch.positions[sl.first_token] == 0; };

  // ssm_in: per token z (I), the conv channels x, B, C (C), the time steps (H).
  L.m_in.compute(in, pass.tokens, s.zxbcdt.data(), ti, nt);
  pool.barrier(idle);

  // The convolution, this thread's channels of each sequence in batch order.
  const auto [c0, c1] = ThreadPool::split(C, ti, nt);
  const StatePart window_part{taps - 1, C, c0, c1};
  const auto window_of = [&](int32_t slot) { return cache.conv_state(l, slot); };
  for (const SequenceSlice& sl : batch.sequences) {
    float* window = cache.conv_state(l, sl.state_slot);
    begin_slice_state(sl, fresh(sl), window_part, window_of);
    kernels::ShortConvArgs a;
    a.x = s.zxbcdt.data() + sl.first_token * R + I;
    a.x_stride = static_cast<size_t>(R);
    a.n_tokens = sl.n_tokens;
    a.channels = C;
    a.weight = L.m_conv.data();
    a.taps = taps;
    a.state = window;
    a.out = s.conv.data() + sl.first_token * C;
    a.out_stride = static_cast<size_t>(C);
    kernels::short_conv(a, c0, c1);
    end_slice_state(sl, window_part, window_of);
  }
  pool.barrier(idle);
  // This thread's tokens: the convolution's bias, SiLU over the row of
  // channels (GGML's silu runs whole rows), and the time steps' bias.
  for (int64_t t = t0; t < t1; ++t) {
    float* row = s.conv.data() + t * C;
    if (W.conv_b) add_bias(row, W.conv_b.f32(), C);
    kernels::silu(row, row, C, flavour_);
    add_bias(s.zxbcdt.data() + t * R + I + C, W.dt_bias.f32(), H);
  }
  pool.barrier(idle);

  // The scan on this thread's heads of each sequence in batch order; then
  // each head's y + x * D (GGML's mul, then its add) and its rows times
  // silu(z) (GGML's swiglu over rows of one head: silu(z) * y).
  const auto [h0, h1] = ThreadPool::split(H, ti, nt);
  // This thread's heads: a head's state is P * N floats.
  const StatePart state_part{1, 0, h0 * P * N, h1 * P * N};
  const auto state_of = [&](int32_t slot) { return cache.recurrent_state(l, slot); };
  for (const SequenceSlice& sl : batch.sequences) {
    if (h0 >= h1) break;
    float* state = cache.recurrent_state(l, sl.state_slot);
    begin_slice_state(sl, fresh(sl), state_part, state_of);
    const float* conv = s.conv.data() + sl.first_token * C;
    kernels::SelectiveScanArgs a;
    a.x = conv;
    a.x_stride = static_cast<size_t>(C);
    a.dt = s.zxbcdt.data() + sl.first_token * R + I + C;
    a.dt_stride = static_cast<size_t>(R);
    a.a = W.a.f32();
    a.b = conv + I;
    a.c = conv + I + G * N;
    a.bc_stride = static_cast<size_t>(C);
    a.n_tokens = sl.n_tokens;
    a.n_heads = H;
    a.head_dim = P;
    a.n_groups = G;
    a.d_state = N;
    a.state = state;
    a.y = s.y.data() + sl.first_token * I;
    a.y_stride = static_cast<size_t>(I);
    kernels::selective_scan(a, h0, h1, flavour_);
    end_slice_state(sl, state_part, state_of);
    for (int64_t t = sl.first_token; t < sl.first_token + sl.n_tokens; ++t) {
      const float* x = s.conv.data() + t * C;
      const float* z = s.zxbcdt.data() + t * R;
      float* y = s.y.data() + t * I;
      for (int64_t h = h0; h < h1; ++h) {
        const float d = W.d.f32()[h];
        for (int64_t i = h * P; i < (h + 1) * P; ++i) y[i] += kernels::detail::rounded_product(x[i], d);  // not fused: two GGML ops
        kernels::swiglu(z + h * P, y + h * P, y + h * P, P, flavour_);
      }
    }
  }
  pool.barrier(idle);
  // Each group of channels RMS-normalized by ssm_norm (its rows of I / G),
  // then ssm_out's input.
  const int64_t group_width = I / G;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t g = 0; g < G; ++g) {
      float* row = s.y.data() + t * I + g * group_width;
      kernels::rms_norm_row(row, nullptr, W.norm.f32() + g * group_width, group_width, c.rms_eps, 0, group_width,
                            nullptr, row);
    }
  }
  L.m_out.quantize(s.y.data(), t0, t1, pass.tokens, s.in_out);
  pool.barrier(idle);
  L.m_out.compute(s.in_out, pass.tokens, s_.h.data(), ti, nt);
  pool.barrier(idle);
}

}  // namespace inferd
