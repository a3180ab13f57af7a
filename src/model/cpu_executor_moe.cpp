// The CPU executor's mixture-of-experts FFN phase (see model/cpu_executor.h):
// router, routing, then the chosen experts' gated MLPs with the batch's
// tokens grouped by expert, as llama.cpp's build_moe_ffn and GGML's
// mul_mat_id compute them.
#include <algorithm>
#include <numeric>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/moe_routing.h"
#include "kernels/cpu/packed_layout.h"
#include "model/cpu_executor.h"

namespace inferd {

namespace {

kernels::RouterGating router_gating(ExpertGating g) {
  switch (g) {
    case ExpertGating::kSoftmax: return kernels::RouterGating::kSoftmax;
    case ExpertGating::kSigmoid: return kernels::RouterGating::kSigmoid;
    case ExpertGating::kSoftmaxOfChosen: return kernels::RouterGating::kSoftmaxOfChosen;
  }
  return kernels::RouterGating::kSoftmax;
}

// A step's experts in use (of `experts`: this rank's) split into units of rows, each unit weighed by the
// tokens routed to its expert (plus the cost of reading its weights, about
// two tokens' work), dealt out to threads in expert order by that weight.
// The split changes which thread computes a row, never its bits.
template <class Fn>
void for_each_unit_of_thread(const std::vector<int64_t>& first, ShardRange experts, int64_t rows, int64_t unit_rows,
                             int ti, int nt, Fn&& fn) {
  const int64_t units_per_expert = (rows + unit_rows - 1) / unit_rows;
  int64_t total = 0;
  for (int64_t e = experts.begin; e < experts.end; ++e)
    if (first[e + 1] > first[e]) total += (first[e + 1] - first[e] + 2) * units_per_expert;
  int64_t done = 0;
  for (int64_t e = experts.begin; e < experts.end; ++e) {
    const int64_t n = first[e + 1] - first[e];
    if (n == 0) continue;
    for (int64_t u = 0; u < units_per_expert; ++u) {
      const int64_t cost = n + 2;
      const int64_t owner = std::min<int64_t>(nt - 1, (2 * done + cost) * nt / (2 * total));
      done += cost;
      if (owner == ti) fn(e, u * unit_rows, std::min(rows, (u + 1) * unit_rows));
    }
  }
}

int64_t experts_in_use(const std::vector<int64_t>& first, ShardRange experts) {
  int64_t n = 0;
  for (int64_t e = experts.begin; e < experts.end; ++e) n += first[e + 1] > first[e];
  return n;
}

}  // namespace

void CpuExecutor::prepare_moe_scratch(int64_t T, int n_threads) {
  const MoeConfig& m = config_.moe;
  const int64_t S = T * m.n_expert_used;
  auto& moe = s_.moe;
  moe.logits.resize(T * m.n_expert);
  if (m.gated_shared_expert) moe.shared_gate.resize(T);
  moe.chosen.resize(S);
  moe.weights.resize(S);
  moe.first.resize(n_threads);
  moe.row_choice.resize(n_threads);
  moe.choice_row.resize(n_threads);
  for (int i = 0; i < n_threads; ++i) {
    moe.first[i].resize(m.n_expert + 1);
    moe.row_choice[i].resize(S);
    moe.choice_row[i].resize(S);
  }
  moe.gate.resize(S * m.n_ff_exp);
  moe.up.resize(S * m.n_ff_exp);
  moe.out.resize(S * config_.n_embd);
  for (const LayerLinears& L : linears_) {
    if (L.gate_exps.empty()) continue;
    L.gate_exps[0].prepare(moe.in_gate, S);
    if (!L.up_exps[0].same_input(L.gate_exps[0])) L.up_exps[0].prepare(moe.in_up, S);
    L.down_exps[0].prepare(moe.in_down, S);
  }
  s_.expert_places.assign(static_cast<size_t>(S), kernels::TokenPlace{1, 0});
  s_.expert_tokens = StepTokens{S, s_.expert_places.data()};
}

void CpuExecutor::moe_ffn(const Pass& pass, int64_t l, const MoeFfnPhase& phase, const StepTokens& ffn,
                          const LinearInput& in_router,
                          const LinearInput& in_gate, const LinearInput& in_up, int ti, int nt,
                          const BarrierIdle& idle) {
  ThreadPool& pool = *pass.pool;
  const MoeConfig& m = config_.moe;
  const LayerLinears& L = linears_[l];
  auto& moe = s_.moe;
  const int64_t TF = ffn.n, X = m.n_expert, K = m.n_expert_used, F = m.n_ff_exp, E = config_.n_embd;
  const int64_t S = TF * K;
  const bool separate_up = !L.up_exps[0].same_input(L.gate_exps[0]);
  const MoeWeights& B = weights_.layers[l].moe;  // for the biases (gpt-oss)

  // Router logits (a plain matmul: the batch's token places; in the fast tier
  // each token alone, so a prompt's cut changes no bit: Linear).
  L.router.compute(in_router, ffn, moe.logits.data(), ti, nt);
  // The shared expert's gate: the same input, one row.
  if (phase.shared_expert_gate) L.gate_inp_shexp.compute(in_router, ffn, moe.shared_gate.data(), ti, nt);
  pool.barrier(idle);

  // Each token's experts and weights.
  const kernels::RouterParams params{router_gating(m.gating), X, K, m.normalize_weights, m.weights_scale,
                                     phase.selection_bias ? B.selection_bias.f32() : nullptr};
  thread_local std::vector<float> route_scratch;
  route_scratch.resize(X);
  {
    const auto [t0, t1] = ThreadPool::split(TF, ti, nt);
    for (int64_t t = t0; t < t1; ++t) {
      float* logits = moe.logits.data() + t * X;
      if (B.router_bias) add_bias(logits, B.router_bias.f32(), X);
      kernels::route_token(params, logits, route_scratch.data(), moe.chosen.data() + t * K, moe.weights.data() + t * K,
                           flavour_);
    }
  }
  pool.barrier(idle);

  // The choices grouped by expert, each expert's in token order (as
  // mul_mat_id groups them); every thread builds the same grouping of its own.
  std::vector<int64_t>& first = moe.first[ti];
  std::vector<int64_t>& row_choice = moe.row_choice[ti];
  std::vector<int64_t>& choice_row = moe.choice_row[ti];
  std::fill(first.begin(), first.end(), 0);
  for (int64_t i = 0; i < S; ++i) ++first[moe.chosen[i] + 1];
  std::partial_sum(first.begin(), first.end(), first.begin());
  thread_local std::vector<int64_t> cursor;
  cursor.assign(first.begin(), first.end() - 1);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t r = cursor[moe.chosen[i]]++;
    row_choice[r] = i;
    choice_row[i] = r;
  }
  // Gather the experts' inputs: routed row r is its token's quantized row
  // (this rank's experts' rows only).
  const int64_t x0 = experts_.begin;
  {
    const int64_t mine0 = first[x0], mine = first[experts_.end] - mine0;
    const auto [i0, i1] = ThreadPool::split(mine, ti, nt);
    for (int64_t r = mine0 + i0; r < mine0 + i1; ++r) {
      const int64_t t = row_choice[r] / K;
      L.gate_exps[0].copy_input_row(in_gate, t, moe.in_gate, r);
      if (separate_up) L.up_exps[0].copy_input_row(in_up, t, moe.in_up, r);
    }
  }
  pool.barrier(idle);

