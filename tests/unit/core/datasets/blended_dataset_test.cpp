// Tests of BlendedDataset (megatron/core/datasets/blended_dataset.h): the FORMATS.md §3.11 test
// vectors for the greedy and exhaustive builds, the t = max(s, 1) rule, weight normalisation
// against numpy (tests/fixtures/mock_gpt/pcg64_golden.txt "normalize" lines), blend parsing,
// per-dataset sample counts, the over-request error, and sample access over real GPTDatasets.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/datasets/blended_dataset.h"

namespace mg::datasets {
namespace {

using I16 = std::vector<int16_t>;
using I64 = std::vector<int64_t>;

TEST(Blending, GreedySpecVectors) {
  const std::vector<double> w1 = {0.3, 0.7};
  const BlendingIndices a = build_blending_indices(w1, 10);
  EXPECT_EQ(a.dataset_index, (I16{1, 0, 1, 1, 0, 1, 1, 0, 1, 1}));
  EXPECT_EQ(a.dataset_sample_index, (I64{0, 0, 1, 2, 1, 3, 4, 2, 5, 6}));
  const std::vector<double> w2 = {0.5, 0.25, 0.25};
  const BlendingIndices b = build_blending_indices(w2, 8);
  EXPECT_EQ(b.dataset_index, (I16{0, 1, 2, 0, 0, 1, 2, 0}));
  EXPECT_EQ(b.dataset_sample_index, (I64{0, 0, 0, 1, 2, 1, 1, 3}));
  EXPECT_TRUE(build_blending_indices(w2, 0).dataset_index.empty());
}

TEST(Blending, ExhaustiveSpecVector) {
  const BlendingIndices e = build_exhaustive_blending_indices(I64{3, 5});
  EXPECT_EQ(e.dataset_index, (I16{1, 0, 1, 0, 1, 1, 0, 1}));
  EXPECT_EQ(e.dataset_sample_index, (I64{0, 0, 1, 1, 2, 3, 2, 4}));
  // Every sample of every dataset exactly once; an empty dataset is never picked.
  const BlendingIndices z = build_exhaustive_blending_indices(I64{0, 4, 1});
  ASSERT_EQ(z.dataset_index.size(), 5u);
  std::vector<int64_t> seen(3, 0);
  for (std::size_t k = 0; k < 5; ++k) {
    EXPECT_EQ(z.dataset_sample_index[k], seen[static_cast<std::size_t>(z.dataset_index[k])]++);
  }
  EXPECT_EQ(seen, (I64{0, 4, 1}));
}

TEST(Blending, TimeIsMaxOfSampleAndOne) {
  // The off-by-one pitfall. With t = s (idx * w) every error is 0 at s = 0 and dataset 0 would go
  // first; the reference picks the heaviest. With t = s + 1 ((idx + 1) * w) step 7 compares
  // 0.3*8-2 = 0.4 < 0.7*8-5 = 0.6 and picks 1; with t = 7 it is 0.1 > -0.1 and picks 0.
  const std::vector<double> w = {0.3, 0.7};
  const BlendingIndices a = build_blending_indices(w, 8);
  EXPECT_EQ(a.dataset_index[0], 1);
  EXPECT_EQ(a.dataset_index[7], 0);
  // s = 0 and s = 1 both use t = 1: equal weights alternate, lowest index first on ties.
  const std::vector<double> h = {0.5, 0.5};
  EXPECT_EQ(build_blending_indices(h, 4).dataset_index, (I16{0, 1, 0, 1}));
}

TEST(Blending, NormalizeMatchesNumpy) {
  std::ifstream in(std::string(MG_TEST_FIXTURES_DIR) + "/mock_gpt/pcg64_golden.txt");
  ASSERT_TRUE(in.good());
  int cases = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("normalize ", 0) != 0) continue;
    std::istringstream is(line.substr(10));
    std::size_t n = 0;
    is >> n;
    std::vector<double> w(n), r(n);
    for (auto& v : w) is >> v;
    for (auto& v : r) is >> v;
    EXPECT_EQ(normalize_weights(w), r) << "case with " << n << " weights";
    ++cases;
  }
  EXPECT_EQ(cases, 5);
  EXPECT_THROW(normalize_weights(std::vector<double>{0.0, 0.0}), Error);
  EXPECT_THROW(normalize_weights(std::vector<double>{1.0, -0.5}), Error);
}

