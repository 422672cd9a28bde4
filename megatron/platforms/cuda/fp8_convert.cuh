// The FP8 conversions of the CUDA kernels that write FP8 (fp8.cu's casts, norm.cu's fused
// norm-cast; docs/fp8.md): one definition, so every kernel writes the same bytes for the same f32
// value.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "megatron/core/tensor/dtype_math.h"

namespace mg::platforms::cuda::fp8cvt {

// The saturating RNE cast of the vector kernel: on sm_89+ the hardware conversion
// (cvt.rn.satfinite, through cuda_fp8.h), which rounds and saturates finite values and Inf as
// dtype_math.h's encoder does; NaN keeps dtype_math.h's encoding (the hardware's differs), as does
// every value on older targets.
__device__ __forceinline__ uint32_t to_fp8_saturating(float v, bool e4m3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (v == v)
    return static_cast<uint32_t>(
        __nv_cvt_float_to_fp8(v, __NV_SATFINITE, e4m3 ? __NV_E4M3 : __NV_E5M2));
#endif
  return e4m3 ? dmath::f32_to_e4m3(v, true) : dmath::f32_to_e5m2(v, true);
}

// Two values at once (v0 in the low byte): the hardware's paired conversion
// (cvt.rn.satfinite.e4m3x2 / e5m2x2) when neither is NaN, else to_fp8_saturating each: the same
// bytes either way, in half the conversions.
__device__ __forceinline__ uint32_t to_fp8x2_saturating(float v0, float v1, bool e4m3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (v0 == v0 && v1 == v1)
    return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(make_float2(v0, v1), __NV_SATFINITE,
                                                          e4m3 ? __NV_E4M3 : __NV_E5M2));
#endif
  return to_fp8_saturating(v0, e4m3) | (to_fp8_saturating(v1, e4m3) << 8);
}

// max(m, a) that takes a NaN (the amax of a tensor with a NaN is NaN, as the CPU's).
__device__ __forceinline__ float nan_max(float m, float a) {
  return (a > m || a != a) ? a : m;
}

}  // namespace mg::platforms::cuda::fp8cvt
