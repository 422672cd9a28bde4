// The CPU FP8 kernels' shared element code (fp8.cpp, fp8_attention.cpp): the saturating
// round-to-nearest-even cast of dtype_math.h (CUDA's __NV_SATFINITE conversion; NaN stays NaN),
// the exact decode, and the amax fold in which a NaN wins.
#pragma once

#include <cstdint>

#include "megatron/core/tensor/dtype.h"
#include "megatron/core/tensor/dtype_math.h"

namespace mg::platforms::cpu {

inline float nan_max(float m, float a) {
  return (a > m || a != a) ? a : m;
}

inline uint8_t to_fp8(float v, bool e4m3) {
  return e4m3 ? dmath::f32_to_e4m3(v, true) : dmath::f32_to_e5m2(v, true);
}

inline float from_fp8(uint8_t b, bool e4m3) {
  return e4m3 ? dmath::e4m3_to_f32(b) : dmath::e5m2_to_f32(b);
}

// One FP8 format's cast and decode.
struct Fp8Codec {
  bool e4m3;
  explicit Fp8Codec(DType t) : e4m3(t == DType::fp8_e4m3) {}
  double decode(uint8_t b) const { return from_fp8(b, e4m3); }
  uint8_t encode(float v) const { return to_fp8(v, e4m3); }
};

}  // namespace mg::platforms::cpu
