// Element types: the DType enum, the 16- and 8-bit float storage types and their conversions.
//
// Conversions to the narrow float types round to nearest, ties to even, and treat NaN, Inf, signed
// zero and subnormals as IEEE 754 / the OCP 8-bit float spec do, matching PyTorch's casts:
//   bf16      NaN -> 0x7FC0 (sign dropped, as c10::BFloat16 does); overflow -> Inf by rounding.
//   f16       NaN -> sign|0x7E00; |x| >= 65520 -> Inf.
//   fp8 e4m3  OCP "fn": no Inf, one NaN per sign (S.1111.111), max 448. Non-saturating (PyTorch
//             .to(float8_e4m3fn)): Inf and anything that rounds above 448 -> NaN.
//   fp8 e5m2  IEEE-like: Inf exists, max 57344; rounds past the max to Inf; NaN -> sign|0x7F.
// The saturating variants (what FP8 training uses, CUDA's __NV_SATFINITE) clamp finite overflow and
// Inf to +-max and keep NaN. Conversions from f64 go through f32, as PyTorch's do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

namespace mg {

enum class DType : uint8_t { f64, f32, bf16, f16, fp8_e4m3, fp8_e5m2, i32, i64, u8 };
inline constexpr int kNumDTypes = 9;

std::size_t dtype_size(DType t);
// Canonical short name: "f64", "f32", "bf16", "f16", "fp8_e4m3", "fp8_e5m2", "i32", "i64", "u8".
std::string_view dtype_name(DType t);
// Accepts the canonical names and the common aliases (float32, fp32, bfloat16, float16, half, ...).
std::optional<DType> parse_dtype(std::string_view name);
bool is_floating(DType t);

// ---- bit-level conversions
// ------------------------------------------------------------------------
uint16_t f32_to_bf16_bits(float f);
float bf16_bits_to_f32(uint16_t b);
uint16_t f32_to_f16_bits(float f);
float f16_bits_to_f32(uint16_t h);
uint8_t f32_to_fp8_e4m3_bits(float f, bool saturate = false);
float fp8_e4m3_bits_to_f32(uint8_t b);
uint8_t f32_to_fp8_e5m2_bits(float f, bool saturate = false);
float fp8_e5m2_bits_to_f32(uint8_t b);

inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr float kFp8E5M2Max = 57344.0f;

// ---- storage types
// -------------------------------------------------------------------------------- Plain 16/8-bit
// containers; arithmetic happens in f32 (to_f32 / from_f32 below).
struct bf16_t {
  uint16_t bits;
  static constexpr bf16_t from_bits(uint16_t b) { return bf16_t{b}; }
};
struct f16_t {
  uint16_t bits;
  static constexpr f16_t from_bits(uint16_t b) { return f16_t{b}; }
};
struct fp8_e4m3_t {
  uint8_t bits;
  static constexpr fp8_e4m3_t from_bits(uint8_t b) { return fp8_e4m3_t{b}; }
};
struct fp8_e5m2_t {
  uint8_t bits;
  static constexpr fp8_e5m2_t from_bits(uint8_t b) { return fp8_e5m2_t{b}; }
};

template <typename T>
struct dtype_of;
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<bf16_t> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<f16_t> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<fp8_e4m3_t> {
  static constexpr DType value = DType::fp8_e4m3;
};
template <>
struct dtype_of<fp8_e5m2_t> {
  static constexpr DType value = DType::fp8_e5m2;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::u8;
};
template <typename T>
inline constexpr DType dtype_v = dtype_of<T>::value;

// bf16 is on every hot path, so its conversions are inline; the rest are out of line.
inline float bf16_to_f32_inline(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16_inline(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                     // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// Widening load and narrowing store used by every kernel: compute type is f32 (or f64 for f64).
inline float to_f32(float x) {
  return x;
}
inline double to_f32(double x) {
  return x;
}  // f64 kernels keep f64 (name kept for templates)
inline float to_f32(bf16_t x) {
  return bf16_to_f32_inline(x.bits);
}
inline float to_f32(f16_t x) {
  return f16_bits_to_f32(x.bits);
}
inline float to_f32(fp8_e4m3_t x) {
  return fp8_e4m3_bits_to_f32(x.bits);
}
inline float to_f32(fp8_e5m2_t x) {
  return fp8_e5m2_bits_to_f32(x.bits);
}

template <typename T>
inline T from_f32(float x);
template <>
inline float from_f32<float>(float x) {
  return x;
}
template <>
inline double from_f32<double>(float x) {
  return x;
}
template <>
inline bf16_t from_f32<bf16_t>(float x) {
  return bf16_t{f32_to_bf16_inline(x)};
}
template <>
inline f16_t from_f32<f16_t>(float x) {
  return f16_t{f32_to_f16_bits(x)};
}
template <>
inline fp8_e4m3_t from_f32<fp8_e4m3_t>(float x) {
  return fp8_e4m3_t{f32_to_fp8_e4m3_bits(x)};
}
template <>
inline fp8_e5m2_t from_f32<fp8_e5m2_t>(float x) {
  return fp8_e5m2_t{f32_to_fp8_e5m2_bits(x)};
}

// The compute type of a storage type: double for f64, float for everything else.
template <typename T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Store a compute-type value into storage type T (f64 stays f64).
template <typename T>
inline T store(compute_t<T> x) {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return from_f32<T>(x);
}

// Bulk conversion between any two dtypes on the host (used by Tensor::to and the CPU platform).
// Float -> integer truncates toward zero (NaN -> 0); out of range it gives x86-64's (PyTorch CPU's)
// result, defined here rather than left undefined: INT_MIN for i32/i64, and u8 is the low 8 bits of
// the i32 result (-1.0 -> 255). Integer -> integer wraps (C++20 static_cast, as torch's .to()).
// Integer -> float rounds once to f32 (once to f64 for f64), then as the casts above.
void convert_host(void* dst, DType dst_type, const void* src, DType src_type, std::size_t n);

}  // namespace mg
