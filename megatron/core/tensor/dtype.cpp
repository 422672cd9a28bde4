// Dtype names and the narrow-float conversions (see dtype.h for the exact semantics).
//
// One generic encoder handles f16, fp8 e4m3fn and fp8 e5m2: it rounds the f32 significand to the
// target's mantissa width with integer round-half-even, in the target's normal or subnormal range,
// then applies that format's overflow rule. Decoding is exact (every narrow value is an f32).
#include "megatron/core/tensor/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "megatron/core/common/error.h"

namespace mg {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64:
      return 8;
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::fp8_e4m3:
      return 1;
    case DType::fp8_e5m2:
      return 1;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
  }
  MG_THROW("invalid dtype " << static_cast<int>(t));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f64:
      return "f64";
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::fp8_e4m3:
      return "fp8_e4m3";
    case DType::fp8_e5m2:
      return "fp8_e5m2";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
  }
  return "invalid";
}

std::optional<DType> parse_dtype(std::string_view n) {
  struct Alias {
    std::string_view name;
    DType type;
  };
  static constexpr Alias kAliases[] = {
      {"f64", DType::f64},
      {"float64", DType::f64},
      {"fp64", DType::f64},
      {"double", DType::f64},
      {"f32", DType::f32},
      {"float32", DType::f32},
      {"fp32", DType::f32},
      {"float", DType::f32},
      {"bf16", DType::bf16},
      {"bfloat16", DType::bf16},
      {"f16", DType::f16},
      {"fp16", DType::f16},
      {"float16", DType::f16},
      {"half", DType::f16},
      {"fp8_e4m3", DType::fp8_e4m3},
      {"e4m3", DType::fp8_e4m3},
      {"float8_e4m3fn", DType::fp8_e4m3},
      {"fp8_e5m2", DType::fp8_e5m2},
      {"e5m2", DType::fp8_e5m2},
      {"float8_e5m2", DType::fp8_e5m2},
      {"i32", DType::i32},
      {"int32", DType::i32},
      {"i64", DType::i64},
      {"int64", DType::i64},
      {"u8", DType::u8},
      {"uint8", DType::u8},
  };
  for (const auto& a : kAliases)
    if (a.name == n) return a.type;
  return std::nullopt;
}

bool is_floating(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::bf16 || t == DType::f16 ||
         t == DType::fp8_e4m3 || t == DType::fp8_e5m2;
}

namespace {

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

struct MiniFloat {
  int ebits;
  int mbits;
  bool ieee;          // true: the top exponent is Inf/NaN. false (e4m3fn): only S.1111.111 is NaN.
  uint32_t nan_bits;  // the canonical NaN, without sign
};
constexpr MiniFloat kF16{5, 10, true, 0x7e00};
constexpr MiniFloat kE5M2{5, 2, true, 0x7f};
constexpr MiniFloat kE4M3{4, 3, false, 0x7f};

constexpr int bias(const MiniFloat& m) {
  return (1 << (m.ebits - 1)) - 1;
}
// Largest finite encoding, without sign.
constexpr uint32_t max_finite_bits(const MiniFloat& m) {
  const uint32_t top = (1u << m.ebits) - 1;
  return m.ieee ? (((top - 1) << m.mbits) | ((1u << m.mbits) - 1))
                : ((top << m.mbits) | ((1u << m.mbits) - 2));
}
constexpr uint32_t inf_bits(const MiniFloat& m) {
  return ((1u << m.ebits) - 1) << m.mbits;
}

uint32_t encode(float f, const MiniFloat& m, bool saturate) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 31) << (m.ebits + m.mbits);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | m.nan_bits;
  const uint32_t overflow = saturate ? max_finite_bits(m) : (m.ieee ? inf_bits(m) : m.nan_bits);
  if (a == 0x7f800000u) return sign | overflow;
  if (a == 0) return sign;

  // a = M * 2^(E - 23) with M < 2^24 (implicit bit included for normals).
  int e = static_cast<int>(a >> 23);
  uint32_t mant = a & 0x7fffffu;
  if (e == 0)
    e = 1;
  else
    mant |= 0x800000u;
  const int exp = e - 127;  // unbiased exponent of the f32 value's quantum scale
  const int emin = 1 - bias(m);
  // Quantum of the target at this magnitude: 2^(max(exp, emin) - mbits). Shift M down to it.
  const int shift = (23 - m.mbits) + (exp < emin ? emin - exp : 0);
  uint32_t n;
  if (shift >= 32) {
    n = 0;  // far below half the smallest subnormal
  } else {
    n = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (n & 1u))) ++n;
  }
  // n is the significand in units of the quantum; exponent field from the quantum's exponent.
  int efield = exp < emin ? 0 : exp + bias(m);
  if (efield == 0) {
    // subnormal range: n < 2^mbits stays subnormal; n == 2^mbits rounded up to the smallest normal
    if (n >= (1u << m.mbits)) efield = 1, n -= (1u << m.mbits);
  } else {
    if (n >= (2u << m.mbits)) ++efield, n >>= 1;  // carry out of the significand
    n -= (1u << m.mbits);
  }
  const uint32_t bits = (static_cast<uint32_t>(efield) << m.mbits) | n;
  if (efield >= (1 << m.ebits) || bits > max_finite_bits(m)) return sign | overflow;
  return sign | bits;
}

