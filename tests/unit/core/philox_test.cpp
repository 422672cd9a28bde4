// Tests of the counter-based generator (megatron/core/random/philox.h): Philox4x32-10 against the
// Random123 known-answer vectors, the uniform / normal / dropout streams against their written
// definitions (recomputed here from the raw block function), and the moments of the draws.
// Header-only code: no runtime, no platform.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>

#include "megatron/core/random/philox.h"

namespace {

using mg::random::Philox4x32;
using mg::random::philox4x32_10;

struct Kat {
  uint32_t ctr[4];
  uint32_t key[2];
  uint32_t expected[4];
};

// Random123 kat_vectors, "philox4x32 10" lines (Salmon et al., SC'11).
constexpr Kat kKats[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

TEST(Philox, KnownAnswerVectors) {
  for (const Kat& k : kKats) {
    const Philox4x32 r =
        philox4x32_10(Philox4x32{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}}, k.key[0], k.key[1]);
    for (int lane = 0; lane < 4; ++lane)
      EXPECT_EQ(r.v[lane], k.expected[lane])
          << "lane " << lane << " for counter " << std::hex << k.ctr[0] << " key " << k.key[0];
  }
}

// The raw 32-bit stream, written from the definition in philox.h: element e is lane e % 4 of the
// block with counter (lo32(e/4), hi32(e/4), 0, 0) and key (lo32(seed), hi32(seed)).
uint32_t ref_u32(uint64_t seed, uint64_t e) {
  const uint64_t block = e / 4;
  const Philox4x32 r =
      philox4x32_10(Philox4x32{{uint32_t(block & 0xffffffffu), uint32_t(block >> 32), 0u, 0u}},
                    uint32_t(seed & 0xffffffffu), uint32_t(seed >> 32));
  return r.v[e % 4];
}

// Seeds and counters with high halves set, so lo/hi placement is exercised.
constexpr uint64_t kSeeds[] = {0, 1, 1234, 0x0123456789abcdefull, ~0ull};
constexpr uint64_t kCounters[] = {
    0, 1, 2, 3, 4, 5, 7, 1000003, (1ull << 32) + 5, (1ull << 34) + 2, 0xfedcba9876543210ull};

TEST(Philox, UniformStreamDefinition) {
  for (uint64_t seed : kSeeds)
    for (uint64_t e : kCounters) {
      const uint32_t u = ref_u32(seed, e);
      EXPECT_EQ(mg::random::uniform_u32(seed, e), u) << "seed " << seed << " e " << e;
      const float expected = static_cast<float>(u >> 8) / 16777216.0f;  // exact: 24 bits
      EXPECT_EQ(mg::random::uniform(seed, e), expected) << "seed " << seed << " e " << e;
    }
}

TEST(Philox, NormalStreamDefinition) {
  for (uint64_t seed : kSeeds)
    for (uint64_t e : kCounters) {
      // Box-Muller on lanes (2*(e%2), 2*(e%2)+1) of block e/2, written out in f64.
      const uint64_t block = e / 2;
      const Philox4x32 r =
          philox4x32_10(Philox4x32{{uint32_t(block & 0xffffffffu), uint32_t(block >> 32), 0u, 0u}},
                        uint32_t(seed & 0xffffffffu), uint32_t(seed >> 32));
      const int lane = static_cast<int>(e % 2) * 2;
      const double u1 = (double(r.v[lane]) + 1.0) / 4294967296.0;
      const double u2 = double(r.v[lane + 1]) / 4294967296.0;
      const double radius = std::sqrt(-2.0 * std::log(u1));
      const double angle = 2.0 * M_PI * u2;
      const double expected = radius * (e % 2 ? std::sin(angle) : std::cos(angle));
      EXPECT_NEAR(mg::random::normal(seed, e), expected, 1e-14 * (1 + std::abs(expected)))
          << "seed " << seed << " e " << e;
    }
}

TEST(Philox, UniformRangeAndMoments) {
  constexpr int kN = 100000;
  const uint64_t seed = 20240601;
  double sum = 0, sum2 = 0;
  float lo = 1, hi = 0;
  for (int i = 0; i < kN; ++i) {
    const float u = mg::random::uniform(seed, static_cast<uint64_t>(i));
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    sum += u;
    sum2 += double(u) * u;
  }
  const double mean = sum / kN, var = sum2 / kN - mean * mean;
  EXPECT_GE(lo, 0.0f);
  EXPECT_LT(hi, 1.0f);
  // Standard errors: mean sqrt(1/12/N) = 9.1e-4, variance ~ sqrt(1/180/N) = 2.4e-4; 5 sigma.
  EXPECT_NEAR(mean, 0.5, 5 * 9.2e-4);
  EXPECT_NEAR(var, 1.0 / 12.0, 5 * 2.4e-4);
  EXPECT_LT(lo, 1e-3f);
  EXPECT_GT(hi, 1.0f - 1e-3f);
}

TEST(Philox, NormalMoments) {
  constexpr int kN = 100000;
  const uint64_t seed = 99;
  double s1 = 0, s2 = 0, s3 = 0, s4 = 0;
  for (int i = 0; i < kN; ++i) {
    const double z = mg::random::normal(seed, static_cast<uint64_t>(i));
    ASSERT_TRUE(std::isfinite(z)) << "element " << i;
    s1 += z;
    s2 += z * z;
    s3 += z * z * z;
    s4 += z * z * z * z;
  }
  const double mean = s1 / kN, m2 = s2 / kN, m3 = s3 / kN, m4 = s4 / kN;
  // Standard errors of the raw moments of N(0,1): sqrt(1/N), sqrt(2/N), sqrt(15/N), sqrt(96/N).
  EXPECT_NEAR(mean, 0.0, 5 * 3.2e-3);
  EXPECT_NEAR(m2, 1.0, 5 * 4.5e-3);
  EXPECT_NEAR(m3, 0.0, 5 * 1.3e-2);
  EXPECT_NEAR(m4, 3.0, 5 * 3.1e-2);
}

TEST(Philox, StreamsDependOnSeedAndCounter) {
  std::set<uint32_t> seen;
  for (uint64_t seed : {1ull, 2ull, (1ull << 32) + 1})
    for (uint64_t e = 0; e < 64; ++e) seen.insert(mg::random::uniform_u32(seed, e));
  EXPECT_EQ(seen.size(), 3u * 64u);  // a collision among 192 random u32 is ~4e-6 likely
}

TEST(Philox, DropoutKeepRate) {
  constexpr int kN = 100000;
  for (float p : {0.1f, 0.5f, 0.9f}) {
    int kept = 0;
    for (int i = 0; i < kN; ++i) {
      const bool keep = mg::random::dropout_keep(7, static_cast<uint64_t>(i), p);
      EXPECT_EQ(keep, mg::random::uniform(7, static_cast<uint64_t>(i)) >= p);
      kept += keep;
    }
    const double rate = double(kept) / kN;
    const double se = std::sqrt(p * (1 - p) / kN);
    EXPECT_NEAR(rate, 1.0 - p, 5 * se) << "p " << p;
  }
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(mg::random::dropout_keep(3, uint64_t(i), 0.0f));
}

}  // namespace
