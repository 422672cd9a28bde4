// Element conversions between every pair of dtypes, written once for host and device
// (__host__ __device__ under nvcc, plain inline C++ otherwise): dtype.cpp's conversions and
// convert_host are built on these, and so are the CUDA platform's, so both platforms round alike.
//
// Invariants: the semantics documented in dtype.h, not CUDA's intrinsics, whose NaN encodings
// differ
// (__float2bfloat16 gives 0x7FFF, the fp8 encoders drop the NaN sign or keep the e5m2 payload):
//   bf16      RNE, NaN -> 0x7FC0 (sign dropped).
//   f16, fp8  one generic encoder: integer round-half-even of the f32 significand in the target's
//             normal or subnormal range, then the format's overflow rule (f16/e5m2 -> Inf, e4m3fn
//             non-saturating -> NaN, saturating -> +-max).
//   any pair  convert_element(): float sources load exactly as f64 and store through f32 for the
//             narrow formats (as PyTorch does); float -> integer truncates, NaN -> 0, out of range
//             INT_MIN / INT64_MIN and u8 the low byte of the i32 result (x86-64's cvttsd2si, the
//             contract dtype.h documents); integer -> integer wraps; integer -> float rounds
//             once to f32 (f64 for f64).
//   f32<->f64 a NaN keeps its sign and payload top bits (x86), not the GPU's canonical NaN.
// Not here: vectorised or packed conversions (not yet), anything that allocates.
#pragma once

#include <cstdint>
#include <cstring>

#include "megatron/core/tensor/dtype.h"

#ifndef MG_HOST_DEVICE
#if defined(__CUDACC__)
#define MG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MG_HOST_DEVICE inline
#endif
#endif

namespace mg::dmath {

MG_HOST_DEVICE uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
MG_HOST_DEVICE float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
MG_HOST_DEVICE uint64_t f64_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, 8);
  return u;
}
MG_HOST_DEVICE double bits_f64(uint64_t u) {
  double d;
  memcpy(&d, &u, 8);
  return d;
}
// 2^k as a float for k in [-126, 127] (exact).
MG_HOST_DEVICE float pow2f(int k) {
  return bits_f32(static_cast<uint32_t>(k + 127) << 23);
}
MG_HOST_DEVICE float negate(float f) {
  return bits_f32(f32_bits(f) ^ 0x80000000u);
}

