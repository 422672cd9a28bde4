// Bucket layout over the flat gradient buffer (param_and_grad_buffer.h).
#include "megatron/core/distributed/param_and_grad_buffer.h"

#include <algorithm>

#include "megatron/core/common/error.h"

namespace mg::distributed {

std::pair<int64_t, int64_t> GradBucket::shard_range(int rank) const {
  const int64_t lo = std::min(end, start + rank * shard_size);
  const int64_t hi = std::min(end, lo + shard_size);
  return {lo, hi};
}

std::vector<GradBucket> build_buckets(const std::vector<transformer::Parameter>& params,
                                      int64_t buffer_numel, int64_t bucket_size, int dp,
                                      bool shard_over_dp, int64_t range_start, int64_t range_end) {
  MG_CHECK(dp >= 1, "build_buckets: data-parallel size must be >= 1, got " << dp);
  MG_CHECK(buffer_numel >= 0, "build_buckets: buffer of " << buffer_numel << " elements");
  // Parameter end offsets in buffer order: the candidate bucket ends.
  std::vector<int64_t> ends;
  for (const auto& p : params) {
    const int64_t e = p.buffer_offset + p.param.numel();
    MG_CHECK(p.buffer_offset >= 0 && e <= buffer_numel,
             "build_buckets: parameter '" << p.name << "' [" << p.buffer_offset << ", " << e
                                          << ") lies outside the buffer of " << buffer_numel
                                          << " elements");
    ends.push_back(e);
  }
  std::sort(ends.begin(), ends.end());
  std::vector<GradBucket> buckets;
  const int64_t limit = range_end < 0 ? buffer_numel : range_end;
  int64_t start = range_start;
  while (start < limit) {
    int64_t end = limit;
    if (bucket_size > 0) {
      // The first parameter end that makes the bucket hold >= bucket_size elements.
      auto it = std::lower_bound(ends.begin(), ends.end(), start + bucket_size);
      if (it != ends.end()) end = *it;
      end = std::min(end, limit);
      if (shard_over_dp) end = std::min(limit, start + (end - start + dp - 1) / dp * dp);
    }
    GradBucket b;
    b.start = start;
    b.end = end;
    b.shard_size = (end - start + dp - 1) / dp;
    buckets.push_back(b);
    start = end;
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    const int64_t lo = params[i].buffer_offset, hi = lo + params[i].param.numel();
    if (lo == hi) continue;
    for (auto& b : buckets)
      if (lo < b.end && hi > b.start) b.params.push_back(i);
  }
  return buckets;
}

}  // namespace mg::distributed
