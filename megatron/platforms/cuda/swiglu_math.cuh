// SwiGLU's per-element math in f32, shared by the activation kernels (activation.cu) and the FP8
// casts fused with them (fp8.cu), so both compute the same expressions and so the same bits.
//   y = silu(a) u = a s u, s = sigmoid(a);  d gate = dy u s (1 + a (1 - s)), d up = dy a s
// (megatron/platforms/cpu/activation.cpp has the same formulas.)
#pragma once

#include "megatron/platforms/cuda/device_util.cuh"

namespace mg::platforms::cuda {

template <typename C>
__device__ __forceinline__ C sigmoid(C x) {
  return C(1) / (C(1) + exp_c(-x));
}

template <typename C>
__device__ __forceinline__ C swiglu_value(C a, C u) {
  return a * sigmoid(a) * u;
}

// d gate and d up of one element pair.
template <typename C>
__device__ __forceinline__ void swiglu_grads(C d, C a, C u, C& dgate, C& dup) {
  const C s = sigmoid(a);
  dgate = d * u * s * (C(1) + a * (C(1) - s));
  dup = d * a * s;
}

}  // namespace mg::platforms::cuda
