// f32 lanes as GCC vector extensions and the vectorised e^x the CPU kernels share (attention's
// softmax, cross entropy, the tanh GELU).
//
// Invariants: kLanes is 8 with AVX, else 4, so no function passes a vector wider than the target's
// registers. exp_v is Cephes' expf (x = n ln2 + r, |r| <= ln2/2, degree-7 polynomial; about 1 ulp);
// below -87 (-inf included) it gives 0, above 88 it saturates at e^88; NaN stays NaN. Every
// function here is lane-wise: a lane's result depends on that lane's input only, so results do not
// depend on alignment, on where a loop's vector part ends, or on the thread count.
// Written on vector types because the scalar loops would not vectorise (-ftrapping-math keeps GCC
// from turning the range checks into selects).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace mg::platforms::cpu::vec {

#ifdef __AVX__
inline constexpr int64_t kLanes = 8;
#else
inline constexpr int64_t kLanes = 4;
#endif
using FV = float __attribute__((vector_size(4 * kLanes)));
using IV = int32_t __attribute__((vector_size(4 * kLanes)));

inline FV load_v(const float* p) {
  FV v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_v(float* p, FV v) {
  std::memcpy(p, &v, sizeof v);
}

// The n < kLanes elements of x as a vector, fill in the lanes past the end.
inline FV partial_v(const float* x, int64_t n, float fill) {
  float buf[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) buf[l] = l < n ? x[l] : fill;
  return load_v(buf);
}
inline void store_partial_v(float* p, FV v, int64_t n) {
  for (int64_t l = 0; l < n; ++l) p[l] = v[l];
}

// e^x lane-wise (see the header comment).
inline FV exp_v(FV x) {
  const IV keep = ~(x < -87.0f);  // all ones unless the result underflows
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const FV t = x * 1.44269504088896341f + kRound;
  const FV n = t - kRound;
  FV r = x - n * 0.693359375f;  // ln2 in two parts, so n ln2 loses nothing
  r = r - n * -2.12194440e-4f;
  FV p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const FV y = p * r * r + r + 1.0f;
  const IV ni = std::bit_cast<IV>(t) - std::bit_cast<int32_t>(kRound);
  const IV two_n = (ni + 127) << 23;
  const IV v = std::bit_cast<IV>(y * std::bit_cast<FV>(two_n)) & keep;
  return std::bit_cast<FV>(v);
}

// Sum of the lanes in lane order (a fixed order: the result depends on the lanes only).
inline float lane_sum(FV v) {
  float s = v[0];
  for (int64_t l = 1; l < kLanes; ++l) s += v[l];
  return s;
}
inline float lane_max(FV v) {
  float m = v[0];
  for (int64_t l = 1; l < kLanes; ++l) m = v[l] > m ? v[l] : m;
  return m;
}

}  // namespace mg::platforms::cpu::vec