TEST(Blending, ParseBlend) {
  const std::vector<std::string> pairs = {"0.3", "a", "0.7", "b"};
  const BlendSpec p = parse_blend(pairs);
  EXPECT_EQ(p.prefixes, (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(p.weights.has_value());
  EXPECT_EQ(*p.weights, (std::vector<double>{0.3, 0.7}));

  const std::vector<std::string> odd = {"1", "a", "b"};
  const BlendSpec o = parse_blend(odd);
  EXPECT_EQ(o.prefixes, odd);
  EXPECT_FALSE(o.weights.has_value());

  const std::vector<std::string> prefixes = {"a", "b"};
  EXPECT_FALSE(parse_blend(prefixes).weights.has_value());
  const std::vector<std::string> one = {"data/x_text_document"};
  EXPECT_EQ(parse_blend(one).prefixes, one);
  // A weight that does not parse turns the whole list into prefixes.
  const std::vector<std::string> bad = {"0.3", "a", "0.7x", "b"};
  const BlendSpec q = parse_blend(bad);
  EXPECT_EQ(q.prefixes, bad);
  EXPECT_FALSE(q.weights.has_value());
  EXPECT_THROW(parse_blend(std::vector<std::string>{}), Error);
}

TEST(Blending, SamplesPerDataset) {
  const std::vector<double> w = normalize_weights(std::vector<double>{3.0, 7.0});
  // ceil(1000*0.3) = 300 -> ceil(300 * 1.005) = 302; 700 -> ceil(703.5) = 704.
  EXPECT_EQ(blend_num_samples(w, 1000), (I64{302, 704}));
  EXPECT_EQ(blend_num_samples(w, 1000, 0.0), (I64{300, 700}));
  // The blended size can exceed n: ceil(10/3) three times.
  const std::vector<double> t = normalize_weights(std::vector<double>{1.0, 1.0, 1.0});
  EXPECT_EQ(blended_size(t, 10), 12);
  EXPECT_EQ(blended_size(w, 1000), 1000);
}

TEST(Blending, OverRequestNamesTheDataset) {
  const std::vector<double> w = {0.3, 0.7};
  const BlendingIndices a = build_blending_indices(w, 10);  // asks 3 of dataset 0, 7 of 1
  EXPECT_NO_THROW(check_blend_bounds(a, I64{3, 7}));
  try {
    const std::vector<std::string> names = {"web", "books"};
    check_blend_bounds(a, I64{3, 6}, names);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'books'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("7 samples"), std::string::npos) << msg;
    EXPECT_NE(msg.find("only 6"), std::string::npos) << msg;
  }
  try {
    check_blend_bounds(a, I64{2, 7});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dataset 0"), std::string::npos) << e.what();
  }
}

// An in-memory corpus: sequence i is [100*i, 100*i + len_i).
class VectorSource final : public SequenceSource {
 public:
  explicit VectorSource(std::vector<int64_t> lengths) : lengths_(std::move(lengths)) {}
  std::size_t sequence_count() const override { return lengths_.size(); }
  int64_t sequence_length(std::size_t i) const override { return lengths_.at(i); }
  std::vector<int64_t> read(std::size_t i, int64_t offset, int64_t length) const override {
    std::vector<int64_t> out;
    for (int64_t j = offset; j < offset + length; ++j)
      out.push_back(100 * static_cast<int64_t>(i) + j);
    return out;
  }

 private:
  std::vector<int64_t> lengths_;
};

TEST(BlendedDataset, SampleAccess) {
  VectorSource src_a({5, 3, 7, 2}), src_b({8, 4, 6, 1, 9});
  GPTIndexConfig config;
  config.sequence_length = 4;
  const std::vector<double> w = normalize_weights(std::vector<double>{0.3, 0.7});
  const I64 per = blend_num_samples(w, 10);
  const GPTDataset a(src_a, {0, 1, 2, 3}, per[0], config);
  const GPTDataset b(src_b, {0, 1, 2, 3, 4}, per[1], config);
  const BlendedDataset blend({&a, &b}, std::vector<double>{3.0, 7.0}, blended_size(w, 10));
  ASSERT_EQ(blend.size(), 10);
  const I16 expect_d = {1, 0, 1, 1, 0, 1, 1, 0, 1, 1};
  const I64 expect_s = {0, 0, 1, 2, 1, 3, 4, 2, 5, 6};
  for (int64_t k = 0; k < 10; ++k) {
    const auto [d, s] = blend.locate(k);
    EXPECT_EQ(d, expect_d[static_cast<std::size_t>(k)]);
    EXPECT_EQ(s, expect_s[static_cast<std::size_t>(k)]);
    const BlendedSample got = blend.get(k);
    EXPECT_EQ(got.dataset_id, d);
    EXPECT_EQ(got.sample.tokens, (d == 0 ? a : b).get(s).tokens) << "sample " << k;
  }
  EXPECT_THROW(blend.locate(10), Error);

  // No weights and no size: exhaustive over every sample, weights = lengths.
  const BlendedDataset all({&a, &b}, std::nullopt, std::nullopt);
  EXPECT_EQ(all.size(), a.size() + b.size());
  EXPECT_EQ(all.weights()[0],
            static_cast<double>(a.size()) / static_cast<double>(a.size() + b.size()));
  // No weights with a size: greedy, capped at the total.
  const BlendedDataset capped({&a, &b}, std::nullopt, 1000);
  EXPECT_EQ(capped.size(), a.size() + b.size());
  // Weighted blends need a size; asking a dataset for more than it has throws.
  EXPECT_THROW(BlendedDataset({&a, &b}, std::vector<double>{1.0, 1.0}, std::nullopt), Error);
  EXPECT_THROW(BlendedDataset({&a, &b}, std::vector<double>{1.0, 1.0}, 4 * (a.size() + b.size())),
               Error);
}

}  // namespace
}  // namespace mg::datasets
