// Exhaustive tests of the narrow float formats (megatron/core/tensor/dtype.h): every bit pattern of
// bf16, f16, fp8 e4m3fn and fp8 e5m2 against a decoder written here from the format definitions,
// round trips, round-to-nearest-even at every midpoint of adjacent values, overflow / Inf / NaN
// rules (non-saturating and saturating), subnormal boundaries, f32 subnormal inputs, random floats
// against a brute-force nearest-value encoder, a bit-for-bit cross-check with ml_dtypes / numpy
// (tests/fixtures/dtype), and convert_host between every pair of dtypes.
//
// The references here never call the library's encoders: ref_decode reads sign/exponent/mantissa,
// ref_encode picks the nearest entry of the sorted table of representable values (ties to the
// even encoding) and applies each format's overflow rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/tensor/dtype.h"

namespace {

using mg::DType;

uint32_t bits_of(float f) {
  return std::bit_cast<uint32_t>(f);
}
float float_of(uint32_t u) {
  return std::bit_cast<float>(u);
}
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- the formats
// ---------------------------------------------------------------------------------

struct Format {
  const char* name;
  int ebits, mbits;
  bool ieee;            // top exponent is Inf (mantissa 0) / NaN; false: e4m3fn (NaN = S.1111.111)
  bool has_saturate;    // the fp8 encoders take a saturate flag
  bool nan_keeps_sign;  // bf16 canonicalises NaN to 0x7FC0 (c10); the others keep the sign
  uint32_t nan_bits;    // the documented NaN, without sign
  uint32_t (*encode)(float, bool saturate);
  float (*decode)(uint32_t);