  // Gate and up, the gated activation and the down projection's input, by
  // units of one expert's rows: whole experts when there are enough to go
  // round, else runs of the down input's blocks (so a thread quantizes the
  // blocks it computed without waiting for the others).
  const Linear& down0 = L.down_exps[0];
  const int64_t down_block = down0.quantize_block() > 0 && F % down0.quantize_block() == 0 ? down0.quantize_block() : 0;
  const int64_t block_unit = down_block > 0 ? std::lcm(down_block, int64_t{kernels::kPackRows}) : 0;
  const int64_t active = experts_in_use(first, experts_);
  const int64_t gate_unit = active >= 2 * nt || block_unit == 0 || F % block_unit != 0 ? F : block_unit;
  const LinearInput& up_input = separate_up ? moe.in_up : moe.in_gate;
  for_each_unit_of_thread(first, experts_, F, gate_unit, ti, nt, [&](int64_t e, int64_t r0, int64_t r1) {
    const int64_t row0 = first[e], n = first[e + 1] - first[e];
    const StepTokens tokens{n, s_.expert_places.data()};
    L.gate_exps[e - x0].compute_rows_span(moe.in_gate, row0, tokens, moe.gate.data() + row0 * F, r0, r1);
    L.up_exps[e - x0].compute_rows_span(up_input, row0, tokens, moe.up.data() + row0 * F, r0, r1);
    for (int64_t r = row0; r < row0 + n; ++r) {
      float* g = moe.gate.data() + r * F;
      float* u = moe.up.data() + r * F;
      if (B.gate_bias) add_bias(g + r0, B.gate_bias.f32() + e * F + r0, r1 - r0);
      if (B.up_bias) add_bias(u + r0, B.up_bias.f32() + e * F + r0, r1 - r0);
      gated_activation(phase.activation, g + r0, u + r0, r1 - r0, flavour_);
      if (r0 == 0 && r1 == F) {
        down0.quantize(moe.gate.data(), r, r + 1, s_.expert_tokens, moe.in_down);
      } else {
        down0.quantize_blocks(moe.gate.data(), r, r0 / down_block, r1 / down_block, s_.expert_tokens, moe.in_down);
      }
    }
  });
  pool.barrier(idle);

