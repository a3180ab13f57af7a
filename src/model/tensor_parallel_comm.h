// What the ranks of a tensor-parallel model exchange inside a forward pass
// (model/tensor_shard.h says what each holds). The CPU executor calls it from
// one thread of its fused pass while the others wait at the pool's barrier;
// distributed/tensor_parallel.h carries it over MPI. Every rank makes the
// same calls in the same order.
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/tensor_shard.h"

namespace inferd {

class TensorParallelComm {
 public:
  virtual ~TensorParallelComm() = default;
  // Whether this rank gets the gathered logits (rank 0, which samples).
  virtual bool root() const = 0;
  // Each rank has `rows` rows of its own columns of `split` (`part`, rows x
  // its part's width); on every rank `whole` (rows x split.whole()) gets every
  // rank's columns in place: the heads' outputs, the activated FFN hidden,
  // and attn_output's and ffn_down's output rows.
  virtual void all_gather_columns(const float* part, int64_t rows, float* whole, const ShardSplit& split) = 0;
  // Rows of `width` floats, rank r's being rows [split.of(r)) of `rows`: each
  // rank has filled its own, and on every rank every rank's are put in place
  // (expert parallelism's outputs, the routed rows of each rank's experts;
  // their counts change every step and every rank knows them all).
  virtual void all_gather_rows(float* rows, int64_t width, const ShardSplit& split) = 0;
  // The same to the root only: the LM head's logits (`whole` is not read
  // elsewhere).
  virtual void gather_columns(const float* part, int64_t rows, float* whole, const ShardSplit& split) = 0;
};

}  // namespace inferd