  int nbits() const { return 1 + ebits + mbits; }
  uint32_t sign_bit() const { return 1u << (ebits + mbits); }
  uint32_t mant_mask() const { return (1u << mbits) - 1; }
  uint32_t exp_all_ones() const { return (1u << ebits) - 1; }
  // Largest finite encoding (positive).
  uint32_t max_bits() const {
    return ieee ? (((exp_all_ones() - 1) << mbits) | mant_mask())
                : ((exp_all_ones() << mbits) | (mant_mask() - 1));
  }
  uint32_t inf_bits() const { return exp_all_ones() << mbits; }
  uint32_t documented_nan(bool negative) const {
    return (nan_keeps_sign && negative ? sign_bit() : 0u) | nan_bits;
  }
};

const Format kBf16{"bf16",
                   8,
                   7,
                   true,
                   false,
                   false,
                   0x7FC0,
                   [](float f, bool) -> uint32_t { return mg::f32_to_bf16_bits(f); },
                   [](uint32_t b) { return mg::bf16_bits_to_f32(static_cast<uint16_t>(b)); }};
const Format kF16{"f16",
                  5,
                  10,
                  true,
                  false,
                  true,
                  0x7E00,
                  [](float f, bool) -> uint32_t { return mg::f32_to_f16_bits(f); },
                  [](uint32_t b) { return mg::f16_bits_to_f32(static_cast<uint16_t>(b)); }};
const Format kE4M3{"fp8_e4m3",
                   4,
                   3,
                   false,
                   true,
                   true,
                   0x7F,
                   [](float f, bool sat) -> uint32_t { return mg::f32_to_fp8_e4m3_bits(f, sat); },
                   [](uint32_t b) { return mg::fp8_e4m3_bits_to_f32(static_cast<uint8_t>(b)); }};
const Format kE5M2{"fp8_e5m2",
                   5,
                   2,
                   true,
                   true,
                   true,
                   0x7F,
                   [](float f, bool sat) -> uint32_t { return mg::f32_to_fp8_e5m2_bits(f, sat); },
                   [](uint32_t b) { return mg::fp8_e5m2_bits_to_f32(static_cast<uint8_t>(b)); }};
const Format* const kFormats[] = {&kBf16, &kF16, &kE4M3, &kE5M2};

// ---- independent references
// ----------------------------------------------------------------------

// Value of encoding b, from the definition: (-1)^S * 2^(E - bias) * 1.M, subnormals
// 2^(1 - bias) * 0.M, and the format's Inf/NaN rule.
double ref_decode(const Format& f, uint32_t b) {
  const bool negative = (b & f.sign_bit()) != 0;
  const uint32_t e = (b >> f.mbits) & f.exp_all_ones();
  const uint32_t m = b & f.mant_mask();
  const int bias = (1 << (f.ebits - 1)) - 1;
  double v;
  if (f.ieee && e == f.exp_all_ones())
    v = m == 0 ? kInf : kNaN;
  else if (!f.ieee && e == f.exp_all_ones() && m == f.mant_mask())
    v = kNaN;
  else if (e == 0)
    v = std::ldexp(double(m), 1 - bias - f.mbits);
  else
    v = std::ldexp(1.0 + std::ldexp(double(m), -f.mbits), int(e) - bias);
  return negative ? -v : v;
}

// Positive finite values, index = encoding (they are contiguous from 0 to max_bits).
const std::vector<double>& value_table(const Format& f) {
  static std::map<const Format*, std::vector<double>> tables;
  auto& t = tables[&f];
  if (t.empty())
    for (uint32_t b = 0; b <= f.max_bits(); ++b) t.push_back(ref_decode(f, b));
  return t;
}

// Nearest representable value, ties to the even encoding; beyond the top, what IEEE rounding
// would give with one more (unrepresentable) step: Inf for the IEEE formats, NaN for e4m3fn, or
// the max when saturating. Inf input likewise.
uint32_t ref_encode(const Format& f, float x, bool saturate) {
  if (std::isnan(x)) return f.documented_nan(std::signbit(x));
  const uint32_t sign = std::signbit(x) ? f.sign_bit() : 0u;
  const uint32_t overflow =
      saturate ? f.max_bits() : (f.ieee ? f.inf_bits() : f.documented_nan(false));
  const double a = std::fabs(double(x));
  if (std::isinf(a)) return sign | overflow;
  const auto& t = value_table(f);
  const double top = t.back(), step = t[t.size() - 1] - t[t.size() - 2];
  if (a > top) {
    const double threshold = top + step / 2;
    if (a < threshold) return sign | f.max_bits();
    if (a > threshold) return sign | overflow;
    return sign | ((f.max_bits() & 1u) ? overflow : f.max_bits());  // tie: to even
  }
  const auto k = static_cast<uint32_t>(std::upper_bound(t.begin(), t.end(), a) - t.begin() - 1);
  if (t[k] == a) return sign | k;
  const double below = a - t[k], above = t[k + 1] - a;
  if (below < above) return sign | k;
  if (above < below) return sign | (k + 1);
  return sign | ((k & 1u) ? k + 1 : k);
}

// Same float, or both NaN with the same sign; signed zeros distinguished.
bool same_float(float got, double expected) {
  if (std::isnan(expected)) return std::isnan(got) && std::signbit(got) == std::signbit(expected);
  return bits_of(got) == bits_of(static_cast<float>(expected));
}

std::string hex(uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

// Collects mismatches and reports the first few (a loop over 65536 patterns must not emit 65536
// failures).
class Mismatches {
 public:
  explicit Mismatches(std::string what) : what_(std::move(what)) {}
  void add(const std::string& detail) {
    if (count_++ < 8) details_ << "\n  " << detail;
  }
  ~Mismatches() {
    EXPECT_EQ(count_, 0) << what_ << ": " << count_ << " mismatches" << details_.str();
  }

 private:
  std::string what_;
  int count_ = 0;
  std::ostringstream details_;
};

// ---- facts every implementation must reproduce (also pins the reference decoder)
// -----------------

TEST(DtypeFormats, KnownValues) {
  struct Known {
    const Format* f;
    uint32_t bits;
    double value;
  };
  const Known known[] = {
      {&kBf16, 0x3F80, 1.0},
      {&kBf16, 0x7F7F, 3.3895313892515355e38},
      {&kBf16, 0x0001, std::ldexp(1.0, -133)},
      {&kBf16, 0x0080, std::ldexp(1.0, -126)},
      {&kBf16, 0xC040, -3.0},
      {&kF16, 0x3C00, 1.0},
      {&kF16, 0x7BFF, 65504.0},
      {&kF16, 0x0001, std::ldexp(1.0, -24)},
      {&kF16, 0x0400, std::ldexp(1.0, -14)},
      {&kF16, 0x03FF, std::ldexp(1023.0, -24)},
      {&kE4M3, 0x38, 1.0},
      {&kE4M3, 0x7E, 448.0},
      {&kE4M3, 0x78, 256.0},
      {&kE4M3, 0x01, std::ldexp(1.0, -9)},
      {&kE4M3, 0x08, std::ldexp(1.0, -6)},
      {&kE4M3, 0xFE, -448.0},
      {&kE5M2, 0x3C, 1.0},
      {&kE5M2, 0x7B, 57344.0},
      {&kE5M2, 0x01, std::ldexp(1.0, -16)},
      {&kE5M2, 0x04, std::ldexp(1.0, -14)},
      {&kE5M2, 0x7C, kInf},
      {&kE5M2, 0xFC, -kInf},
      {&kF16, 0x7C00, kInf},
      {&kBf16, 0xFF80, -kInf},
      {&kE4M3, 0x80, -0.0},
      {&kF16, 0x8000, -0.0},
  };
  for (const Known& k : known) {
    EXPECT_TRUE(same_float(static_cast<float>(ref_decode(*k.f, k.bits)), k.value))
        << "reference decoder, " << k.f->name << " " << hex(k.bits);
    EXPECT_TRUE(same_float(k.f->decode(k.bits), k.value)) << k.f->name << " " << hex(k.bits);
  }
  for (uint32_t nan : {0x7Fu, 0xFFu}) EXPECT_TRUE(std::isnan(kE4M3.decode(nan)));
  for (uint32_t nan : {0x7Du, 0x7Eu, 0x7Fu, 0xFDu}) EXPECT_TRUE(std::isnan(kE5M2.decode(nan)));
  EXPECT_EQ(kE4M3.decode(0x7E), mg::kFp8E4M3Max);
  EXPECT_EQ(kE5M2.decode(0x7B), mg::kFp8E5M2Max);
}

// ---- per-format exhaustive tests
// -----------------------------------------------------------------

class DtypeFormatTest : public ::testing::TestWithParam<const Format*> {
 protected:
  const Format& fmt() const { return *GetParam(); }
  uint32_t count() const { return 1u << fmt().nbits(); }
};

TEST_P(DtypeFormatTest, DecodeEveryBitPattern) {
  Mismatches bad(std::string(fmt().name) + " decode");
  int nans = 0, infs = 0;
  for (uint32_t b = 0; b < count(); ++b) {
    const double expected = ref_decode(fmt(), b);
    const float got = fmt().decode(b);
    if (!same_float(got, expected)) bad.add(hex(b) + " -> " + std::to_string(got));
    nans += std::isnan(expected);
    infs += std::isinf(expected);
  }
  // IEEE-like: 2 * (2^m - 1) NaNs and two infinities; e4m3fn: one NaN per sign, no Inf.
  EXPECT_EQ(nans, fmt().ieee ? 2 * int(fmt().mant_mask()) : 2);
  EXPECT_EQ(infs, fmt().ieee ? 2 : 0);
  const auto& t = value_table(fmt());
  for (std::size_t k = 1; k < t.size(); ++k) ASSERT_LT(t[k - 1], t[k]) << "at " << k;
}

TEST_P(DtypeFormatTest, EncodeOfDecodeIsIdentity) {
  Mismatches bad(std::string(fmt().name) + " encode(decode(b))");
  for (uint32_t b = 0; b < count(); ++b) {
    const float v = fmt().decode(b);
    const bool negative = (b & fmt().sign_bit()) != 0;
    const uint32_t expected = std::isnan(v) ? fmt().documented_nan(negative) : b;
    if (fmt().encode(v, false) != expected)
      bad.add(hex(b) + " -> " + hex(fmt().encode(v, false)) + ", expected " + hex(expected));
    if (fmt().has_saturate) {
      // Saturating: every finite value and NaN are unchanged; Inf clamps to the max.
      const uint32_t sat_expected =
          std::isinf(v) ? (negative ? fmt().sign_bit() : 0u) | fmt().max_bits() : expected;
      if (fmt().encode(v, true) != sat_expected)
        bad.add("saturating " + hex(b) + " -> " + hex(fmt().encode(v, true)));
    }
  }
}

TEST_P(DtypeFormatTest, NaNInputsGiveTheDocumentedNaN) {
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0x7FBFFFFFu, 0x7FFFFFFFu, 0x7FC12345u}) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const float x = float_of(nan | sign);
      ASSERT_TRUE(std::isnan(x));
      const uint32_t expected = fmt().documented_nan(sign != 0);
      EXPECT_EQ(fmt().encode(x, false), expected) << hex(nan | sign);
      if (fmt().has_saturate) {
        EXPECT_EQ(fmt().encode(x, true), expected) << hex(nan | sign);
      }
    }
  }
}

