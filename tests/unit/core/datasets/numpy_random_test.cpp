// Tests of NumpyRandomState (megatron/core/datasets/numpy_random.h) against numpy itself: the
// golden file tests/fixtures/gpt_dataset/numpy_golden.txt was written by gen_numpy_fixture.py from
// numpy.random.RandomState (raw uint32 streams across several MT regenerations, array seeding,
// random_sample, chains of shuffles on one state, permutations); compared bit for bit. Also the
// FORMATS.md §3.5 check values and std::mt19937 as an independent MT19937.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/datasets/numpy_random.h"

namespace mg::datasets {
namespace {

std::vector<std::string> golden_lines() {
  std::ifstream in(std::string(MG_TEST_FIXTURES_DIR) + "/gpt_dataset/numpy_golden.txt");
  EXPECT_TRUE(in.good()) << "missing numpy_golden.txt";
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

template <typename T>
std::vector<T> read_n(std::istringstream& is, std::size_t n) {
  std::vector<T> v(n);
  for (auto& e : v) is >> e;
  return v;
}

TEST(NumpyRandom, SpecCheckValues) {
  NumpyRandomState r0(0);
  EXPECT_EQ(r0.random_sample(), 0.5488135039273248);
  NumpyRandomState r42(42);
  EXPECT_EQ(r42.permutation(10), (std::vector<int64_t>{8, 1, 5, 0, 7, 2, 9, 4, 3, 6}));
  NumpyRandomState r(1234);
  EXPECT_EQ(r.next_uint32(), 822569775u);
  EXPECT_EQ(r.next_uint32(), 2137449171u);
  EXPECT_EQ(r.next_uint32(), 2671936806u);
  NumpyRandomState s(1234);
  std::vector<int> a10(10), a20(20);
  for (int i = 0; i < 10; ++i) a10[i] = i;
  for (int i = 0; i < 20; ++i) a20[i] = i;
  s.shuffle(a10);
  s.shuffle(a20);
  EXPECT_EQ(a10, (std::vector<int>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  EXPECT_EQ(a20, (std::vector<int>{8, 1, 15, 4, 3, 7,  18, 10, 14, 13,
                                   2, 6, 19, 0, 5, 17, 16, 12, 11, 9}));
}

TEST(NumpyRandom, MatchesStdMt19937) {
  for (uint32_t seed : {0u, 1u, 5489u, 4294967295u}) {
    NumpyRandomState r(seed);
    std::mt19937 ref(seed);
    for (int i = 0; i < 2000; ++i)
      ASSERT_EQ(r.next_uint32(), ref()) << "seed " << seed << " i " << i;
  }
}

TEST(NumpyRandom, GoldenStreams) {
  int streams = 0, arrays = 0;
  for (const std::string& line : golden_lines()) {
    std::istringstream is(line);
    std::string kind;
    is >> kind;
    if (kind == "stream") {
      uint32_t seed;
      std::size_t n;
      is >> seed >> n;
      const auto want = read_n<uint32_t>(is, n);
      NumpyRandomState r(seed);
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(r.next_uint32(), want[i]) << "seed " << seed << " i " << i;
      ++streams;
    } else if (kind == "stream_array") {
      std::size_t k, n;
      is >> k;
      const auto key = read_n<uint32_t>(is, k);
      is >> n;
      const auto want = read_n<uint32_t>(is, n);
      NumpyRandomState r{std::span<const uint32_t>(key)};
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(r.next_uint32(), want[i]) << "key size " << k << " i " << i;
      ++arrays;
    }
  }
  EXPECT_EQ(streams, 3);
  EXPECT_EQ(arrays, 3);
}

TEST(NumpyRandom, GoldenRandomSample) {
  int cases = 0;
  for (const std::string& line : golden_lines()) {
    std::istringstream is(line);
    std::string kind;
    is >> kind;
    if (kind != "sample") continue;
    uint32_t seed;
    std::size_t n;
    is >> seed >> n;
    NumpyRandomState r(seed);
    for (std::size_t i = 0; i < n; ++i) {
      std::string tok;
      is >> tok;
      EXPECT_EQ(r.random_sample(), std::strtod(tok.c_str(), nullptr)) << "seed " << seed;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 2);
}

TEST(NumpyRandom, GoldenShufflesAndPermutations) {
  const std::vector<std::string> lines = golden_lines();
  int chains = 0, perms = 0;
  for (std::size_t l = 0; l < lines.size(); ++l) {
    std::istringstream is(lines[l]);
    std::string kind;
    is >> kind;
    if (kind == "shuffle_chain") {
      uint32_t seed;
      std::size_t k;
      is >> seed >> k;
      const auto ns = read_n<std::size_t>(is, k);
      NumpyRandomState r(seed);
      for (std::size_t c = 0; c < k; ++c) {
        std::istringstream vs(lines[++l]);
        const auto want = read_n<uint32_t>(vs, ns[c]);
        std::vector<uint32_t> a(ns[c]);  // dtype does not change the draws
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint32_t>(i);
        r.shuffle(a);
        EXPECT_EQ(a, want) << "seed " << seed << " shuffle #" << c << " of n=" << ns[c];
      }
      ++chains;
    } else if (kind == "permutation") {
      uint32_t seed;
      int64_t n;
      is >> seed >> n;
      const auto want = read_n<int64_t>(is, static_cast<std::size_t>(n));
      NumpyRandomState r(seed);
      EXPECT_EQ(r.permutation(n), want) << "seed " << seed << " n " << n;
      ++perms;
    }
  }
  EXPECT_EQ(chains, 5);
  EXPECT_EQ(perms, 5);
}

TEST(NumpyRandom, RandomIntervalBounds) {
  NumpyRandomState r(3);
  EXPECT_EQ(r.random_interval(0), 0u);
  for (uint64_t max : {1ull, 2ull, 7ull, 1000ull, 0xffffffffull, 0x1ffffffffull}) {
    for (int i = 0; i < 200; ++i) EXPECT_LE(r.random_interval(max), max);
  }
}

TEST(NumpyRandom, EmptySeedArrayThrows) {
  const std::vector<uint32_t> empty;
  EXPECT_THROW(NumpyRandomState{std::span<const uint32_t>(empty)}, mg::Error);
}

}  // namespace
}  // namespace mg::datasets