  // Down, by whole experts or runs of 64 rows.
  const int64_t down_unit = active >= 2 * nt ? E : 64;
  for_each_unit_of_thread(first, experts_, E, down_unit, ti, nt, [&](int64_t e, int64_t r0, int64_t r1) {
    const int64_t row0 = first[e], n = first[e + 1] - first[e];
    const StepTokens tokens{n, s_.expert_places.data()};
    L.down_exps[e - x0].compute_rows_span(moe.in_down, row0, tokens, moe.out.data() + row0 * E, r0, r1);
    if (B.down_bias)
      for (int64_t r = row0; r < row0 + n; ++r) add_bias(moe.out.data() + r * E + r0, B.down_bias.f32() + e * E + r0, r1 - r0);
  });
  pool.barrier(idle);

  // Expert parallelism: the routed rows are grouped by expert in expert
  // order, so each rank's are one contiguous run of moe.out; gathered, every
  // rank holds one process's moe.out and sums it as one process does.
  if (comm_ && shard_.experts.count() > 0) {
    if (ti == 0) {
      ShardSplit& rows = moe.gathered_rows;
      rows.edges.resize(shard_.experts.edges.size());
      for (size_t r = 0; r < rows.edges.size(); ++r) rows.edges[r] = first[shard_.experts.edges[r]];
      comm_->all_gather_rows(moe.out.data(), E, rows);
    }
    pool.barrier(idle);
  }

  // Each token's experts weighted and summed in its choice order; then the
  // shared expert's output (already in h) added to the whole sum, as
  // llama.cpp's graph does before the residual add (added to the residual
  // first, or into the sum before its last expert, it would round otherwise).
  {
    const auto [t0, t1] = ThreadPool::split(TF, ti, nt);
    thread_local std::vector<const float*> rows;
    thread_local std::vector<float> routed;
    rows.resize(K);
    routed.resize(E);
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t j = 0; j < K; ++j) rows[j] = moe.out.data() + choice_row[t * K + j] * E;
      float* h = s_.h.data() + t * E;
      if (!phase.shared_expert) {
        kernels::combine_experts(rows.data(), moe.weights.data() + t * K, K, E, h);
        continue;
      }
      kernels::combine_experts(rows.data(), moe.weights.data() + t * K, K, E, routed.data());
      if (phase.shared_expert_gate) {
        // As GGML: the shared output times the sigmoid (rounded), then the add.
        float g;
        kernels::sigmoid(moe.shared_gate.data() + t, &g, 1);
        for (int64_t i = 0; i < E; ++i) h[i] *= g;
      }
      for (int64_t i = 0; i < E; ++i) h[i] = routed[i] + h[i];
    }
  }
  pool.barrier(idle);
}

}  // namespace inferd