// For every pair of adjacent representable values (a, b): the f32 midpoint rounds to the even
// encoding, the next float above it to b and the next float below it to a; both signs, and the
// saturating encoders agree inside the range. Covers both subnormal boundaries ((0, min subnormal)
// and (max subnormal, min normal)) and every binade edge.
TEST_P(DtypeFormatTest, MidpointsRoundToNearestEven) {
  Mismatches bad(std::string(fmt().name) + " midpoints");
  const auto& t = value_table(fmt());
  for (uint32_t k = 0; k + 1 < t.size(); ++k) {
    const double mid = (t[k] + t[k + 1]) / 2;
    const float m = static_cast<float>(mid);
    ASSERT_EQ(double(m), mid) << "midpoint not exact in f32 at " << hex(k);
    const float up = std::nextafter(m, std::numeric_limits<float>::infinity());
    const float down = std::nextafter(m, 0.0f);
    const uint32_t even = (k & 1u) ? k + 1 : k;
    for (uint32_t sign : {0u, fmt().sign_bit()}) {
      const float s = sign ? -1.0f : 1.0f;
      for (bool sat : {false, true}) {
        if (sat && !fmt().has_saturate) continue;
        const char* mode = sat ? " (saturating)" : "";
        if (fmt().encode(s * m, sat) != (sign | even))
          bad.add("midpoint of " + hex(k) + "/" + hex(k + 1) + mode + " -> " +
                  hex(fmt().encode(s * m, sat)));
        if (fmt().encode(s * up, sat) != (sign | (k + 1)))
          bad.add("above midpoint of " + hex(k) + mode + " -> " + hex(fmt().encode(s * up, sat)));
        if (fmt().encode(s * down, sat) != (sign | k))
          bad.add("below midpoint of " + hex(k) + mode + " -> " + hex(fmt().encode(s * down, sat)));
      }
    }
  }
}

