// Buckets over the model's flat gradient buffer (Megatron-Core's _ParamAndGradBuffer bucketing,
// megatron/core/distributed/param_and_grad_buffer.py), for DDP's reductions and the distributed
// optimizer's shards.
//
// The model lays its parameters out in REVERSE order of first use (transformer/parameter.h), so
// walking the buffer front to back follows backward: a bucket is a contiguous element range
// [start, end), filled with whole parameters until it holds at least bucket_size elements.
// Buckets tile the whole buffer. Under the distributed optimizer each bucket is cut into dp equal
// chunks of shard_size = ceil(numel / dp) elements, chunk r belonging to dp rank r: a bucket's end
// is then rounded up to a multiple of dp (it may end inside a parameter, which then belongs to
// both buckets), so only the buffer's last bucket can need padding (zeros, in a staging tensor,
// never in the model's buffer) for the reduce-scatter and all-gather.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "megatron/core/transformer/parameter.h"

namespace mg::distributed {

struct GradBucket {
  int64_t start = 0;       // first element in the flat buffers
  int64_t end = 0;         // one past the last
  int64_t shard_size = 0;  // ceil((end - start) / dp): each rank's chunk (distributed optimizer)
  std::vector<std::size_t> params;  // indices (into the Parameter vector) of params overlapping it
  // Holds expert parameters only (Parameter::is_expert), reduced over the expert-data-parallel
  // group (DistributedDataParallel with an expert group).
  bool expert = false;
  // Holds FP8 parameters only (--fp8-param-gather, fp8::ParamRun): its parameter all-gather moves
  // their FP8 bytes, not the model-dtype values.
  bool fp8 = false;

  int64_t numel() const { return end - start; }
  // Padded length dp * shard_size (>= numel()).
  int64_t padded_numel(int dp) const { return shard_size * dp; }
  // dp rank r's chunk, clipped to the bucket: [start + r*shard_size, min(.., end)) (may be empty).
  std::pair<int64_t, int64_t> shard_range(int rank) const;
};

// Buckets for `params` over a buffer of `buffer_numel` elements. bucket_size <= 0: one bucket.
// shard_over_dp: the distributed optimizer's rounding of bucket ends to multiples of dp.
// [range_start, range_end) (range_end < 0: the buffer's end): tile only that range (expert and
// dense runs of the buffer are bucketed apart).
std::vector<GradBucket> build_buckets(const std::vector<transformer::Parameter>& params,
                                      int64_t buffer_numel, int64_t bucket_size, int dp,
                                      bool shard_over_dp, int64_t range_start = 0,
                                      int64_t range_end = -1);

}  // namespace mg::distributed
