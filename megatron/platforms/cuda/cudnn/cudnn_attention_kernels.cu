// The device kernels of the cuDNN fused-attention provider (see cudnn_attention_kernels.h): the
// dropout seed/offset scalars, the ragged offsets and lengths of packed documents, and the moves
// of the softmax statistics between cuDNN's padded layout and our lse. All tiny next to the
// attention itself (O(B*D) and O(B*NH*S) elements, one pass each).
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cudnn/cudnn_attention_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"

namespace mg::platforms::cuda::cudnn {
namespace {

__global__ void seed_offset_kernel(int64_t* seed_out, int64_t* offset_out, int64_t seed,
                                   int64_t offset) {
  *seed_out = seed;
  *offset_out = offset;
}

// Document d's token range [lo, hi) clamped into [0, S] (so that invalid cu_seqlens, recorded by
// ragged_kernel, cannot send an access outside the tensors).
__device__ __forceinline__ void doc_range(const int32_t* cu, int64_t d, int64_t s, int64_t* lo,
                                          int64_t* hi) {
  const int64_t a = min(max(static_cast<int64_t>(cu[d]), int64_t{0}), s);
  *lo = a;
  *hi = min(max(static_cast<int64_t>(cu[d + 1]), a), s);
}

__global__ void ragged_kernel(const int32_t* cu, int64_t docs, int64_t b, int64_t s, int64_t q_row,
                              int64_t kv_row, int32_t* seq_len, int64_t* q_off, int64_t* kv_off,
                              DeferredError* err) {
  const int64_t n_seq = docs * b;
  for (int64_t n = grid_start(); n <= n_seq; n += grid_stride()) {
    if (n <= docs) {  // entry n of cu_seqlens: the contract of op_args.h
      const int64_t c = cu[n];
      const bool bad = (n == 0 && c != 0) || (n == docs && c != s) ||
                       (n > 0 && c < static_cast<int64_t>(cu[n - 1])) || c < 0 || c > s;
      if (bad) record_deferred_error(err, kDeferredCuSeqlens, n, c, s);
    }
    if (n == n_seq) {
      q_off[n] = s * b * q_row;
      kv_off[n] = s * b * kv_row;
      continue;
    }
    const int64_t d = n / b, row = n % b;
    int64_t lo, hi;
    doc_range(cu, d, s, &lo, &hi);
    seq_len[n] = static_cast<int32_t>(hi - lo);
    q_off[n] = (lo * b + row) * q_row;
    kv_off[n] = (lo * b + row) * kv_row;
  }
}

// The document of token t: the last d with cu[d] <= t (zero-length documents skipped), in [0, D).
__device__ __forceinline__ int64_t doc_of(const int32_t* cu, int64_t docs, int64_t t) {
  int64_t lo = 0, hi = docs;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (static_cast<int64_t>(cu[mid]) <= t)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

__global__ void stats_to_lse_kernel(const float* stats, float* lse, const int32_t* cu, int64_t docs,
                                    int64_t b, int64_t nh, int64_t s) {
  const int64_t total = b * nh * s;
  for (int64_t e = grid_start(); e < total; e += grid_stride()) {
    const int64_t t = e % s, bh = e / s, h = bh % nh, row = bh / nh;
    const int64_t d = doc_of(cu, docs, t);
    int64_t lo, hi;
    doc_range(cu, d, s, &lo, &hi);
    const int64_t i = min(max(t - lo, int64_t{0}), s - 1);
    lse[e] = stats[((d * b + row) * nh + h) * s + i];
  }
}

__global__ void lse_to_stats_kernel(const float* lse, float* stats, const int32_t* cu, int64_t docs,
                                    int64_t b, int64_t nh, int64_t s) {
  const int64_t total = docs * b * nh * s;
  for (int64_t e = grid_start(); e < total; e += grid_stride()) {
    const int64_t i = e % s, nhh = e / s, h = nhh % nh, n = nhh / nh;
    const int64_t d = n / b, row = n % b;
    int64_t lo, hi;
    doc_range(cu, d, s, &lo, &hi);
    stats[e] = i < hi - lo ? lse[(row * nh + h) * s + lo + i] : 0.0f;
  }
}

}  // namespace

void write_dropout_seed_offset(int64_t* seed_out, int64_t* offset_out, uint64_t seed,
                               uint64_t offset, cudaStream_t stream) {
  seed_offset_kernel<<<1, 1, 0, stream>>>(seed_out, offset_out, static_cast<int64_t>(seed),
                                          static_cast<int64_t>(offset));
  MG_CUDA_CHECK_LAUNCH();
}

void build_ragged(const int32_t* cu, int64_t docs, int64_t b, int64_t s, int64_t q_row,
                  int64_t kv_row, int32_t* seq_len, int64_t* q_off, int64_t* kv_off, int device,
                  cudaStream_t stream) {
  ragged_kernel<<<grid_for(docs * b + 1), kThreads, 0, stream>>>(
      cu, docs, b, s, q_row, kv_row, seq_len, q_off, kv_off, deferred_error_record(device));
  MG_CUDA_CHECK_LAUNCH();
}

void stats_to_lse(const float* stats, float* lse, const int32_t* cu, int64_t docs, int64_t b,
                  int64_t nh, int64_t s, cudaStream_t stream) {
  stats_to_lse_kernel<<<grid_for(b * nh * s), kThreads, 0, stream>>>(stats, lse, cu, docs, b, nh,
                                                                     s);
  MG_CUDA_CHECK_LAUNCH();
}

void lse_to_stats(const float* lse, float* stats, const int32_t* cu, int64_t docs, int64_t b,
                  int64_t nh, int64_t s, cudaStream_t stream) {
  lse_to_stats_kernel<<<grid_for(docs * b * nh * s), kThreads, 0, stream>>>(lse, stats, cu, docs, b,
                                                                            nh, s);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg::platforms::cuda::cudnn