// f32 subnormals: far below every format's range except bf16's (which shares f32's exponents).
TEST_P(DtypeFormatTest, F32SubnormalInputs) {
  Mismatches bad(std::string(fmt().name) + " f32 subnormal inputs");
  for (uint32_t u = 1; u < 0x800000u; u += (u < 4096 ? 1 : 997)) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const float x = float_of(u | sign);
      for (bool sat : {false, true}) {
        if (sat && !fmt().has_saturate) continue;
        const uint32_t expected = ref_encode(fmt(), x, sat);
        if (fmt().encode(x, sat) != expected)
          bad.add(hex(u | sign) + " -> " + hex(fmt().encode(x, sat)) + ", expected " +
                  hex(expected));
      }
    }
  }
  if (&fmt() != &kBf16) {  // f16/fp8: every f32 subnormal flushes to a signed zero by rounding
    EXPECT_EQ(fmt().encode(float_of(0x007FFFFF), false), 0u);
    EXPECT_EQ(fmt().encode(float_of(0x807FFFFF), false), fmt().sign_bit());
  } else {
    EXPECT_EQ(fmt().encode(float_of(0x00010000), false), 0x0001u);  // exact bf16 subnormal
    EXPECT_EQ(fmt().encode(float_of(0x00008000), false), 0x0000u);  // half of it: tie to even
    EXPECT_EQ(fmt().encode(float_of(0x00008001), false), 0x0001u);
    EXPECT_EQ(fmt().encode(float_of(0x00018000), false), 0x0002u);  // 1.5 ulp: tie to even
  }
}

