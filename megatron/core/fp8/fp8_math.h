// The FP8 scaling update of one slot, shared by the host (Fp8State's reference, the CPU kernel) and
// the CUDA kernel so both compute the same f32 values bit for bit (ops::Fp8ScaleUpdateArgs,
// docs/fp8.md). Every division is IEEE round-to-nearest (__fdiv_rn on the device).
#pragma once

#include <cmath>
#include <cstdint>

#include "megatron/core/tensor/dtype_math.h"  // MG_HOST_DEVICE

namespace mg::fp8::math {

constexpr float kF32Max = 3.40282347e+38f;

MG_HOST_DEVICE float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

MG_HOST_DEVICE bool finite(float x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

MG_HOST_DEVICE bool is_inf(float x) {
#if defined(__CUDA_ARCH__)
  return isinf(x);
#else
  return std::isinf(x);
#endif
}

// Slot j of history [len, slots] (row-major), scale and scale_inv [slots], in place. pow2 =
// 2^margin. Delayed: amax from the history (max over rows, NaN wins as in torch.max, or row 0),
// the column rolled (row i takes row i + 1, the last row the old row 0, row 0 zeroed: TE's
// torch.roll(-1) then [0] = 0), scale = (fp8_max / amax) / pow2 kept when amax is 0 or not
// finite. Current: scale = fp8_max / amax from row 0, 1 when amax is 0 or not finite, no roll.
// Both: the f32 maximum when the quotient overflows; scale_inv = 1 / scale.
MG_HOST_DEVICE void scale_update_slot(float* history, float* scale, float* scale_inv, int64_t len,
                                      int64_t slots, int64_t j, float fp8_max, float pow2,
                                      bool max_history, bool current) {
  const float first = history[j];
  float amax = first;
  if (max_history && !current)
    for (int64_t i = 1; i < len; ++i) {
      const float h = history[i * slots + j];
      if (h > amax || h != h) amax = h;
    }
  const bool usable = amax > 0.0f && finite(amax);
  float sf;
  if (current) {
    sf = usable ? div_rn(fp8_max, amax) : 1.0f;
  } else {
    for (int64_t i = 1; i + 1 < len; ++i) history[i * slots + j] = history[(i + 1) * slots + j];
    if (len > 1) history[(len - 1) * slots + j] = first;
    history[j] = 0.0f;
    sf = usable ? div_rn(div_rn(fp8_max, amax), pow2) : scale[j];
  }
  if (is_inf(sf)) sf = kF32Max;
  scale[j] = sf;
  scale_inv[j] = div_rn(1.0f, sf);
}

}  // namespace mg::fp8::math
