// The element conversions of megatron/core/tensor/dtype_math.h are one source compiled for host
// and device; dtype.cpp's scalar encoders are thin wrappers of it (their independent check is
// tests/unit/core/dtype_test.cpp). What this adds: the per-element, runtime-dtype path the CUDA
// kernels use (dmath::convert_element, load/store) against convert_host's typed bulk loop, for
// every dtype pair on edge values (rounding midpoints, subnormals, overflow, Inf, NaN, integer
// ranges), run on the host on every machine. What it cannot show: that nvcc compiles the same
// source to the same bits (the GPU tests in cuda_platform_test.cpp check convert()).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "megatron/core/tensor/dtype.h"
#include "megatron/core/tensor/dtype_math.h"

namespace mg {
namespace {

namespace dm = dmath;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Equal bits, or both NaN with the same sign (the decoders' NaN payload is not part of the
// contract, its sign is).
::testing::AssertionResult same_float(float a, float b) {
  if (bits(a) == bits(b)) return ::testing::AssertionSuccess();
  if (std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << std::hex << "0x" << bits(a) << " vs 0x" << bits(b);
}

TEST(CudaDtypeMath, DecodesEveryPatternAsTheLibrary) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<uint16_t>(b);
    ASSERT_TRUE(same_float(dm::bf16_to_f32(h), bf16_bits_to_f32(h))) << "bf16 0x" << std::hex << b;
    ASSERT_TRUE(same_float(dm::f16_to_f32(h), f16_bits_to_f32(h))) << "f16 0x" << std::hex << b;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    const auto q = static_cast<uint8_t>(b);
    ASSERT_TRUE(same_float(dm::e4m3_to_f32(q), fp8_e4m3_bits_to_f32(q))) << "e4m3 " << b;
    ASSERT_TRUE(same_float(dm::e5m2_to_f32(q), fp8_e5m2_bits_to_f32(q))) << "e5m2 " << b;
  }
}

// f32 inputs that exercise every rounding decision of a narrow format: each representable value,
// each midpoint between neighbours and the f32 values just beside it, both signs, plus the
// special values and a coarse sweep of all f32 patterns.
std::vector<float> probe_inputs(const std::vector<float>& representable) {
  std::set<uint32_t> out;
  auto add = [&](float f) {
    for (float g : {f, -f}) {
      out.insert(bits(g));
      out.insert(bits(std::nextafter(g, std::numeric_limits<float>::infinity())));
      out.insert(bits(std::nextafter(g, -std::numeric_limits<float>::infinity())));
    }
  };
  for (std::size_t i = 0; i < representable.size(); ++i) {
    add(representable[i]);
    if (i + 1 < representable.size())
      add(static_cast<float>((double(representable[i]) + double(representable[i + 1])) / 2));
  }
  const float big = representable.back();
  for (float f : {big * 1.0625f, big * 1.125f, big * 2.0f, 3.0e38f,
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::denorm_min(), 1e-40f, 1e-30f})
    add(f);
  for (uint32_t u :
       {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0x7fbfffffu})
    out.insert(u);
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 65521) out.insert(static_cast<uint32_t>(u));
  std::vector<float> v;
  for (uint32_t u : out) v.push_back(from_bits(u));
  return v;
}

// The non-negative finite values of a format, ascending.
template <typename Decode>
std::vector<float> finite_values(int nbits, Decode decode) {
  std::set<float> s;
  for (uint32_t b = 0; b < (1u << nbits); ++b) {
    const float f = decode(b);
    if (std::isfinite(f) && f >= 0) s.insert(f);
  }
  return {s.begin(), s.end()};
}

TEST(CudaDtypeMath, EncodesLikeTheLibraryAroundEveryRoundingPoint) {
  const auto bf16_in = probe_inputs(
      finite_values(16, [](uint32_t b) { return bf16_bits_to_f32(static_cast<uint16_t>(b)); }));
  for (float f : bf16_in)
    ASSERT_EQ(dm::f32_to_bf16(f), f32_to_bf16_bits(f)) << std::hex << "0x" << bits(f);
  const auto f16_in = probe_inputs(
      finite_values(16, [](uint32_t b) { return f16_bits_to_f32(static_cast<uint16_t>(b)); }));
  for (float f : f16_in)
    ASSERT_EQ(dm::f32_to_f16(f), f32_to_f16_bits(f)) << std::hex << "0x" << bits(f);
  const auto e4m3_in = probe_inputs(
      finite_values(8, [](uint32_t b) { return fp8_e4m3_bits_to_f32(static_cast<uint8_t>(b)); }));
  const auto e5m2_in = probe_inputs(
      finite_values(8, [](uint32_t b) { return fp8_e5m2_bits_to_f32(static_cast<uint8_t>(b)); }));
  for (bool sat : {false, true}) {
    for (float f : e4m3_in)
      ASSERT_EQ(dm::f32_to_e4m3(f, sat), f32_to_fp8_e4m3_bits(f, sat))
          << std::hex << "0x" << bits(f) << " saturate " << sat;
    for (float f : e5m2_in)
      ASSERT_EQ(dm::f32_to_e5m2(f, sat), f32_to_fp8_e5m2_bits(f, sat))
          << std::hex << "0x" << bits(f) << " saturate " << sat;
  }
}

TEST(CudaDtypeMath, NonSaturatingE4m3OverflowIsNaN) {
  // The contract CUDA's own __NV_NOSAT path is not trusted for: Inf and anything rounding above
  // 448 give NaN (0x7f); 464, the midpoint to the next binade step, ties to even (448).
  const float above = std::nextafter(464.0f, 1e9f);
  for (float f : {above, 480.0f, 1e6f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(dm::f32_to_e4m3(f), 0x7f) << f;
    EXPECT_EQ(dm::f32_to_e4m3(-f), 0xff) << -f;
    EXPECT_EQ(dm::f32_to_e4m3(f, true), 0x7e) << f;  // saturating: 448
  }
  EXPECT_EQ(dm::f32_to_e4m3(464.0f), 0x7e);
  EXPECT_EQ(dm::f32_to_e4m3(463.99f), 0x7e);
}

const DType kAll[] = {DType::f64,      DType::f32, DType::bf16, DType::f16, DType::fp8_e4m3,
                      DType::fp8_e5m2, DType::i32, DType::i64,  DType::u8};

// Edge values as doubles: zeros, subnormals of each format, ties, maxima and beyond, Inf, NaN,
// integers beyond 2^24 and 2^53, and values out of the i32 and u8 ranges (pinned to the host's
// results: INT_MIN for floats, two's-complement wrap between integers).
double f64_from_bits(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}

std::vector<double> edge_values() {
  const double inf = std::numeric_limits<double>::infinity();
  return {f64_from_bits(0x7ff4000020000000ull),  // signalling NaN with a payload
          f64_from_bits(0xfff8123456789abcull),  // negative quiet NaN with a payload
          0.0,
          -0.0,
          1.0,
          -1.0,
          0.5,
          1.5,
          2.5,
          -2.5,
          255.0,
          256.0,
          300.7,
          -7.9,
          1e-45,
          1e-40,
          1.17e-38,
          5.96e-8,
          2.98e-8,
          6.1e-5,
          1.0 / 512,
          1.0 / 1024,
          448.0,
          464.0,
          480.0,
          57344.0,
          61440.0,
          65504.0,
          65519.0,
          65520.0,
          3.39e38,
          3.41e38,
          1e300,
          -1e300,
          1e-320,
          inf,
          -inf,
          16777217.0,
          9007199254740993.0,
          2147483647.0,
          -2147483648.0,
          3e9,
          -3e9,
          1e19,
          std::numeric_limits<double>::quiet_NaN(),
          -std::numeric_limits<double>::quiet_NaN()};
}

bool usable_source(DType src, double v) {
  // Integers hold only in-range integral values.
  if (src == DType::i32) return std::isfinite(v) && v == std::trunc(v) && std::abs(v) < 2.1e9;
  if (src == DType::i64) return std::isfinite(v) && v == std::trunc(v) && std::abs(v) < 9e18;
  if (src == DType::u8) return std::isfinite(v) && v == std::trunc(v) && v >= 0 && v <= 255;
  return true;
}

TEST(CudaDtypeMath, EveryDtypePairConvertsLikeConvertHost) {
  for (DType src : kAll) {
    for (DType dst : kAll) {
      std::vector<double> vals;
      for (double v : edge_values())
        if (usable_source(src, v)) vals.push_back(v);
      const std::size_t n = vals.size();
      std::vector<unsigned char> in(n * dtype_size(src));
      convert_host(in.data(), src, vals.data(), DType::f64, n);
      std::vector<unsigned char> want(n * dtype_size(dst)), got(n * dtype_size(dst));
      convert_host(want.data(), dst, in.data(), src, n);
      for (std::size_t i = 0; i < n; ++i)
        dm::convert_element(got.data(), dst, in.data(), src, static_cast<int64_t>(i));
      const std::size_t es = dtype_size(dst);
      for (std::size_t i = 0; i < n; ++i) {
        EXPECT_EQ(0, std::memcmp(got.data() + i * es, want.data() + i * es, es))
            << dtype_name(src) << " -> " << dtype_name(dst) << " of " << vals[i];
      }
    }
  }
}

TEST(CudaDtypeMath, IntegerSourcesConvertLikeConvertHost) {
  // Values no double can hold exactly: one rounding to f32 differs from rounding through f64
  // (2^60 + 2^36 + 1 is just above an f32 midpoint, 2^60 + 2^36 exactly on it).
  const int64_t i64[] = {(int64_t{1} << 60) + (int64_t{1} << 36) + 1,
                         -((int64_t{1} << 60) + (int64_t{1} << 36) + 1),
                         (int64_t{1} << 53) + 1,
                         (int64_t{1} << 24) + 1,
                         std::numeric_limits<int64_t>::max(),
                         std::numeric_limits<int64_t>::min(),
                         65520,
                         -3000000000,
                         300,
                         -1};
  const int32_t i32[] = {
      (1 << 24) + 1, (1 << 30) + 65, std::numeric_limits<int32_t>::min(), 70000, -1, 255};
  const uint8_t u8[] = {0, 1, 127, 128, 255};
  const std::pair<const void*, std::pair<DType, std::size_t>> sources[] = {
      {i64, {DType::i64, std::size(i64)}},
      {i32, {DType::i32, std::size(i32)}},
      {u8, {DType::u8, std::size(u8)}}};
  for (const auto& [data, info] : sources) {
    const auto [src, n] = info;
    for (DType dst : kAll) {
      std::vector<unsigned char> want(n * dtype_size(dst)), got(n * dtype_size(dst));
      convert_host(want.data(), dst, data, src, n);
      for (std::size_t i = 0; i < n; ++i)
        dm::convert_element(got.data(), dst, data, src, static_cast<int64_t>(i));
      const std::size_t es = dtype_size(dst);
      for (std::size_t i = 0; i < n; ++i)
        EXPECT_EQ(0, std::memcmp(got.data() + i * es, want.data() + i * es, es))
            << dtype_name(src) << " -> " << dtype_name(dst) << " element " << i;
    }
  }
}

TEST(CudaDtypeMath, KernelLoadStoreRoundAsTheLibrary) {
  // store<float> into each narrow dtype equals from_f32; store<double> goes through f32 first.
  for (double v : edge_values()) {
    const float f = static_cast<float>(v);
    uint16_t h = 0;
    uint8_t q = 0;
    dm::store<float>(&h, DType::bf16, 0, f);
    EXPECT_EQ(h, f32_to_bf16_bits(f)) << v;
    dm::store<double>(&h, DType::f16, 0, v);
    EXPECT_EQ(h, f32_to_f16_bits(f)) << v;
    dm::store<float>(&q, DType::fp8_e4m3, 0, f);
    EXPECT_EQ(q, f32_to_fp8_e4m3_bits(f)) << v;
    dm::store<double>(&q, DType::fp8_e5m2, 0, v);
    EXPECT_EQ(q, f32_to_fp8_e5m2_bits(f)) << v;
    EXPECT_TRUE(same_float(dm::load<float>(&h, DType::f16, 0), f16_bits_to_f32(h))) << v;
  }
  const int32_t i32[] = {-7, 0, 2147483647};
  const int64_t i64[] = {-(int64_t{1} << 40), 5};
  EXPECT_EQ(dm::load_index(i32, DType::i32, 2), 2147483647);
  EXPECT_EQ(dm::load_index(i32, DType::i32, 0), -7);
  EXPECT_EQ(dm::load_index(i64, DType::i64, 0), -(int64_t{1} << 40));
}

}  // namespace
}  // namespace mg
