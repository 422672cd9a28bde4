// Tensor-parallel sharding of parameters: which part of the FULL (TP-invariant) tensor a TP rank
// holds, and the helpers that move between the two.
//
// A Partition is Megatron's (partition_dim, partition_stride) plus this rank's (rank, size). The
// partitioned dim D of the full tensor is cut into `stride` equal blocks and each block into `size`
// equal parts; rank r holds part r of every block, concatenated in block order. So:
//   - stride 1, dim 0: contiguous rows (column-parallel weights and biases, the vocab-parallel
//     embedding and output layer, the fused QKV of FORMATS.md §6.2: rank r holds KV groups
//     [r NG/TP, (r+1) NG/TP), each still grouped as [q heads | k | v]);
//   - stride 2, dim 0: SwiGLU's linear_fc1 [gate; up] (FORMATS.md §6.3): rank r holds
//     [gate_r; up_r];
//   - dim 1: row-parallel weights (linear_proj, linear_fc2): columns.
// A shard is a list of contiguous element ranges ("pieces") of the full row-major tensor, so
// initialisation draws each piece from counter (offset + its global start) and equals the slice of
// the full tensor bit for bit (InitArgs in op_args.h): initial weights do not depend on TP
// (PITFALLS #7).
//
// Also here: the vocab range of a rank and the GQA head split, with errors naming the values.
// Not here: communication (gather_partitioned lives in mappings.h).
#pragma once

#include <cstdint>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"

namespace mg::tensor_parallel {

struct Partition {
  int dim = -1;      // partitioned dim of the full tensor; -1: replicated (every rank holds it all)
  int stride = 1;    // Megatron's partition_stride
  int64_t rank = 0;  // this rank in the TP group
  int64_t size = 1;  // TP group size
  bool replicated() const { return dim < 0 || size == 1; }
};

// The shard's shape: global_shape with dim D divided by size. Throws naming the values when D is
// not divisible by stride * size.
Shape local_shape(const Shape& global_shape, const Partition& part);

// One contiguous range of the shard: local elements [local_start, local_start + length) are full
// elements [global_start, global_start + length).
struct Piece {
  int64_t global_start = 0;
  int64_t local_start = 0;
  int64_t length = 0;
};
// The shard's pieces in local order (one piece when replicated or for dim 0 stride 1).
std::vector<Piece> partition_pieces(const Shape& global_shape, const Partition& part);

// Normal(mean, std) initialisation of a shard: equals the same slice of init_normal on the full
// tensor with the same args, bit for bit. shard: local_shape(global_shape, part).
void init_normal_partitioned(const ops::OpTable& ops, Tensor& shard, const Shape& global_shape,
                             const Partition& part, const ops::InitArgs& args);

// This rank's shard of a full tensor (a copy, on full's device).
Tensor slice_partition(const Tensor& full, const Partition& part);
// The inverse over all ranks: shards[r] is rank r's shard (Partition with rank r); returns the full
// tensor (on shards[0]'s device).
Tensor assemble_partitions(const std::vector<Tensor>& shards, const Shape& global_shape, int dim,
                           int stride);

// Vocabulary rows [start, end) of rank `rank` of the padded vocabulary (Megatron's
// VocabUtility.vocab_range_from_global_vocab_size). padded_vocab % size must be 0.
struct VocabRange {
  int64_t start = 0, end = 0;
  int64_t size() const { return end - start; }
};
VocabRange vocab_range(int64_t padded_vocab, int64_t rank, int64_t size);

// Attention heads of one TP rank. GQA: whole KV groups per rank; num_query_groups %
// tensor_model_parallel_size must be 0 (and so num_attention_heads % tp), else an error naming the
// values (Megatron's ng < TP replication is not supported).
struct AttentionPartition {
  int64_t heads = 0;   // NH / TP
  int64_t groups = 0;  // NG / TP
  int64_t first_head = 0, first_group = 0;
};
AttentionPartition attention_partition(int64_t num_attention_heads, int64_t num_query_groups,
                                       int64_t rank, int64_t size);

// numerator / denominator, which must divide exactly; `what` names the quantity in the error.
int64_t divide_exact(int64_t numerator, int64_t denominator, const char* what);

}  // namespace mg::tensor_parallel
