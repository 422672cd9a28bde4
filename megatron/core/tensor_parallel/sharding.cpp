// Partition arithmetic, partitioned init, shard slicing and assembly, vocab and head splits
// (sharding.h).
#include "megatron/core/tensor_parallel/sharding.h"

#include <algorithm>

#include "megatron/core/common/error.h"

namespace mg::tensor_parallel {

int64_t divide_exact(int64_t numerator, int64_t denominator, const char* what) {
  MG_CHECK(denominator >= 1 && numerator % denominator == 0,
           what << " = " << numerator << " is not divisible by " << denominator);
  return numerator / denominator;
}

namespace {

void check_partition(const Shape& global_shape, const Partition& part) {
  MG_CHECK(part.size >= 1 && part.rank >= 0 && part.rank < part.size,
           "tensor-parallel rank " << part.rank << " outside a group of size " << part.size);
  MG_CHECK(part.stride >= 1, "partition_stride must be >= 1, got " << part.stride);
  if (part.dim < 0) return;
  MG_CHECK(part.dim < static_cast<int>(global_shape.size()),
           "partition dim " << part.dim << " of a tensor of shape " << shape_str(global_shape));
  const int64_t d = global_shape[part.dim];
  MG_CHECK(d % (part.stride * part.size) == 0,
           "dim " << part.dim << " of " << shape_str(global_shape) << " (" << d
                  << ") is not divisible by partition_stride " << part.stride
                  << " x tensor_model_parallel_size " << part.size);
}

}  // namespace

Shape local_shape(const Shape& global_shape, const Partition& part) {
  check_partition(global_shape, part);
  Shape s = global_shape;
  if (!part.replicated()) s[part.dim] /= part.size;
  return s;
}

std::vector<Piece> partition_pieces(const Shape& global_shape, const Partition& part) {
  check_partition(global_shape, part);
  const int64_t numel = shape_numel(global_shape);
  if (part.replicated()) return {Piece{0, 0, numel}};
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < part.dim; ++i) outer *= global_shape[i];
  for (std::size_t i = part.dim + 1; i < global_shape.size(); ++i) inner *= global_shape[i];
  const int64_t d = global_shape[part.dim];
  const int64_t block = d / part.stride, len = block / part.size;
  std::vector<Piece> pieces;
  int64_t local = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t k = 0; k < part.stride; ++k) {
      const Piece p{(o * d + k * block + part.rank * len) * inner, local, len * inner};
      local += p.length;
      if (p.length == 0) continue;
      if (!pieces.empty() && pieces.back().global_start + pieces.back().length == p.global_start) {
        pieces.back().length += p.length;  // contiguous in both: merge
      } else {
        pieces.push_back(p);
      }
    }
  }
  return pieces;
}

void init_normal_partitioned(const ops::OpTable& ops, Tensor& shard, const Shape& global_shape,
                             const Partition& part, const ops::InitArgs& args) {
  const Shape expect = local_shape(global_shape, part);
  MG_CHECK(shard.shape() == expect, "init_normal_partitioned: shard "
                                        << shard.str() << ", expected shape " << shape_str(expect));
  Tensor flat = shard.view({shard.numel()});
  for (const Piece& p : partition_pieces(global_shape, part)) {
    Tensor piece = flat.slice(p.local_start, p.length);
    ops::InitArgs a = args;
    a.offset = args.offset + static_cast<uint64_t>(p.global_start);
    ops.init_normal(piece, a);
  }
}

Tensor slice_partition(const Tensor& full, const Partition& part) {
  Tensor shard = Tensor::empty(local_shape(full.shape(), part), full.dtype(), full.device());
  const Tensor src = full.view({full.numel()});
  Tensor dst = shard.view({shard.numel()});
  for (const Piece& p : partition_pieces(full.shape(), part))
    dst.slice(p.local_start, p.length).copy_(src.slice(p.global_start, p.length));
  return shard;
}

Tensor assemble_partitions(const std::vector<Tensor>& shards, const Shape& global_shape, int dim,
                           int stride) {
  MG_CHECK(!shards.empty(), "assemble_partitions: no shards");
  const int64_t size = static_cast<int64_t>(shards.size());
  Tensor full = Tensor::empty(global_shape, shards[0].dtype(), shards[0].device());
  Tensor dst = full.view({full.numel()});
  for (int64_t r = 0; r < size; ++r) {
    const Partition part{dim, stride, r, size};
    const Shape expect = local_shape(global_shape, part);
    MG_CHECK(shards[r].shape() == expect, "assemble_partitions: shard "
                                              << r << " is " << shards[r].str() << ", expected "
                                              << shape_str(expect));
    const Tensor src = shards[r].view({shards[r].numel()});
    for (const Piece& p : partition_pieces(global_shape, part))
      dst.slice(p.global_start, p.length).copy_(src.slice(p.local_start, p.length));
    if (part.replicated()) break;  // every rank holds the whole tensor
  }
  return full;
}

VocabRange vocab_range(int64_t padded_vocab, int64_t rank, int64_t size) {
  MG_CHECK(size >= 1 && rank >= 0 && rank < size,
           "tensor-parallel rank " << rank << " outside a group of size " << size);
  MG_CHECK(padded_vocab % size == 0,
           "padded vocabulary " << padded_vocab
                                << " is not divisible by tensor_model_parallel_size " << size
                                << " (pad it to a multiple of make_vocab_size_divisible_by x TP)");
  const int64_t per = padded_vocab / size;
  return VocabRange{rank * per, (rank + 1) * per};
}

AttentionPartition attention_partition(int64_t num_attention_heads, int64_t num_query_groups,
                                       int64_t rank, int64_t size) {
  MG_CHECK(size >= 1 && rank >= 0 && rank < size,
           "tensor-parallel rank " << rank << " outside a group of size " << size);
  MG_CHECK(num_attention_heads % size == 0,
           "num_attention_heads (" << num_attention_heads
                                   << ") must be divisible by tensor_model_parallel_size (" << size
                                   << ")");
  MG_CHECK(num_query_groups % size == 0,
           "num_query_groups (" << num_query_groups
                                << ") must be divisible by tensor_model_parallel_size (" << size
                                << "): GQA splits whole KV groups across TP ranks");
  AttentionPartition a;
  a.heads = num_attention_heads / size;
  a.groups = num_query_groups / size;
  a.first_head = rank * a.heads;
  a.first_group = rank * a.groups;
  return a;
}

}  // namespace mg::tensor_parallel