// f64 <-> f32 as the x86-64 host converts (cvtsd2ss / cvtss2sd): RNE, and a NaN keeps its sign
// and the top of its payload, quietened. The GPU's cvt would return the canonical NaN instead, so
// the NaN case is done on the bits.
MG_HOST_DEVICE float f64_to_f32(double v) {
  const uint64_t u = f64_bits(v);
  if ((u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull)
    return bits_f32(static_cast<uint32_t>((u >> 32) & 0x80000000u) | 0x7fc00000u |
                    static_cast<uint32_t>((u >> 29) & 0x3fffffu));
  return static_cast<float>(v);
}
MG_HOST_DEVICE double f32_to_f64(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return bits_f64((static_cast<uint64_t>(u & 0x80000000u) << 32) | 0x7ff8000000000000ull |
                    (static_cast<uint64_t>(u & 0x3fffffu) << 29));
  return static_cast<double>(f);
}

// ---- bf16 -------------------------------------------------------------------------------------
MG_HOST_DEVICE float bf16_to_f32(uint16_t b) {
  return bits_f32(static_cast<uint32_t>(b) << 16);
}
MG_HOST_DEVICE uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                     // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// ---- f16 and the fp8 formats ------------------------------------------------------------------
// EB exponent bits, MB mantissa bits; IEEE: the top exponent is Inf/NaN (else e4m3fn: only
// S.1111.111 is NaN); NAN_BITS the canonical NaN without sign.
template <int EB, int MB, bool IEEE, uint32_t NAN_BITS>
struct MiniFloat {
  static constexpr int kBias = (1 << (EB - 1)) - 1;
  static constexpr uint32_t kTop = (1u << EB) - 1;
  static constexpr uint32_t kMaxFinite =
      IEEE ? (((kTop - 1) << MB) | ((1u << MB) - 1)) : ((kTop << MB) | ((1u << MB) - 2));
  static constexpr uint32_t kInf = kTop << MB;

  static MG_HOST_DEVICE uint32_t encode(float f, bool saturate) {
    const uint32_t u = f32_bits(f);
    const uint32_t sign = (u >> 31) << (EB + MB);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | NAN_BITS;
    const uint32_t overflow = saturate ? kMaxFinite : (IEEE ? kInf : NAN_BITS);
    if (a == 0x7f800000u) return sign | overflow;
    if (a == 0) return sign;
    int e = static_cast<int>(a >> 23);
    uint32_t mant = a & 0x7fffffu;
    if (e == 0)
      e = 1;
    else
      mant |= 0x800000u;
    const int exp = e - 127;
    constexpr int emin = 1 - kBias;
    const int shift = (23 - MB) + (exp < emin ? emin - exp : 0);
    uint32_t n;
    if (shift >= 32) {
      n = 0;
    } else {
      n = mant >> shift;
      const uint32_t rem = mant & ((1u << shift) - 1);
      const uint32_t half = 1u << (shift - 1);
      if (rem > half || (rem == half && (n & 1u))) ++n;
    }
    int efield = exp < emin ? 0 : exp + kBias;
    if (efield == 0) {
      if (n >= (1u << MB)) efield = 1, n -= (1u << MB);
    } else {
      if (n >= (2u << MB)) ++efield, n >>= 1;
      n -= (1u << MB);
    }
    const uint32_t bits = (static_cast<uint32_t>(efield) << MB) | n;
    if (efield >= (1 << EB) || bits > kMaxFinite) return sign | overflow;
    return sign | bits;
  }

  static MG_HOST_DEVICE float decode(uint32_t b) {
    constexpr uint32_t sbit = 1u << (EB + MB);
    const bool neg = (b & sbit) != 0;
    const uint32_t a = b & (sbit - 1);
    const uint32_t efield = a >> MB;
    const uint32_t mant = a & ((1u << MB) - 1);
    float v;
    if (IEEE && efield == kTop) {
      v = bits_f32(mant == 0 ? 0x7f800000u : 0x7fc00000u);
    } else if (!IEEE && a == NAN_BITS) {
      v = bits_f32(0x7fc00000u);
    } else if (efield == 0) {
      v = static_cast<float>(mant) * pow2f(1 - kBias - MB);
    } else {
      v = static_cast<float>(mant | (1u << MB)) * pow2f(static_cast<int>(efield) - kBias - MB);
    }
    return neg ? negate(v) : v;
  }
};

using F16 = MiniFloat<5, 10, true, 0x7e00u>;
using E5M2 = MiniFloat<5, 2, true, 0x7fu>;
using E4M3 = MiniFloat<4, 3, false, 0x7fu>;

MG_HOST_DEVICE float f16_to_f32(uint16_t h) {
  return F16::decode(h);
}
MG_HOST_DEVICE uint16_t f32_to_f16(float f) {
  return static_cast<uint16_t>(F16::encode(f, false));
}
MG_HOST_DEVICE float e4m3_to_f32(uint8_t b) {
  return E4M3::decode(b);
}
MG_HOST_DEVICE uint8_t f32_to_e4m3(float f, bool saturate = false) {
  return static_cast<uint8_t>(E4M3::encode(f, saturate));
}
MG_HOST_DEVICE float e5m2_to_f32(uint8_t b) {
  return E5M2::decode(b);
}
MG_HOST_DEVICE uint8_t f32_to_e5m2(float f, bool saturate = false) {
  return static_cast<uint8_t>(E5M2::encode(f, saturate));
}

// ---- float -> integer with the host build's (x86-64) out-of-range results ---------------------
MG_HOST_DEVICE int32_t f64_to_i32(double v) {
  if (v != v) return 0;
  if (v > -2147483649.0 && v < 2147483648.0) return static_cast<int32_t>(v);
  return INT32_MIN;
}
MG_HOST_DEVICE int64_t f64_to_i64(double v) {
  if (v != v) return 0;
  if (v >= -9223372036854775808.0 && v < 9223372036854775808.0) return static_cast<int64_t>(v);
  return INT64_MIN;
}
MG_HOST_DEVICE uint8_t f64_to_u8(double v) {
  return static_cast<uint8_t>(static_cast<uint32_t>(f64_to_i32(v)) & 0xffu);
}

// ---- element access by runtime dtype ----------------------------------------------------------
// Element i of buffer p of dtype t as a double (exact for every float dtype; i64 rounds).
MG_HOST_DEVICE double load_as_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f64:
      return static_cast<const double*>(p)[i];
    case DType::f32:
      return f32_to_f64(static_cast<const float*>(p)[i]);
    case DType::bf16:
      return f32_to_f64(bf16_to_f32(static_cast<const uint16_t*>(p)[i]));
    case DType::f16:
      return f32_to_f64(f16_to_f32(static_cast<const uint16_t*>(p)[i]));
    case DType::fp8_e4m3:
      return f32_to_f64(e4m3_to_f32(static_cast<const uint8_t*>(p)[i]));
    case DType::fp8_e5m2:
      return f32_to_f64(e5m2_to_f32(static_cast<const uint8_t*>(p)[i]));
    case DType::i32:
      return static_cast<double>(static_cast<const int32_t*>(p)[i]);
    case DType::i64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::u8:
      return static_cast<double>(static_cast<const uint8_t*>(p)[i]);
  }
  return 0.0;
}

