// Tensor- and sequence-parallel communication as conjugate forward/backward pairs (Megatron's
// tensor_parallel/mappings.py). Each mapping is a function `m` and its backward `m_bwd`: a module
// calls `m` in forward and `m_bwd` on the gradient in backward, so the two always match:
//
//   mapping (forward / backward)                          forward       backward
//   copy_to_tensor_model_parallel_region                  identity      all-reduce
//   reduce_from_tensor_model_parallel_region              all-reduce    identity
//   scatter_to_tensor_model_parallel_region               split last    all-gather last
//   gather_from_tensor_model_parallel_region              all-gather    split last
//                                                          last
//   scatter_to_sequence_parallel_region                   split dim 0   all-gather dim 0
//   gather_from_sequence_parallel_region                  all-gather 0  reduce-scatter 0 (or split)
//   reduce_scatter_to_sequence_parallel_region            reduce-sc. 0  all-gather dim 0
//
// Activations are sequence-first [S, B, H], so the sequence-parallel ops (dim 0) are contiguous
// collectives with no copies. The last-dim ops (only used by ColumnParallelLinear(gather_output)
// and RowParallelLinear(!input_is_parallel), never on the GPT path) permute blocks through a host
// copy: correct on every device, not fast.
//
// Every function is the identity (no copy, no communication) on a group of size 1, so a
// single-rank model is bit-identical with and without these calls. All-reduce mappings reduce
// IN PLACE and return their argument (callers pass freshly computed tensors). Sums are over the
// group in the backend's deterministic order: every rank gets the same bits.
#pragma once

#include "megatron/core/comm/process_group.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/tensor_parallel/sharding.h"

namespace mg::tensor_parallel {

using comm::ProcessGroup;

// ---- primitives ----
// x = sum over the group of x (in place); returns x.
Tensor all_reduce_(Tensor x, ProcessGroup& g);
// x [n, ...] -> [size n, ...]: member r's x at rows [r n, (r+1) n).
Tensor all_gather_dim0(const Tensor& x, ProcessGroup& g);
// x [size n, ...] -> [n, ...]: sum over members of rows [rank n, (rank+1) n).
Tensor reduce_scatter_dim0(const Tensor& x, ProcessGroup& g);
// x [size n, ...] -> rows [rank n, (rank+1) n) (a view).
Tensor split_dim0(const Tensor& x, ProcessGroup& g);
// x [..., c] -> [..., size c]: member r's x at columns [r c, (r+1) c).
Tensor all_gather_last_dim(const Tensor& x, ProcessGroup& g);
// x [..., size c] -> columns [rank c, (rank+1) c) (a copy).
Tensor split_last_dim(const Tensor& x, ProcessGroup& g);

// ---- conjugate pairs ----
inline Tensor copy_to_tensor_model_parallel_region(const Tensor& x, ProcessGroup&) {
  return x;
}
inline Tensor copy_to_tensor_model_parallel_region_bwd(Tensor dy, ProcessGroup& g) {
  return all_reduce_(std::move(dy), g);
}
inline Tensor reduce_from_tensor_model_parallel_region(Tensor x, ProcessGroup& g) {
  return all_reduce_(std::move(x), g);
}
inline Tensor reduce_from_tensor_model_parallel_region_bwd(const Tensor& dy, ProcessGroup&) {
  return dy;
}
inline Tensor scatter_to_tensor_model_parallel_region(const Tensor& x, ProcessGroup& g) {
  return split_last_dim(x, g);
}
inline Tensor scatter_to_tensor_model_parallel_region_bwd(const Tensor& dy, ProcessGroup& g) {
  return all_gather_last_dim(dy, g);
}
inline Tensor gather_from_tensor_model_parallel_region(const Tensor& x, ProcessGroup& g) {
  return all_gather_last_dim(x, g);
}
inline Tensor gather_from_tensor_model_parallel_region_bwd(const Tensor& dy, ProcessGroup& g) {
  return split_last_dim(dy, g);
}
inline Tensor scatter_to_sequence_parallel_region(const Tensor& x, ProcessGroup& g) {
  return split_dim0(x, g);
}
inline Tensor scatter_to_sequence_parallel_region_bwd(const Tensor& dy, ProcessGroup& g) {
  return all_gather_dim0(dy, g);
}
inline Tensor gather_from_sequence_parallel_region(const Tensor& x, ProcessGroup& g) {
  return all_gather_dim0(x, g);
}
// tensor_parallel_output_grad (Megatron's flag): the consumer of the gathered tensor was a TP
// region whose per-rank gradients are partial sums (reduce-scatter them); false: every rank
// holds the full gradient (take this rank's rows).
inline Tensor gather_from_sequence_parallel_region_bwd(const Tensor& dy, ProcessGroup& g,
                                                       bool tensor_parallel_output_grad = true) {
  return tensor_parallel_output_grad ? reduce_scatter_dim0(dy, g) : split_dim0(dy, g);
}
inline Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, ProcessGroup& g) {
  return reduce_scatter_dim0(x, g);
}
inline Tensor reduce_scatter_to_sequence_parallel_region_bwd(const Tensor& dy, ProcessGroup& g) {
  return all_gather_dim0(dy, g);
}

// The full tensor of a partitioned parameter (or gradient) on every rank of g: all-gather of the
// shards, then reassembly (sharding.h). part.rank/size must be g's.
Tensor gather_partitioned(const Tensor& shard, const Shape& global_shape, const Partition& part,
                          ProcessGroup& g);

}  // namespace mg::tensor_parallel
