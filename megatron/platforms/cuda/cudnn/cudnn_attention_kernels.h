// The small device kernels of the cuDNN fused-attention provider (cudnn_attention_kernels.cu; the
// provider is cudnn_attention.cpp): the dropout seed/offset scalars cuDNN reads from device memory,
// and the packed-document (cu_seqlens) plumbing: the per-sequence lengths and ragged offsets that
// describe Megatron's sbhd tensors as B*D variable-length sequences, and the moves of the softmax
// statistics between cuDNN's padded [B*D, NH, S] layout and our lse [B, NH, S]. Every launcher
// runs on `stream` (the caller passes current_stream(device), with the device current).
//
// Sequence n = d*B + b is document d of batch row b: tokens [cu[d], cu[d+1]) of that row. Invalid
// cu_seqlens (not starting at 0, not ending at S, not monotone) are recorded as a deferred error
// (cuda_common.h, kDeferredCuSeqlens, thrown after the next synchronisation) and clamped so that
// no access leaves the tensors; the results are then meaningless, and the error says why.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mg::platforms::cuda::cudnn {

// *seed_out = seed, *offset_out = offset (cuDNN's Philox dropout inputs, int64 on the device),
// written on `stream` so that every later use on it sees this call's values.
void write_dropout_seed_offset(int64_t* seed_out, int64_t* offset_out, uint64_t seed,
                               uint64_t offset, cudaStream_t stream);

// From cu [D+1] (device i32): seq_len [B*D] i32 = cu[d+1] - cu[d]; ragged offsets [B*D+1] i64 in
// elements of the sbhd tensors: q_off[n] = (cu[d]*B + b) * q_row (q_row = NH*HD: q, out, dout, dq),
// kv_off[n] = (cu[d]*B + b) * kv_row (kv_row = NG*HD: k, v, dk, dv); entry B*D = S*B*row (the end).
void build_ragged(const int32_t* cu, int64_t docs, int64_t b, int64_t s, int64_t q_row,
                  int64_t kv_row, int32_t* seq_len, int64_t* q_off, int64_t* kv_off, int device,
                  cudaStream_t stream);

// stats [B*D, NH, S] (cuDNN's, sequence n = d*B + b, position i within the document) -> lse
// [B, NH, S] (position cu[d] + i): every position of every document is written.
void stats_to_lse(const float* stats, float* lse, const int32_t* cu, int64_t docs, int64_t b,
                  int64_t nh, int64_t s, cudaStream_t stream);
// lse [B, NH, S] -> stats [B*D, NH, S]: positions past a document's length get 0 (never read).
void lse_to_stats(const float* lse, float* stats, const int32_t* cu, int64_t docs, int64_t b,
                  int64_t nh, int64_t s, cudaStream_t stream);

}  // namespace mg::platforms::cuda::cudnn