// Stores f (already rounded to f32) into a narrow float element; false for other dtypes.
MG_HOST_DEVICE bool store_narrow(void* p, DType t, int64_t i, float f) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(p)[i] = f;
      return true;
    case DType::bf16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(f);
      return true;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(f);
      return true;
    case DType::fp8_e4m3:
      static_cast<uint8_t*>(p)[i] = f32_to_e4m3(f);
      return true;
    case DType::fp8_e5m2:
      static_cast<uint8_t*>(p)[i] = f32_to_e5m2(f);
      return true;
    default:
      return false;
  }
}

// Stores v into element i of buffer p of dtype t, as convert_host does from a double.
MG_HOST_DEVICE void store_from_double(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f64:
      static_cast<double*>(p)[i] = v;
      return;
    case DType::i32:
      static_cast<int32_t*>(p)[i] = f64_to_i32(v);
      return;
    case DType::i64:
      static_cast<int64_t*>(p)[i] = f64_to_i64(v);
      return;
    case DType::u8:
      static_cast<uint8_t*>(p)[i] = f64_to_u8(v);
      return;
    default:
      store_narrow(p, t, i, f64_to_f32(v));
      return;
  }
}

MG_HOST_DEVICE bool is_integer(DType t) {
  return t == DType::i32 || t == DType::i64 || t == DType::u8;
}

// Element i of src (dtype st) converted into dst (dtype dt), as convert_host converts:
//   int -> int     two's-complement wrap (C++20 static_cast)
//   int -> float   one rounding to f32 (to f64 for f64), then to the narrow format
//   float -> any   load exactly as f64, store_from_double (narrow floats through f32)
MG_HOST_DEVICE void convert_element(void* dst, DType dt, const void* src, DType st, int64_t i) {
  if (is_integer(st)) {
    const int64_t v = st == DType::i64   ? static_cast<const int64_t*>(src)[i]
                      : st == DType::i32 ? static_cast<const int32_t*>(src)[i]
                                         : static_cast<const uint8_t*>(src)[i];
    switch (dt) {
      case DType::i64:
        static_cast<int64_t*>(dst)[i] = v;
        return;
      case DType::i32:
        static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(v);
        return;
      case DType::u8:
        static_cast<uint8_t*>(dst)[i] = static_cast<uint8_t>(v);
        return;
      case DType::f64:
        static_cast<double*>(dst)[i] = static_cast<double>(v);
        return;
      default:
        store_narrow(dst, dt, i, static_cast<float>(v));
        return;
    }
  }
  store_from_double(dst, dt, i, load_as_double(src, st, i));
}

// Kernel loads and stores in a compute type C (float, or double for f64 math). A float dtype is
// read exactly and widened; a store rounds C -> f32 -> the narrow format (f64 keeps double).
template <typename C>
MG_HOST_DEVICE C load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f64:
      return static_cast<C>(static_cast<const double*>(p)[i]);
    case DType::f32:
      return static_cast<C>(static_cast<const float*>(p)[i]);
    case DType::bf16:
      return static_cast<C>(bf16_to_f32(static_cast<const uint16_t*>(p)[i]));
    case DType::f16:
      return static_cast<C>(f16_to_f32(static_cast<const uint16_t*>(p)[i]));
    default:
      return static_cast<C>(load_as_double(p, t, i));
  }
}

template <typename C>
MG_HOST_DEVICE void store(void* p, DType t, int64_t i, C v) {
  if (t == DType::f64) {
    static_cast<double*>(p)[i] = static_cast<double>(v);
    return;
  }
  float f;
  if constexpr (sizeof(C) == sizeof(double))
    f = f64_to_f32(v);
  else
    f = v;
  if (!store_narrow(p, t, i, f)) store_from_double(p, t, i, f32_to_f64(f));
}

// Integer element (ids, targets, positions) of an i32 or i64 buffer.
MG_HOST_DEVICE int64_t load_index(const void* p, DType t, int64_t i) {
  return t == DType::i64 ? static_cast<const int64_t*>(p)[i]
                         : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

}  // namespace mg::dmath
