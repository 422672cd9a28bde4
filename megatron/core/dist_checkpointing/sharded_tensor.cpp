// Sharded tensor description, TP boxes and the overlap copy (sharded_tensor.h).
#include "megatron/core/dist_checkpointing/sharded_tensor.h"

#include <algorithm>
#include <cstring>

#include "megatron/core/common/error.h"
#include "megatron/core/dist_checkpointing/safetensors.h"

namespace mg::dist_checkpointing {

bool ShardedTensor::same_region(const ShardedTensor& o) const {
  return key == o.key && global_offset == o.global_offset && local_shape == o.local_shape &&
         flat_begin == o.flat_begin && flat_end == o.flat_end;
}

nlohmann::json ShardedTensor::to_json() const {
  return {{"key", key},
          {"dtype", safetensors_dtype(dtype)},
          {"global_shape", global_shape},
          {"offset", global_offset},
          {"shape", local_shape},
          {"flat", {flat_begin, flat_end}}};
}

ShardedTensor ShardedTensor::from_json(const nlohmann::json& j) {
  ShardedTensor t;
  t.key = j.at("key").get<std::string>();
  t.dtype = dtype_from_safetensors(j.at("dtype").get<std::string>());
  t.global_shape = j.at("global_shape").get<Shape>();
  t.global_offset = j.at("offset").get<Shape>();
  t.local_shape = j.at("shape").get<Shape>();
  t.flat_begin = j.at("flat").at(0).get<int64_t>();
  t.flat_end = j.at("flat").at(1).get<int64_t>();
  MG_CHECK(t.global_offset.size() == t.local_shape.size() &&
               t.global_shape.size() == t.local_shape.size(),
           "sharded tensor '" << t.key << "': offset " << shape_str(t.global_offset) << ", shape "
                              << shape_str(t.local_shape) << " and global shape "
                              << shape_str(t.global_shape) << " differ in rank");
  MG_CHECK(
      0 <= t.flat_begin && t.flat_begin <= t.flat_end && t.flat_end <= shape_numel(t.local_shape),
      "sharded tensor '" << t.key << "': flat range [" << t.flat_begin << ", " << t.flat_end
                         << ") outside its box " << shape_str(t.local_shape));
  return t;
}

std::vector<Box> partition_boxes(const Shape& global_shape,
                                 const tensor_parallel::Partition& part) {
  const Shape local = tensor_parallel::local_shape(global_shape, part);
  if (part.replicated()) return {Box{Shape(global_shape.size(), 0), global_shape, 0}};
  MG_CHECK(part.stride == 1 || part.dim == 0, "sharded checkpoints: partition_stride "
                                                  << part.stride << " on dim " << part.dim
                                                  << " is not supported (only dim 0)");
  const int64_t d = global_shape[part.dim];
  const int64_t block = d / part.stride, len = block / part.size;
  std::vector<Box> boxes;
  Shape shape = local;
  shape[part.dim] = len;
  for (int64_t k = 0; k < part.stride; ++k) {
    Box b;
    b.offset = Shape(global_shape.size(), 0);
    b.offset[part.dim] = k * block + part.rank * len;
    b.shape = shape;
    b.local_start = k * shape_numel(shape);  // dim 0: boxes follow each other in the shard
    boxes.push_back(b);
  }
  return boxes;
}

int64_t box_overlap(const Shape& a_offset, const Shape& a_shape, const Shape& b_offset,
                    const Shape& b_shape) {
  int64_t n = 1;
  for (std::size_t i = 0; i < a_shape.size(); ++i) {
    const int64_t lo = std::max(a_offset[i], b_offset[i]);
    const int64_t hi = std::min(a_offset[i] + a_shape[i], b_offset[i] + b_shape[i]);
    if (hi <= lo) return 0;
    n *= hi - lo;
  }
  return n;
}

int64_t copy_overlap(const ShardedTensor& src, const std::byte* src_data, const Shape& dst_offset,
                     const Shape& dst_shape, std::byte* dst, std::size_t elem_size) {
  Shape so = src.global_offset, ss = src.local_shape, dof = dst_offset, ds = dst_shape;
  if (ss.empty()) so = {0}, ss = {1};
  if (ds.empty()) dof = {0}, ds = {1};
  MG_CHECK(ss.size() == ds.size(), "sharded tensor '" << src.key << "': stored box "
                                                      << shape_str(ss) << " and destination "
                                                      << shape_str(ds) << " differ in rank");
  const std::size_t n = ss.size();
  if (n == 0) return 0;  // never (empty shapes are {1} above); tells GCC 12 n - 1 cannot wrap
  Shape lo(n), hi(n);
  for (std::size_t i = 0; i < n; ++i) {
    lo[i] = std::max(so[i], dof[i]);
    hi[i] = std::min(so[i] + ss[i], dof[i] + ds[i]);
    if (hi[i] <= lo[i]) return 0;
  }
  // Row-major strides (elements) of both boxes.
  Shape sst(n, 1), dst_st(n, 1);
  for (std::size_t i = n - 1; i-- > 0;) {
    sst[i] = sst[i + 1] * ss[i + 1];
    dst_st[i] = dst_st[i + 1] * ds[i + 1];
  }
  const std::size_t last = n - 1;
  int64_t copied = 0;
  Shape idx(lo.begin(), lo.end());  // odometer over the leading dims of the intersection
  while (true) {
    int64_t srow = 0, drow = 0;
    for (std::size_t i = 0; i < last; ++i) {
      srow += (idx[i] - so[i]) * sst[i];
      drow += (idx[i] - dof[i]) * dst_st[i];
    }
    // Source-local flat range of this row's intersection, clipped to the stored flat range.
    const int64_t f0 = std::max(srow + lo[last] - so[last], src.flat_begin);
    const int64_t f1 = std::min(srow + hi[last] - so[last], src.flat_end);
    if (f0 < f1) {
      const int64_t gcol = so[last] + (f0 - srow);
      std::memcpy(dst + static_cast<std::size_t>(drow + gcol - dof[last]) * elem_size,
                  src_data + static_cast<std::size_t>(f0 - src.flat_begin) * elem_size,
                  static_cast<std::size_t>(f1 - f0) * elem_size);
      copied += f1 - f0;
    }
    // Next leading index.
    std::size_t i = last;
    while (i > 0) {
      --i;
      if (++idx[i] < hi[i]) break;
      idx[i] = lo[i];
      if (i == 0) return copied;
    }
    if (last == 0) return copied;
  }
}

}  // namespace mg::dist_checkpointing
