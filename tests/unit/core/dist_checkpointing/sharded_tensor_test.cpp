// Sharded tensors: TP boxes equal the shard layout of tensor_parallel::slice_partition, and
// copy_overlap reassembles any target layout (other TP size, stride-2 fc1, row/column parallel,
// distributed-optimizer flat ranges, padded vocabularies) from pieces of any source layout; the
// reference is slicing the full tensor directly.
#include "megatron/core/dist_checkpointing/sharded_tensor.h"

#include <gtest/gtest.h>

#include <cstring>

namespace mg::dist_checkpointing {
namespace {

using tensor_parallel::Partition;

Tensor iota(const Shape& shape) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) + 0.5f;
  return Tensor::from_vector(v, shape, DType::f32);
}

// The pieces a source layout stores: every TP rank's boxes, each cut into `chunks` flat ranges
// (chunks > 1: like a distributed-optimizer shard), with the data taken from `full`.
std::vector<ShardedTensor> source_pieces(const Tensor& full, int dim, int stride, int64_t tp,
                                         int chunks) {
  std::vector<ShardedTensor> out;
  for (int64_t r = 0; r < tp; ++r) {
    const Partition part{dim, stride, r, tp};
    const Tensor local = tensor_parallel::slice_partition(full, part);
    const Tensor flat = local.view({local.numel()});
    for (const Box& b : partition_boxes(full.shape(), part)) {
      const int64_t n = shape_numel(b.shape);
      for (int c = 0; c < chunks; ++c) {
        ShardedTensor t;
        t.key = "w";
        t.global_shape = full.shape();
        t.global_offset = b.offset;
        t.local_shape = b.shape;
        t.flat_begin = n * c / chunks;
        t.flat_end = n * (c + 1) / chunks;
        t.data = flat.slice(b.local_start + t.flat_begin, t.numel()).clone();
        if (t.numel() > 0) out.push_back(t);
      }
    }
  }
  return out;
}

// Rebuilds the target rank's shard from the pieces; returns it (and checks coverage).
Tensor rebuild(const std::vector<ShardedTensor>& pieces, const Shape& global, const Partition& part,
               int64_t* covered) {
  Tensor local = Tensor::zeros(tensor_parallel::local_shape(global, part), DType::f32);
  Tensor flat = local.view({local.numel()});
  *covered = 0;
  for (const Box& b : partition_boxes(global, part)) {
    Tensor dst = flat.slice(b.local_start, shape_numel(b.shape));
    for (const auto& p : pieces)
      *covered += copy_overlap(p, static_cast<const std::byte*>(p.data.raw_data()), b.offset,
                               b.shape, static_cast<std::byte*>(dst.raw_data()), sizeof(float));
  }
  return local;
}

TEST(ShardedTensor, BoxesMatchSlicePartition) {
  const Tensor full = iota({8, 6});
  for (int stride : {1, 2})
    for (int64_t tp : {1, 2, 4}) {
      const Partition part{0, stride, tp - 1, tp};
      const auto boxes = partition_boxes(full.shape(), part);
      EXPECT_EQ(static_cast<int>(boxes.size()), tp == 1 ? 1 : stride);
      const Tensor local = tensor_parallel::slice_partition(full, part);
      // Each box's elements are the full tensor's at its offset.
      const auto lv = local.to_vector<float>();
      for (const Box& b : boxes)
        for (int64_t i = 0; i < shape_numel(b.shape); ++i) {
          const int64_t row = b.offset[0] + i / b.shape[1], col = b.offset[1] + i % b.shape[1];
          EXPECT_EQ(lv[static_cast<std::size_t>(b.local_start + i)],
                    static_cast<float>(row * 6 + col) + 0.5f);
        }
    }
}

TEST(ShardedTensor, ReshardAnyLayoutToAnyOther) {
  struct Layout {
    int dim, stride;
  };
  // Column-parallel (dim 0), SwiGLU fc1 (dim 0 stride 2), row-parallel (dim 1), replicated.
  for (const Layout l : {Layout{0, 1}, Layout{0, 2}, Layout{1, 1}, Layout{-1, 1}}) {
    const Tensor full = iota({16, 12});
    for (int64_t src_tp : {1, 2, 4})
      for (int chunks : {1, 3})
        for (int64_t dst_tp : {1, 2, 4}) {
          const auto pieces = source_pieces(full, l.dim, l.stride, src_tp, chunks);
          for (int64_t r = 0; r < dst_tp; ++r) {
            const Partition part{l.dim, l.stride, r, dst_tp};
            int64_t covered = 0;
            const Tensor got = rebuild(pieces, full.shape(), part, &covered);
            const Tensor want = tensor_parallel::slice_partition(full, part);
            // Replicated pieces are identical copies on every source rank: count once per rank.
            const int64_t copies = l.dim < 0 ? src_tp : 1;
            EXPECT_EQ(covered, want.numel() * copies);
            EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>())
                << "dim " << l.dim << " stride " << l.stride << " TP " << src_tp << " -> " << dst_tp
                << " rank " << r << " chunks " << chunks;
          }
        }
  }
}

TEST(ShardedTensor, DifferentGlobalRowsCopyTheOverlap) {
  // A padded vocabulary of 12 rows saved, 16 rows loaded: rows 0..11 come from the checkpoint.
  const Tensor saved = iota({12, 4});
  const auto pieces = source_pieces(saved, 0, 1, 2, 1);
  Tensor dst = Tensor::zeros({8, 4}, DType::f32);  // rows 8..15 of a 16-row tensor
  int64_t n = 0;
  for (const auto& p : pieces)
    n += copy_overlap(p, static_cast<const std::byte*>(p.data.raw_data()), {8, 0}, {8, 4},
                      static_cast<std::byte*>(dst.raw_data()), sizeof(float));
  EXPECT_EQ(n, 16);  // rows 8..11
  const auto v = dst.to_vector<float>();
  EXPECT_EQ(v[0], 32.5f);
  EXPECT_EQ(v[15], 47.5f);
  EXPECT_EQ(v[16], 0.f);
}

TEST(ShardedTensor, JsonRoundTripAndValidation) {
  ShardedTensor t;
  t.key = "decoder.layers.0.mlp.linear_fc1.weight";
  t.dtype = DType::bf16;
  t.global_shape = {8, 4};
  t.global_offset = {4, 0};
  t.local_shape = {2, 4};
  t.flat_begin = 1;
  t.flat_end = 7;
  const ShardedTensor u = ShardedTensor::from_json(t.to_json());
  EXPECT_TRUE(u.same_region(t));
  EXPECT_EQ(u.dtype, DType::bf16);
  auto j = t.to_json();
  j["flat"] = {0, 9};
  EXPECT_THROW(ShardedTensor::from_json(j), Error);
  EXPECT_THROW(partition_boxes({8, 4}, Partition{1, 2, 0, 2}), Error);  // stride 2 on dim 1
}

}  // namespace
}  // namespace mg::dist_checkpointing