TEST_P(DtypeFormatTest, RandomFloatsMatchNearestValueEncoder) {
  Mismatches bad(std::string(fmt().name) + " random floats");
  std::mt19937 gen(1234);
  for (int i = 0; i < 60000; ++i) {
    uint32_t u = gen();
    // Half the draws within (or just beyond) the format's range, where rounding is non-trivial.
    if (i % 2) u = (u & 0x807FFFFFu) | ((112u + gen() % 36u) << 23);
    const float x = float_of(u);
    for (bool sat : {false, true}) {
      if (sat && !fmt().has_saturate) continue;
      const uint32_t got = fmt().encode(x, sat), expected = ref_encode(fmt(), x, sat);
      if (got != expected)
        bad.add(hex(u) + (sat ? " sat" : "") + " -> " + hex(got) + ", expected " + hex(expected));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, DtypeFormatTest, ::testing::ValuesIn(kFormats),
                         [](const auto& info) { return std::string(info.param->name); });

// ---- overflow, Inf and the saturating variants, per format as dtype.h documents them
// -------------

TEST(DtypeOverflow, Bf16) {
  const float threshold = float_of(0x7F7F8000);        // max + half an ulp
  EXPECT_EQ(mg::f32_to_bf16_bits(threshold), 0x7F80);  // tie: max is odd, rounds up to Inf
  EXPECT_EQ(mg::f32_to_bf16_bits(std::nextafter(threshold, 0.0f)), 0x7F7F);
  EXPECT_EQ(mg::f32_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(mg::f32_to_bf16_bits(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(mg::f32_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(mg::f32_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xFF80);
}

TEST(DtypeOverflow, F16) {
  EXPECT_EQ(mg::f32_to_f16_bits(65519.996f), 0x7BFF);
  EXPECT_EQ(mg::f32_to_f16_bits(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(mg::f32_to_f16_bits(65520.0f), 0x7C00);  // |x| >= 65520 -> Inf
  EXPECT_EQ(mg::f32_to_f16_bits(-65520.0f), 0xFC00);
  EXPECT_EQ(mg::f32_to_f16_bits(1e10f), 0x7C00);
  EXPECT_EQ(mg::f32_to_f16_bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(mg::f32_to_f16_bits(-std::numeric_limits<float>::infinity()), 0xFC00);
}

TEST(DtypeOverflow, Fp8E4M3) {
  const float inf = std::numeric_limits<float>::infinity();
  // 464 = 448 + half a step is a tie; 448 (0x7E) is the even neighbour, so it stays finite.
  EXPECT_EQ(mg::f32_to_fp8_e4m3_bits(464.0f), 0x7E);
  EXPECT_EQ(mg::f32_to_fp8_e4m3_bits(std::nextafter(464.0f, inf)), 0x7F);  // NaN
  EXPECT_EQ(mg::f32_to_fp8_e4m3_bits(480.0f), 0x7F);
  EXPECT_EQ(mg::f32_to_fp8_e4m3_bits(-1e6f), 0xFF);
  EXPECT_EQ(mg::f32_to_fp8_e4m3_bits(inf), 0x7F);  // no Inf in e4m3fn: NaN
  EXPECT_EQ(mg::f32_to_fp8_e4m3_bits(-inf), 0xFF);
  // Saturating (__NV_SATFINITE): finite overflow and Inf clamp to +-448, NaN stays NaN.
  EXPECT_EQ(mg::f32_to_fp8_e4m3_bits(std::nextafter(464.0f, inf), true), 0x7E);
  EXPECT_EQ(mg::f32_to_fp8_e4m3_bits(1e30f, true), 0x7E);
  EXPECT_EQ(mg::f32_to_fp8_e4m3_bits(-1e30f, true), 0xFE);
  EXPECT_EQ(mg::f32_to_fp8_e4m3_bits(inf, true), 0x7E);
  EXPECT_EQ(mg::f32_to_fp8_e4m3_bits(-inf, true), 0xFE);
  EXPECT_TRUE(std::isnan(mg::fp8_e4m3_bits_to_f32(
      mg::f32_to_fp8_e4m3_bits(std::numeric_limits<float>::quiet_NaN(), true))));
}

TEST(DtypeOverflow, Fp8E5M2) {
  const float inf = std::numeric_limits<float>::infinity();
  // 61440 = 57344 + half a step is a tie; 57344 (0x7B) is odd, so it rounds up to Inf.
  EXPECT_EQ(mg::f32_to_fp8_e5m2_bits(61440.0f), 0x7C);
  EXPECT_EQ(mg::f32_to_fp8_e5m2_bits(std::nextafter(61440.0f, 0.0f)), 0x7B);
  EXPECT_EQ(mg::f32_to_fp8_e5m2_bits(-1e6f), 0xFC);
  EXPECT_EQ(mg::f32_to_fp8_e5m2_bits(inf), 0x7C);
  EXPECT_EQ(mg::f32_to_fp8_e5m2_bits(-inf), 0xFC);
  EXPECT_EQ(mg::f32_to_fp8_e5m2_bits(61440.0f, true), 0x7B);
  EXPECT_EQ(mg::f32_to_fp8_e5m2_bits(1e30f, true), 0x7B);
  EXPECT_EQ(mg::f32_to_fp8_e5m2_bits(inf, true), 0x7B);
  EXPECT_EQ(mg::f32_to_fp8_e5m2_bits(-inf, true), 0xFB);
}

// ---- the inline / template paths agree with the bit functions
// ------------------------------------

TEST(DtypeConversions, InlineAndTemplatePathsAgree) {
  std::mt19937 gen(7);
  for (int i = 0; i < 20000; ++i) {
    const float x = float_of(gen());
    const uint16_t b = mg::f32_to_bf16_bits(x);
    ASSERT_EQ(mg::f32_to_bf16_inline(x), b) << hex(bits_of(x));
    ASSERT_EQ(mg::from_f32<mg::bf16_t>(x).bits, b);
    ASSERT_EQ(mg::store<mg::bf16_t>(x).bits, b);
    ASSERT_EQ(mg::from_f32<mg::f16_t>(x).bits, mg::f32_to_f16_bits(x));
    ASSERT_EQ(mg::from_f32<mg::fp8_e4m3_t>(x).bits, mg::f32_to_fp8_e4m3_bits(x));
    ASSERT_EQ(mg::from_f32<mg::fp8_e5m2_t>(x).bits, mg::f32_to_fp8_e5m2_bits(x));
    const uint16_t h = static_cast<uint16_t>(gen());
    ASSERT_TRUE(same_float(mg::to_f32(mg::bf16_t{h}), mg::bf16_bits_to_f32(h)));
    // bf16 is the top half of an f32, payloads included.
    ASSERT_EQ(bits_of(mg::bf16_bits_to_f32(h)), uint32_t(h) << 16);
    ASSERT_TRUE(same_float(mg::to_f32(mg::f16_t{h}), mg::f16_bits_to_f32(h)));
  }
}

// ---- cross-check with an independent implementation (ml_dtypes / numpy)
// --------------------------

// tests/fixtures/dtype/dtype_fixture.txt (gen_dtype_fixture.py): f32 bits and the bf16, f16,
// fp8 e4m3fn, fp8 e5m2 encodings ml_dtypes 0.6 (numpy for f16) computes. Finite and infinite
// inputs must match bit for bit. For NaN inputs only NaN-ness is compared: ml_dtypes keeps the
// sign of a bf16 NaN (0xFFC0) where c10::BFloat16 canonicalises to 0x7FC0, and gives 0x7E for an
// e5m2 NaN where c10::Float8_e5m2 gives 0x7F; dtype.h follows PyTorch.
TEST(DtypeConversions, MatchesMlDtypesFixture) {
  const std::string path = std::string(MG_TEST_FIXTURES_DIR) + "/dtype/dtype_fixture.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  Mismatches bad("ml_dtypes fixture");
  std::string line;
  int rows = 0, nan_rows = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    uint32_t x = 0, e[4] = {0, 0, 0, 0};
    ls >> std::hex >> x >> e[0] >> e[1] >> e[2] >> e[3];
    ASSERT_FALSE(ls.fail()) << "bad fixture line: " << line;
    ++rows;
    const float f = float_of(x);
    nan_rows += std::isnan(f);
    for (int k = 0; k < 4; ++k) {
      const Format& fmt = *kFormats[k];
      const uint32_t got = fmt.encode(f, false);
      const bool ok =
          std::isnan(f) ? std::isnan(fmt.decode(got)) && std::isnan(fmt.decode(e[k])) : got == e[k];
      if (!ok)
        bad.add(std::string(fmt.name) + " of " + hex(x) + ": " + hex(got) + ", ml_dtypes " +
                hex(e[k]));
    }
  }
  EXPECT_GT(rows, 4000);
  EXPECT_GT(nan_rows, 0);
}

// ---- convert_host between every pair of dtypes
// ---------------------------------------------------

constexpr DType kAllDTypes[] = {DType::f64, DType::f32,      DType::bf16,
                                DType::f16, DType::fp8_e4m3, DType::fp8_e5m2,
                                DType::i32, DType::i64,      DType::u8};

const Format* format_of(DType t) {
  switch (t) {
    case DType::bf16:
      return &kBf16;
    case DType::f16:
      return &kF16;
    case DType::fp8_e4m3:
      return &kE4M3;
    case DType::fp8_e5m2:
      return &kE5M2;
    default:
      return nullptr;
  }
}
bool is_int(DType t) {
  return t == DType::i32 || t == DType::i64 || t == DType::u8;
}

// Integer from a double, as dtype.h documents: truncation, NaN -> 0; out of range x86-64's
// result (INT_MIN), u8 the low byte of the i32 result.
int64_t ref_float_to_int(DType t, double v) {
  if (std::isnan(v)) return 0;
  const double tr = std::trunc(v);
  if (t == DType::i64) return std::fabs(tr) < 0x1p63 ? int64_t(tr) : INT64_MIN;
  const int64_t i32 = std::fabs(tr) < 0x1p31 ? int64_t(tr) : INT32_MIN;
  return t == DType::i32 ? i32 : (i32 & 0xff);
}
// Integer to a narrower integer: modular.
int64_t ref_wrap(DType t, int64_t v) {
  if (t == DType::i32) return static_cast<int32_t>(static_cast<uint32_t>(v));
  if (t == DType::u8) return v & 0xff;
  return v;
}
// The value a float dtype stores for x (narrow formats from f32, as documented).
double ref_float_store(DType t, double x) {
  if (t == DType::f64) return x;
  const float f = static_cast<float>(x);
  if (t == DType::f32) return f;
  const Format& fmt = *format_of(t);
  return ref_decode(fmt, ref_encode(fmt, f, false));
}
// Value of dtype t holding v, computed by the reference from a value held by a dtype `from`.
double ref_convert(DType to, DType from, double v) {
  if (is_int(from) && is_int(to)) return double(ref_wrap(to, int64_t(v)));
  if (is_int(to)) return double(ref_float_to_int(to, v));
  return ref_float_store(to, v);  // v is an exact small integer when `from` is an int dtype
}

void write_elem(std::vector<unsigned char>& buf, DType t, std::size_t i, double v) {
  unsigned char* p = buf.data() + i * mg::dtype_size(t);
  switch (t) {
    case DType::f64:
      std::memcpy(p, &v, 8);
      return;
    case DType::f32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case DType::i32: {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      return;
    }
    case DType::i64: {
      const int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      return;
    }
    case DType::u8:
      *p = static_cast<unsigned char>(v);
      return;
    default: {
      const Format& fmt = *format_of(t);
      const uint32_t b = ref_encode(fmt, static_cast<float>(v), false);
      if (fmt.nbits() == 16) {
        const uint16_t h = static_cast<uint16_t>(b);
        std::memcpy(p, &h, 2);
      } else {
        *p = static_cast<unsigned char>(b);
      }
    }
  }
}

double read_elem(const std::vector<unsigned char>& buf, DType t, std::size_t i) {
  const unsigned char* p = buf.data() + i * mg::dtype_size(t);
  switch (t) {
    case DType::f64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::f32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::i32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::i64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return double(v);
    }
    case DType::u8:
      return *p;
    default: {
      const Format& fmt = *format_of(t);
      uint16_t h = *p;
      if (fmt.nbits() == 16) std::memcpy(&h, p, 2);
      return ref_decode(fmt, h);
    }
  }
}

TEST(DtypeConversions, ConvertHostBetweenEveryPair) {
  // Exact in e5m2 (the coarsest format) up to 224, then values that round or overflow somewhere.
  const std::vector<double> base = {0.0,    -0.0,    1.0,     -1.0,  2.5,   -2.5,  3.5,
                                    -7.0,   96.0,    -112.,   0.125, 0.375, 224.0, -0.75,
                                    1000.5, -300.25, 70000.0, -2.9,  kNaN};
  for (DType src : kAllDTypes) {
    // The source elements: base values as stored in src (through the references).
    std::vector<double> held(base.size());
    for (std::size_t i = 0; i < base.size(); ++i)
      held[i] =
          is_int(src) ? double(ref_float_to_int(src, base[i])) : ref_float_store(src, base[i]);
    std::vector<unsigned char> sbuf(base.size() * mg::dtype_size(src));
    for (std::size_t i = 0; i < held.size(); ++i) write_elem(sbuf, src, i, held[i]);
    for (DType dst : kAllDTypes) {
      std::vector<unsigned char> dbuf(base.size() * mg::dtype_size(dst), 0xAB);
      mg::convert_host(dbuf.data(), dst, sbuf.data(), src, base.size());
      for (std::size_t i = 0; i < base.size(); ++i) {
        const double got = read_elem(dbuf, dst, i);
        const double expected = ref_convert(dst, src, held[i]);
        const bool ok = (std::isnan(got) && std::isnan(expected)) ||
                        (got == expected && std::signbit(got) == std::signbit(expected));
        EXPECT_TRUE(ok) << mg::dtype_name(src) << " " << held[i] << " -> " << mg::dtype_name(dst)
                        << ": got " << got << ", expected " << expected;
      }
    }
  }
}

TEST(DtypeConversions, ConvertHostRoundingPaths) {
  // i64 -> f32 rounds once: 2^60 + 2^36 + 1 is above the midpoint 2^60 + 2^36, so it rounds up.
  // Through f64 first it would become the midpoint exactly and round to even (2^60).
  const int64_t big = (int64_t(1) << 60) + (int64_t(1) << 36) + 1;
  float f = 0;
  mg::convert_host(&f, DType::f32, &big, DType::i64, 1);
  EXPECT_EQ(double(f), 0x1p60 + 0x1p37);
  uint16_t bf = 0;
  mg::convert_host(&bf, DType::bf16, &big, DType::i64, 1);  // int64 -> float -> bf16, as c10
  EXPECT_EQ(bf, mg::f32_to_bf16_bits(0x1p60f + 0x1p37f));
  // f64 -> f16 goes through f32 (c10::Half(float(x))): 1 + 2^-11 + 2^-40 becomes the f16 midpoint
  // 1 + 2^-11 in f32, which ties to even (1.0), where a direct rounding would give 1 + 2^-10.
  const double d = 1.0 + 0x1p-11 + 0x1p-40;
  uint16_t h = 0;
  mg::convert_host(&h, DType::f16, &d, DType::f64, 1);
  EXPECT_EQ(h, 0x3C00);
  // Integer -> integer wraps, as torch's .to() and C++20 casts do.
  const int64_t wide[] = {(int64_t(1) << 40) + 5, -1, 300};
  int32_t narrow[3];
  mg::convert_host(narrow, DType::i32, wide, DType::i64, 3);
  EXPECT_EQ(narrow[0], 5);
  EXPECT_EQ(narrow[1], -1);
  uint8_t bytes[3];
  mg::convert_host(bytes, DType::u8, wide, DType::i64, 3);
  EXPECT_EQ(bytes[1], 255);
  EXPECT_EQ(bytes[2], 44);
  // Float -> integer out of range: x86-64's results, now defined.
  const float out_of_range[] = {3e9f,  -3e9f,  std::numeric_limits<float>::infinity(),
                                -1.0f, 300.0f, std::numeric_limits<float>::quiet_NaN()};
  int32_t ints[6];
  mg::convert_host(ints, DType::i32, out_of_range, DType::f32, 6);
  EXPECT_EQ(ints[0], INT32_MIN);
  EXPECT_EQ(ints[1], INT32_MIN);
  EXPECT_EQ(ints[2], INT32_MIN);
  EXPECT_EQ(ints[3], -1);
  EXPECT_EQ(ints[5], 0);
  uint8_t u8s[6];
  mg::convert_host(u8s, DType::u8, out_of_range, DType::f32, 6);
  EXPECT_EQ(u8s[3], 255);  // -1.0 -> 255
  EXPECT_EQ(u8s[4], 44);   // 300.0 -> 300 mod 256
  EXPECT_EQ(u8s[5], 0);
  int64_t longs[6];
  mg::convert_host(longs, DType::i64, out_of_range, DType::f32, 6);
  EXPECT_EQ(longs[0], 3000000000ll);
  EXPECT_EQ(longs[2], INT64_MIN);
}

TEST(DtypeConversions, ConvertHostLargeBuffersMatchElementwise) {
  // Above the OpenMP threshold, including the dedicated f32 -> bf16 path.
  std::mt19937 gen(3);
  std::vector<float> x(70001);
  for (auto& v : x) v = float_of(gen());
  std::vector<uint16_t> bf(x.size()), h(x.size());
  mg::convert_host(bf.data(), DType::bf16, x.data(), DType::f32, x.size());
  mg::convert_host(h.data(), DType::f16, x.data(), DType::f32, x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(bf[i], mg::f32_to_bf16_bits(x[i])) << i;
    ASSERT_EQ(h[i], mg::f32_to_f16_bits(x[i])) << i;
  }
}

TEST(DtypeNames, ParseAndName) {
  for (DType t : kAllDTypes) EXPECT_EQ(mg::parse_dtype(mg::dtype_name(t)), t);
  EXPECT_EQ(mg::parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(mg::parse_dtype("half"), DType::f16);
  EXPECT_EQ(mg::parse_dtype("float8_e4m3fn"), DType::fp8_e4m3);
  EXPECT_FALSE(mg::parse_dtype("float128").has_value());
  EXPECT_EQ(mg::dtype_size(DType::bf16), 2u);
  EXPECT_EQ(mg::dtype_size(DType::fp8_e5m2), 1u);
  EXPECT_TRUE(mg::is_floating(DType::fp8_e4m3));
  EXPECT_FALSE(mg::is_floating(DType::i64));
}

}  // namespace
