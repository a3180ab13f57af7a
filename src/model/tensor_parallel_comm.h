// What the ranks of a tensor-parallel model exchange inside a forward pass
// (model/tensor_shard.h says what each holds). The CPU executor calls it from
// one thread of its fused pass while the others wait at the pool's barrier;
// distributed/tensor_parallel.h carries it over MPI. Every rank makes the
// same calls in the same order.
#pragma once
#include <cstddef>
#include <cstdint>

namespace inferd {

class TensorParallelComm {
 public:
  virtual ~TensorParallelComm() = default;
  // Whether this rank gets the gathered logits (rank 0, which samples).
  virtual bool root() const = 0;
  // data[0, n) <- the sum of every rank's data[0, n), in place on every rank:
  // the partial outputs of attn_output and ffn_down.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // The LM head's logits: each rank has rows x its own vocabulary columns
  // (`part`, rows x part_cols); on the root `whole` (rows x whole_cols) gets
  // every rank's columns side by side, in rank order. `whole` is not read
  // elsewhere.
  virtual void gather_columns(const float* part, int64_t rows, int64_t part_cols, float* whole,
                              int64_t whole_cols) = 0;
};

}  // namespace inferd
