// Sampling (megatron/core/inference/sampling.h): greedy is the argmax; temperature / top-k / top-p
// filter as a naive reference computed here says (sort, cut, renormalise); draws with a fixed seed
// follow that distribution (frequency within 5 sigma over 40,000 draws), never pick a filtered id,
// and repeat exactly for the same seed; bad values are refused naming the flag.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/inference/sampling.h"

namespace mg::inference {
namespace {

const std::vector<float> kLogits = {0.3f, 2.0f, -1.0f, 1.5f, 0.9f, 2.0f, -0.2f, 1.1f, 0.0f, 0.5f};

// Independent reference: softmax(l / T) over all ids, keep the k most likely, then the shortest
// prefix (by probability, renormalised over the top-k) whose mass before the last kept id is
// <= p, renormalise.
std::vector<double> reference(const std::vector<float>& l, double t, int64_t k, double p) {
  const std::size_t v = l.size();
  std::vector<std::size_t> idx(v);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](auto a, auto b) { return l[a] > l[b]; });
  std::vector<bool> kept(v, true);
  if (k > 0)
    for (std::size_t r = static_cast<std::size_t>(k); r < v; ++r) kept[idx[r]] = false;
  std::vector<double> e(v, 0.0);
  double z = 0.0;
  for (std::size_t i = 0; i < v; ++i)
    if (kept[i]) z += e[i] = std::exp(l[i] / t);
  if (p > 0.0) {
    double cum = 0.0;
    for (std::size_t r = 0; r < v; ++r) {
      if (!kept[idx[r]]) continue;
      if (r > 0 && cum > p) kept[idx[r]] = false;
      cum += e[idx[r]] / z;
    }
  }
  double z2 = 0.0;
  for (std::size_t i = 0; i < v; ++i) z2 += kept[i] ? e[i] : 0.0;
  std::vector<double> out(v, 0.0);
  for (std::size_t i = 0; i < v; ++i) out[i] = kept[i] ? e[i] / z2 : 0.0;
  return out;
}

TEST(Sampling, GreedyIsArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.greedy = true;
  Sampler s(p);
  EXPECT_EQ(s.sample(kLogits), 1);  // ids 1 and 5 tie at 2.0
  SamplingParams k1;
  k1.top_k = 1;
  EXPECT_EQ(Sampler(k1).sample(kLogits), 1);
  const auto d = sampling_distribution(kLogits, p);
  EXPECT_EQ(d[1], 1.0);
  EXPECT_EQ(std::accumulate(d.begin(), d.end(), 0.0), 1.0);
}

struct Case {
  double t;
  int64_t k;
  double p;
};

class SamplingDistribution : public ::testing::TestWithParam<Case> {};

TEST_P(SamplingDistribution, MatchesReferenceAndDrawsFollowIt) {
  const Case c = GetParam();
  SamplingParams sp;
  sp.temperature = c.t;
  sp.top_k = c.k;
  sp.top_p = c.p;
  sp.seed = 42;
  const std::vector<double> ref = reference(kLogits, c.t, c.k, c.p);
  const std::vector<double> got = sampling_distribution(kLogits, sp);
  ASSERT_EQ(got.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-12) << "id " << i;

  const int n = 40000;
  std::vector<int> count(kLogits.size(), 0);
  Sampler s(sp), again(sp);
  for (int i = 0; i < n; ++i) {
    const int64_t a = s.sample(kLogits);
    ASSERT_EQ(a, again.sample(kLogits)) << "same seed, draw " << i;
    ++count[static_cast<std::size_t>(a)];
  }
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (ref[i] == 0.0) {
      EXPECT_EQ(count[i], 0) << "id " << i << " is filtered out but was drawn";
      continue;
    }
    const double f = static_cast<double>(count[i]) / n;
    const double sigma = std::sqrt(ref[i] * (1.0 - ref[i]) / n);
    EXPECT_NEAR(f, ref[i], 5.0 * sigma + 1e-9) << "id " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Params, SamplingDistribution,
                         ::testing::Values(Case{1.0, 0, 0.0}, Case{0.7, 0, 0.0}, Case{1.0, 3, 0.0},
                                           Case{1.0, 0, 0.6}, Case{1.3, 5, 0.8}, Case{0.5, 4, 0.9},
                                           Case{1.0, 0, 1.0}));

TEST(Sampling, DifferentSeedsDiffer) {
  SamplingParams a, b;
  a.seed = 1;
  b.seed = 2;
  Sampler sa(a), sb(b);
  int differ = 0;
  for (int i = 0; i < 100; ++i) differ += sa.sample(kLogits) != sb.sample(kLogits);
  EXPECT_GT(differ, 10);
}

TEST(Sampling, BadValuesNameTheFlag) {
  auto expect_error = [](SamplingParams p, const char* flag) {
    try {
      Sampler s(p);
      ADD_FAILURE() << "no error for " << flag;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
    }
  };
  SamplingParams t;
  t.temperature = 0.0;
  expect_error(t, "--temperature");
  SamplingParams k;
  k.top_k = -1;
  expect_error(k, "--top-k");
  SamplingParams p;
  p.top_p = 1.5;
  expect_error(p, "--top-p");
}

}  // namespace
}  // namespace mg::inference
