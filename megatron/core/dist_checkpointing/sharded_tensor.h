// Sharded tensors: the layout-independent description of one rank's part of a checkpointed tensor
// (Megatron-Core's dist_checkpointing.ShardedTensor), and the overlap arithmetic that lets a rank
// of ANY parallel layout read exactly the regions it needs from pieces written by another layout.
//
// A ShardedTensor piece is (key, dtype, global shape, box, flat range):
//   - key: the tensor's layout-independent name (Megatron-Core's parameter name, FORMATS.md §6,
//     "optimizer.state.exp_avg.<param>" for optimizer state);
//   - box: global_offset + local_shape, a rectangular region of the full tensor in global
//     coordinates (a tensor-parallel shard is one box; a stride-2 partition such as SwiGLU's
//     [gate; up] linear_fc1 is two boxes, one in each half);
//   - flat range [flat_begin, flat_end) of the box's row-major elements (the whole box for model
//     weights; a distributed-optimizer shard covers part of a box);
//   - replica_id: 0 for the main replica (the one that writes), > 0 for identical copies.
// Stored data is the piece's elements in row-major box order (flat_end - flat_begin of them).
//
// copy_overlap copies the intersection of a stored piece and a destination box (both in global
// coordinates, so global shapes may differ, e.g. padded vocabularies of different TP sizes) and
// returns the number of elements copied; summing it over the (disjoint) stored pieces of a key
// tells whether the destination was covered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatron/core/tensor/tensor.h"
#include "megatron/core/tensor_parallel/sharding.h"

namespace mg::dist_checkpointing {

struct ShardedTensor {
  std::string key;
  DType dtype = DType::f32;
  Shape global_shape;
  Shape global_offset;                   // the box's offset in the full tensor (one entry per dim)
  Shape local_shape;                     // the box's shape
  int64_t flat_begin = 0, flat_end = 0;  // row-major element range of the box
  int replica_id = 0;
  Tensor data;  // save: the piece's elements (contiguous, flat_end - flat_begin of them)

  int64_t numel() const { return flat_end - flat_begin; }
  bool whole_box() const { return flat_begin == 0 && flat_end == shape_numel(local_shape); }
  // Same region of the same key (replicas of each other).
  bool same_region(const ShardedTensor& o) const;
  nlohmann::json to_json() const;  // without data / replica id
  static ShardedTensor from_json(const nlohmann::json& j);
};

// A tensor-parallel shard's boxes: (global offset, shape, element offset in the local shard).
// One box when replicated or for stride 1; `stride` boxes for a dim-0 stride-s partition (the
// local shard is their concatenation). Throws for stride > 1 on another dim (not supported).
struct Box {
  Shape offset, shape;
  int64_t local_start = 0;  // element offset of the box in the local (row-major) shard
};
std::vector<Box> partition_boxes(const Shape& global_shape, const tensor_parallel::Partition& part);

// Copies the part of stored piece `src` (its elements at `src_data`, elem_size bytes each) that
// falls inside the destination box (dst_offset, dst_shape; row-major at `dst`). Returns the number
// of elements copied. Shapes must have the same number of dims (0-d tensors count as [1]).
int64_t copy_overlap(const ShardedTensor& src, const std::byte* src_data, const Shape& dst_offset,
                     const Shape& dst_shape, std::byte* dst, std::size_t elem_size);

// Elements of the intersection of two boxes (0 when disjoint).
int64_t box_overlap(const Shape& a_offset, const Shape& a_shape, const Shape& b_offset,
                    const Shape& b_shape);

}  // namespace mg::dist_checkpointing
