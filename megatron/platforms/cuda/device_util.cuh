// Device-side helpers of the CUDA kernels: runtime-dtype element access (dtype_math.h), grid-stride
// indexing, and deterministic block reductions.
//
// Invariants: reductions combine warp partials in a fixed order, so a kernel's result does not
// depend on scheduling; blockDim.x is a multiple of 32 and at most 1024. Every kernel reads its
// tensors through dmath::load<C> / dmath::store<C>, so one instantiation per compute type (float
// or double) serves every storage dtype. Not here: host code, tensor-core paths (not yet).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "megatron/core/tensor/dtype_math.h"

namespace mg::platforms::cuda {

using dmath::load;
using dmath::load_index;
using dmath::store;

// Eight consecutive bf16 / f16 elements [i, i + 8) of p (16-byte aligned, i a multiple of 8) as
// one 16-byte access, widened to f32 / rounded from f32 exactly as load<float> / store<float> do
// (the vector kernels' element access: the same bits as the scalar kernels).
// The 16 bytes of 8 bf16/f16 values at element i (16-byte aligned), undecoded: lets a kernel issue
// the load early and decode it later with unpack8_half.
__device__ __forceinline__ uint4 load8_raw(const void* p, int64_t i) {
  return *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + i);
}
__device__ __forceinline__ void unpack8_half(const uint4& raw, bool bf16, float (&o)[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const auto b = static_cast<uint16_t>(w[k / 2] >> (16 * (k % 2)));
    o[k] = bf16 ? dmath::bf16_to_f32(b) : dmath::f16_to_f32(b);
  }
}
__device__ __forceinline__ void load8_half(const void* p, int64_t i, bool bf16, float (&o)[8]) {
  unpack8_half(load8_raw(p, i), bf16, o);
}
__device__ __forceinline__ void store8_half(void* p, int64_t i, bool bf16, const float (&v)[8]) {
  uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t b = bf16 ? dmath::f32_to_bf16(v[k]) : dmath::f32_to_f16(v[k]);
    w[k / 2] |= b << (16 * (k % 2));
  }
  *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p) + i) = make_uint4(w[0], w[1], w[2], w[3]);
}
// Whether p is 16-byte aligned (a uint4 / float4 access).
inline bool aligned_16_bytes(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}
// Whether a tensor's data serves load8_half / store8_half.
inline bool aligned_for_8_halves(const void* p) {
  return aligned_16_bytes(p);
}

// Records a bad input value in the deferred-error record (cuda_common.h DeferredError; this
// header cannot include it, so the record's layout is restated by the static_assert there): the
// first caller wins, the host throws it after its next synchronisation.
template <typename Record>
__device__ __forceinline__ void record_deferred_error(Record* e, int32_t op, int64_t row,
                                                      int64_t value, int64_t limit) {
  if (atomicCAS(&e->state, 0, 1) != 0) return;
  e->op = op;
  e->row = row;
  e->value = value;
  e->limit = limit;
  __threadfence_system();
  atomicExch(&e->state, 2);
}

// Row index of a one-block-per-row kernel launched with grid_rows().
__device__ __forceinline__ int64_t block_row() {
  return static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
}

__device__ __forceinline__ int64_t grid_start() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  // NaN-propagating is not needed here: inputs are finite or -inf in every caller.
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a > b ? a : b;
  }
};

// Reduces v over the block; every thread gets the result. Safe to call repeatedly in one kernel.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op) {
  __shared__ T partial[32];
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int nwarps = static_cast<int>((blockDim.x + 31u) >> 5);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // a previous call may still be reading `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T r = partial[0];
  for (int w = 1; w < nwarps; ++w) r = op(r, partial[w]);
  return r;
}

template <typename T>
__device__ __forceinline__ T block_sum(T v) {
  return block_reduce(v, SumOp{});
}
template <typename T>
__device__ __forceinline__ T block_max(T v) {
  return block_reduce(v, MaxOp{});
}

// Math in the compute type: the float versions for float (accurate, not the __expf intrinsics;
// the build has no fast-math), the double versions for double.
__device__ __forceinline__ float exp_c(float x) {
  return expf(x);
}
__device__ __forceinline__ double exp_c(double x) {
  return exp(x);
}
__device__ __forceinline__ float log_c(float x) {
  return logf(x);
}
__device__ __forceinline__ double log_c(double x) {
  return log(x);
}
__device__ __forceinline__ float tanh_c(float x) {
  return tanhf(x);
}
__device__ __forceinline__ double tanh_c(double x) {
  return tanh(x);
}
__device__ __forceinline__ float erf_c(float x) {
  return erff(x);
}
__device__ __forceinline__ double erf_c(double x) {
  return erf(x);
}
__device__ __forceinline__ float sqrt_c(float x) {
  return sqrtf(x);
}
__device__ __forceinline__ double sqrt_c(double x) {
  return sqrt(x);
}
__device__ __forceinline__ float rsqrt_c(float x) {
  return 1.0f / sqrtf(x);
}
__device__ __forceinline__ double rsqrt_c(double x) {
  return 1.0 / sqrt(x);
}
__device__ __forceinline__ bool isfinite_c(float x) {
  return isfinite(x);
}
__device__ __forceinline__ bool isfinite_c(double x) {
  return isfinite(x);
}

template <typename C>
__device__ __forceinline__ C neg_inf() {
  return -static_cast<C>(INFINITY);
}

}  // namespace mg::platforms::cuda
