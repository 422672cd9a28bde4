// Dtype names and the host conversions (see dtype.h for the exact semantics).
//
// The element conversions themselves live in dtype_math.h, written once for host and device, so
// the CPU and CUDA platforms round identically; this file adds the typed, OpenMP-parallel bulk
// loop of convert_host with PyTorch's rounding paths between dtype pairs.
#include "megatron/core/tensor/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "megatron/core/common/error.h"
#include "megatron/core/tensor/dtype_math.h"

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

uint16_t f32_to_bf16_bits(float f) {
  return f32_to_bf16_inline(f);
}
float bf16_bits_to_f32(uint16_t b) {
  return bf16_to_f32_inline(b);
}
uint16_t f32_to_f16_bits(float f) {
  return dmath::f32_to_f16(f);
}
float f16_bits_to_f32(uint16_t h) {
  return dmath::f16_to_f32(h);
}
uint8_t f32_to_fp8_e4m3_bits(float f, bool saturate) {
  return dmath::f32_to_e4m3(f, saturate);
}
float fp8_e4m3_bits_to_f32(uint8_t b) {
  return dmath::e4m3_to_f32(b);
}
uint8_t f32_to_fp8_e5m2_bits(float f, bool saturate) {
  return dmath::f32_to_e5m2(f, saturate);
}
float fp8_e5m2_bits_to_f32(uint8_t b) {
  return dmath::e5m2_to_f32(b);
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
// CUDA platform reproduces with the same dtype_math.h): INT_MIN for i32/i64, and u8 takes the low
// 8 bits of the i32 result (so -1.0 -> 255 and 300.0 -> 44, as torch.tensor([300.]).to(uint8)).
template <typename D>
D float_to_int(double v) {
  if constexpr (std::is_same_v<D, int64_t>)
    return dmath::f64_to_i64(v);
  else if constexpr (std::is_same_v<D, int32_t>)
    return dmath::f64_to_i32(v);
  else
    return dmath::f64_to_u8(v);
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