float decode(uint32_t b, const MiniFloat& m) {
  const uint32_t sbit = 1u << (m.ebits + m.mbits);
  const bool neg = (b & sbit) != 0;
  const uint32_t a = b & (sbit - 1);
  const uint32_t efield = a >> m.mbits;
  const uint32_t mant = a & ((1u << m.mbits) - 1);
  float v;
  if (m.ieee && efield == (1u << m.ebits) - 1) {
    v = mant == 0 ? std::numeric_limits<float>::infinity()
                  : std::numeric_limits<float>::quiet_NaN();
  } else if (!m.ieee && a == m.nan_bits) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (efield == 0) {
    v = std::ldexp(static_cast<float>(mant), 1 - bias(m) - m.mbits);
  } else {
    v = std::ldexp(static_cast<float>(mant | (1u << m.mbits)),
                   static_cast<int>(efield) - bias(m) - m.mbits);
  }
  return neg ? -v : v;
}

}  // namespace

uint16_t f32_to_bf16_bits(float f) {
  return f32_to_bf16_inline(f);
}
float bf16_bits_to_f32(uint16_t b) {
  return bf16_to_f32_inline(b);
}
uint16_t f32_to_f16_bits(float f) {
  return static_cast<uint16_t>(encode(f, kF16, false));
}
float f16_bits_to_f32(uint16_t h) {
  return decode(h, kF16);
}
uint8_t f32_to_fp8_e4m3_bits(float f, bool saturate) {
  return static_cast<uint8_t>(encode(f, kE4M3, saturate));
}
float fp8_e4m3_bits_to_f32(uint8_t b) {
  return decode(b, kE4M3);
}
uint8_t f32_to_fp8_e5m2_bits(float f, bool saturate) {
  return static_cast<uint8_t>(encode(f, kE5M2, saturate));
}
float fp8_e5m2_bits_to_f32(uint8_t b) {
  return decode(b, kE5M2);
}

namespace {

// The value of a float storage element, exactly, in f64.
template <typename T>
double float_value(T v) {
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>)
    return v;
  else
    return static_cast<double>(to_f32(v));
}

// Float -> integer: truncation toward zero, NaN -> 0. Out of range, C++ leaves the cast undefined;
// we define it as x86-64's cvttsd2si does (what PyTorch's CPU casts produce there, and what the
// CUDA platform reproduces): INT_MIN for i32/i64, and u8 takes the low 8 bits of the i32 result
// (so -1.0 -> 255 and 300.0 -> 44, as torch.tensor([300.]).to(torch.uint8)).
template <typename D>
D float_to_int(double v) {
  if (std::isnan(v)) return D(0);
  if constexpr (std::is_same_v<D, int64_t>) {
    if (v >= -9223372036854775808.0 && v < 9223372036854775808.0) return static_cast<int64_t>(v);
    return std::numeric_limits<int64_t>::min();
  } else {
    int32_t i = std::numeric_limits<int32_t>::min();
    if (v > -2147483649.0 && v < 2147483648.0) i = static_cast<int32_t>(v);
    if constexpr (std::is_same_v<D, int32_t>)
      return i;
    else
      return static_cast<D>(static_cast<uint32_t>(i) & 0xffu);
  }
}

// One element from storage type S to storage type D, with PyTorch's rounding paths:
//   int -> int     modular (C++20 static_cast, as torch's integer .to())
//   int -> float   one rounding to f32 (f64: to f64), then to the narrow format
//   float -> int   float_to_int above
//   float -> float exact to f64; to anything narrower through f32 (c10 converts f64 via float)
template <typename D, typename S>
D convert_one(S s) {
  if constexpr (std::is_integral_v<S> && std::is_integral_v<D>) {
    return static_cast<D>(s);
  } else if constexpr (std::is_integral_v<S>) {
    if constexpr (std::is_same_v<D, double>)
      return static_cast<double>(s);
    else if constexpr (std::is_same_v<D, float>)
      return static_cast<float>(s);
    else
      return from_f32<D>(static_cast<float>(s));
  } else if constexpr (std::is_integral_v<D>) {
    return float_to_int<D>(float_value(s));
  } else if constexpr (std::is_same_v<D, double>) {
    return float_value(s);
  } else if constexpr (std::is_same_v<D, float>) {
    return static_cast<float>(float_value(s));
  } else {
    return from_f32<D>(static_cast<float>(float_value(s)));
  }
}

template <typename F>
void visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f64:
      return f(double{});
    case DType::f32:
      return f(float{});
    case DType::bf16:
      return f(bf16_t{});
    case DType::f16:
      return f(f16_t{});
    case DType::fp8_e4m3:
      return f(fp8_e4m3_t{});
    case DType::fp8_e5m2:
      return f(fp8_e5m2_t{});
    case DType::i32:
      return f(int32_t{});
    case DType::i64:
      return f(int64_t{});
    case DType::u8:
      return f(uint8_t{});
  }
  MG_THROW("invalid dtype " << static_cast<int>(t));
}

}  // namespace

void convert_host(void* dst, DType dst_type, const void* src, DType src_type, std::size_t n) {
  if (n == 0) return;
  if (dst_type == src_type) {
    std::memcpy(dst, src, n * dtype_size(dst_type));
    return;
  }
  if (dst_type == DType::bf16 && src_type == DType::f32) {  // the hot case: master -> model weights
    const float* s = static_cast<const float*>(src);
    uint16_t* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for simd if (n > (1 << 16))
    for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_bf16_inline(s[i]);
    return;
  }
  visit_dtype(src_type, [&](auto s) {
    using S = decltype(s);
    visit_dtype(dst_type, [&](auto d) {
      using D = decltype(d);
      const S* in = static_cast<const S*>(src);
      D* out = static_cast<D*>(dst);
#pragma omp parallel for if (n > (1 << 16))
      for (std::size_t i = 0; i < n; ++i) out[i] = convert_one<D>(in[i]);
    });
  });
}

}  // namespace mg
