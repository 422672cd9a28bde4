// Vocab-parallel cross entropy (Megatron's tensor_parallel/cross_entropy.py): each TP rank holds
// the logits of its vocabulary shard [N, Vl] and the loss is computed without ever gathering them
// (PITFALLS #2: cross entropy on gathered logits adds log(TP) and loses the target gradient).
//
//   forward : local max -> all-reduce(max) -> local sum_exp and target logit with the global max
//             -> one all-reduce(sum) of both -> loss = log(sum_exp) + max - target_logit
//   backward: dlogits = dloss * (softmax - onehot) on this shard, from the saved global max and
//             sum_exp (no communication)
//
// Shapes: logits [N, Vl] (f32 or f64: the model's logits dtype), targets [N] i32/i64 global ids
// in [0, Vl * TP), statistics and loss [N] f32 (f64 for f64 logits). On a group of size 1 the
// serial cross_entropy_fwd op runs instead (single-rank results unchanged). Gradient rule: no
// parameters; dlogits is written (=) and may alias logits.
#pragma once

#include "megatron/core/comm/process_group.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"

namespace mg::tensor_parallel {

struct CrossEntropySaved {
  Tensor max, sum_exp;  // [N] global (over the whole vocabulary) row max and sum of exp(l - max)
};

// loss [N] = logsumexp over the full vocabulary - logit[target]. vocab_start: this rank's first
// vocabulary row (vocab_range(...).start). Shards may differ in width and may be empty (Vl = 0):
// a caller that drops the padding rows [V, V_pad) from its output layer (so the loss does not
// depend on TP's padding, PITFALLS #1) passes each rank's real rows only. vocab_end_of_all:
// targets must lie in [0, it); -1: Vl * TP (equal shards).
Tensor vocab_parallel_cross_entropy(const ops::OpTable& ops, const Tensor& logits,
                                    const Tensor& targets, int64_t vocab_start,
                                    comm::ProcessGroup& tp, CrossEntropySaved& saved,
                                    int64_t vocab_end_of_all = -1);

// dlogits [N, Vl] = dloss [N] * (softmax(logits) - onehot(target)) on this shard.
void vocab_parallel_cross_entropy_bwd(const ops::OpTable& ops, Tensor& dlogits, const Tensor& dloss,
                                      const Tensor& logits, const Tensor& targets,
                                      int64_t vocab_start, const CrossEntropySaved& saved);

}  // namespace mg::tensor_parallel
