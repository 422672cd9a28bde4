// Tests of the GPT dataset indices (megatron/core/datasets/gpt_dataset.h) against FORMATS.md §3:
// the end-to-end vector of §3.13 typed in from the spec (indices and sample contents), split
// bookends and id ranges, and Megatron cases with E > 1 (separate and joint final epoch), x = 0,
// kept partial samples and S = 1 from tests/fixtures/gpt_dataset/numpy_golden.txt. The spec gives
// no vector for E > 1: those come from gen_numpy_fixture.py's Python re-implementation of
// gpt_dataset.py / helpers.cpp running on numpy itself. Plus the error cases.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/datasets/gpt_dataset.h"

namespace mg::datasets {
namespace {

// Token p of sequence s is s*100 + p (§3.13's labelling).
class LabelledSource final : public SequenceSource {
 public:
  explicit LabelledSource(std::vector<int32_t> lengths) : lengths_(std::move(lengths)) {}
  std::size_t sequence_count() const override { return lengths_.size(); }
  int64_t sequence_length(std::size_t i) const override { return lengths_.at(i); }
  std::vector<int64_t> read(std::size_t i, int64_t offset, int64_t length) const override {
    EXPECT_GE(offset, 0);
    EXPECT_LE(offset + length, lengths_.at(i)) << "read past sequence " << i;
    std::vector<int64_t> v(static_cast<std::size_t>(length));
    for (int64_t p = 0; p < length; ++p)
      v[static_cast<std::size_t>(p)] = static_cast<int64_t>(i) * 100 + offset + p;
    return v;
  }

 private:
  std::vector<int32_t> lengths_;
};

const std::vector<int32_t> kSpecLengths = {5, 3, 7, 2, 8, 4, 6, 1, 9, 5};

std::vector<int32_t> iota_ids(int n) {
  std::vector<int32_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(GPTDataset, Spec313Indices) {
  GPTIndexConfig cfg;
  cfg.sequence_length = 8;
  const GPTIndices g = build_gpt_indices(kSpecLengths, iota_ids(10), std::nullopt, cfg);
  EXPECT_EQ(g.tokens_per_epoch, 50);
  EXPECT_EQ(g.num_epochs, 1);
  EXPECT_EQ(g.document_index, (std::vector<int32_t>{7, 2, 9, 1, 0, 8, 4, 5, 6, 3}));
  EXPECT_EQ(g.sample_index, (std::vector<int64_t>{0, 0, 2, 0, 4, 0, 5, 3, 6, 2, 7, 2, 9, 0}));
  EXPECT_EQ(g.num_samples(), 6);
  EXPECT_EQ(g.shuffle_index, (std::vector<int64_t>{5, 0, 3, 4, 2, 1}));
}

TEST(GPTDataset, Spec313Samples) {
  LabelledSource src(kSpecLengths);
  GPTIndexConfig cfg;
  cfg.sequence_length = 8;
  GPTDataset ds(src, iota_ids(10), std::nullopt, cfg);
  ASSERT_EQ(ds.size(), 6);
  // k=0 -> j=5: document_index[7..9] = 5, 6, 3; from (7,2) to (9,0).
  auto [t0, ids0] = ds.raw_sample(0);
  EXPECT_EQ(t0, (std::vector<int64_t>{502, 503, 600, 601, 602, 603, 604, 605, 300}));
  EXPECT_EQ(ids0, (std::vector<int64_t>{5, 6, 3}));
  auto [t1, ids1] = ds.raw_sample(1);
  EXPECT_EQ(t1, (std::vector<int64_t>{700, 200, 201, 202, 203, 204, 205, 206, 900}));
  EXPECT_EQ(ids1, (std::vector<int64_t>{7, 2, 9}));
  // Every sample is S + 1 tokens and consecutive samples (by j) share one token: the flat view.
  std::vector<int64_t> flat;
  for (int32_t d : ds.indices().document_index) {
    for (int p = 0; p < kSpecLengths[static_cast<std::size_t>(d)]; ++p) flat.push_back(d * 100 + p);
  }
  for (int64_t k = 0; k < ds.size(); ++k) {
    const int64_t j = ds.indices().shuffle_index[static_cast<std::size_t>(k)];
    const std::vector<int64_t> want(flat.begin() + j * 8, flat.begin() + j * 8 + 9);
    EXPECT_EQ(ds.raw_sample(k).first, want) << "k " << k;
    const GPTSample s = ds.get(k);
    EXPECT_EQ(s.tokens, std::vector<int64_t>(want.begin(), want.begin() + 8));
    EXPECT_EQ(s.labels, std::vector<int64_t>(want.begin() + 1, want.end()));
    EXPECT_EQ(s.loss_mask, std::vector<float>(8, 1.0f));
    EXPECT_EQ(s.position_ids, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  }
}

TEST(GPTDataset, SplitBookendsSpec) {
  const SplitBookends a = parse_split("99,1,0");
  ASSERT_TRUE(a[0] && a[1]);
  EXPECT_FALSE(a[2]);
  EXPECT_EQ(a[0]->first, 0.0);
  EXPECT_EQ(a[0]->second, 0.99);
  EXPECT_EQ(a[1]->second, 1.0);
  EXPECT_EQ(split_index_range(*a[0], 10), (std::pair<int64_t, int64_t>{0, 10}));
  EXPECT_EQ(split_index_range(*a[1], 10), (std::pair<int64_t, int64_t>{10, 10}));
  const SplitBookends b = parse_split("969, 30, 1");
  ASSERT_TRUE(b[0] && b[1] && b[2]);
  EXPECT_EQ(b[0]->second, 0.969);
  EXPECT_EQ(b[2]->second, 1.0);
  // Round half to even: 0.5 * 5 = 2.5 -> 2, 0.5 * 7 = 3.5 -> 4.
  const SplitBookends h = parse_split("1,1");
  EXPECT_EQ(split_index_range(*h[0], 5).second, 2);
  EXPECT_EQ(split_index_range(*h[0], 7).second, 4);
}

// "split <str> <N> 3x(start end) 3x(beg end)" lines from numpy_golden.txt.
TEST(GPTDataset, GoldenSplits) {
  std::ifstream in(std::string(MG_TEST_FIXTURES_DIR) + "/gpt_dataset/numpy_golden.txt");
  ASSERT_TRUE(in.good());
  int cases = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream is(line);
    std::string kind, split;
    int64_t n;
    if (!(is >> kind) || kind != "split") continue;
    is >> split >> n;
    std::string tok[12];
    for (auto& t : tok) is >> t;
    const SplitBookends got = parse_split(split);
    for (int s = 0; s < 3; ++s) {
      if (tok[2 * s] == "none") {
        EXPECT_FALSE(got[s]) << split << " split " << s;
        continue;
      }
      ASSERT_TRUE(got[s]) << split << " split " << s;
      EXPECT_EQ(got[s]->first, std::strtod(tok[2 * s].c_str(), nullptr)) << split;
      EXPECT_EQ(got[s]->second, std::strtod(tok[2 * s + 1].c_str(), nullptr)) << split;
      const auto r = split_index_range(*got[s], n);
      EXPECT_EQ(r.first, std::stoll(tok[6 + 2 * s])) << split << " N " << n;
      EXPECT_EQ(r.second, std::stoll(tok[7 + 2 * s])) << split << " N " << n;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 35);
}

template <typename T>
std::vector<T> rest(std::istringstream& is) {
  std::vector<T> v;
  for (T e; is >> e;) v.push_back(e);
  return v;
}

TEST(GPTDataset, GoldenMegatronCases) {
  std::ifstream in(std::string(MG_TEST_FIXTURES_DIR) + "/gpt_dataset/numpy_golden.txt");
  ASSERT_TRUE(in.good());
  int cases = 0, separate = 0, multi = 0;
  for (std::string line; std::getline(in, line);) {
    std::istringstream head(line);
    std::string kind, name, ns;
    if (!(head >> kind) || kind != "gpt") continue;
    GPTIndexConfig cfg;
    int drop = 0;
    head >> name >> cfg.sequence_length >> cfg.add_extra_token_to_sequence >> cfg.random_seed >>
        ns >> drop;
    cfg.drop_last_partial_sequence = drop != 0;
    const std::optional<int64_t> num_samples =
        ns == "none" ? std::nullopt : std::optional<int64_t>(std::stoll(ns));
    std::vector<int32_t> lengths, ids, doc;
    std::vector<int64_t> sample, shuffle;
    int64_t epochs = 0;
    int sep = 0;
    for (std::string l; std::getline(in, l) && l != "end";) {
      std::istringstream is(l);
      std::string key;
      is >> key;
      if (key == "lengths") lengths = rest<int32_t>(is);
      if (key == "indices") ids = rest<int32_t>(is);
      if (key == "epochs") is >> epochs >> sep;
      if (key == "document_index") doc = rest<int32_t>(is);
      if (key == "sample_index") sample = rest<int64_t>(is);
      if (key == "shuffle_index") shuffle = rest<int64_t>(is);
    }
    const GPTIndices g = build_gpt_indices(lengths, ids, num_samples, cfg);
    EXPECT_EQ(g.num_epochs, epochs) << name;
    EXPECT_EQ(g.separate_final_epoch, sep != 0) << name;
    EXPECT_EQ(g.document_index, doc) << name;
    EXPECT_EQ(g.sample_index, sample) << name;
    EXPECT_EQ(g.shuffle_index, shuffle) << name;
    // Fetch every sample: S + x tokens, padded only when partial samples are kept.
    LabelledSource src(lengths);
    GPTDataset ds(src, ids, num_samples, cfg);
    for (int64_t k = 0; k < ds.size(); ++k) {
      EXPECT_EQ(ds.raw_sample(k).first.size(),
                static_cast<std::size_t>(cfg.sequence_length + cfg.add_extra_token_to_sequence));
    }
    ++cases;
    separate += sep;
    multi += epochs > 1;
  }
  EXPECT_EQ(cases, 8);
  EXPECT_GE(separate, 2);
  EXPECT_GE(multi, 4);
}

TEST(GPTDataset, PartialSampleIsPadded) {
  // x=1, kept partial: the last sample (by j) runs out and is padded with pad_id; labels equal to
  // pad get loss_mask 0 and become 0.
  LabelledSource src(kSpecLengths);
  GPTIndexConfig cfg;
  cfg.sequence_length = 8;
  cfg.random_seed = 5;
  cfg.drop_last_partial_sequence = false;
  GPTDataset ds(src, iota_ids(10), std::nullopt, cfg);
  ASSERT_EQ(ds.size(), 7);  // ceil(49 / 8)
  int padded = 0;
  for (int64_t k = 0; k < ds.size(); ++k) {
    const auto [text, ids] = ds.raw_sample(k);
    if (text.back() != -1) continue;
    ++padded;
    const GPTSample s = ds.get(k);
    EXPECT_EQ(s.labels.back(), 0);
    EXPECT_EQ(s.loss_mask.back(), 0.0f);
  }
  EXPECT_EQ(padded, 1);  // sample j=6 holds flat tokens 48, 49 and 7 pads
}

TEST(GPTDataset, NoExtraTokenLabelsRollLeft) {
  // x=0: tokens = text, labels = text shifted left with pad last (loss_mask 0 there).
  LabelledSource src(kSpecLengths);
  GPTIndexConfig cfg;
  cfg.sequence_length = 8;
  cfg.add_extra_token_to_sequence = 0;
  GPTDataset ds(src, iota_ids(10), std::nullopt, cfg);
  ASSERT_EQ(ds.size(), 6);  // 50 // 8
  const GPTSample s = ds.get(0);
  ASSERT_EQ(s.tokens.size(), 8u);
  EXPECT_EQ(s.tokens, s.text);
  for (std::size_t i = 0; i + 1 < 8; ++i) EXPECT_EQ(s.labels[i], s.text[i + 1]);
  EXPECT_EQ(s.labels[7], 0);
  EXPECT_EQ(s.loss_mask[7], 0.0f);
  EXPECT_EQ(s.loss_mask[6], 1.0f);
}

TEST(GPTDataset, EodMaskLoss) {
  LabelledSource src(kSpecLengths);
  GPTIndexConfig cfg;
  cfg.sequence_length = 8;
  GPTSampleConfig sc;
  sc.eod_id = 502;
  sc.eod_mask_loss = true;
  GPTDataset ds(src, iota_ids(10), std::nullopt, cfg, sc);
  const GPTSample s = ds.get(0);  // starts with token 502
  EXPECT_EQ(s.loss_mask[0], 0.0f);
  EXPECT_EQ(s.loss_mask[1], 1.0f);
}

TEST(GPTDataset, Errors) {
  EXPECT_THROW(parse_split("-1,1,0"), mg::Error);
  EXPECT_THROW(parse_split("0,0,0"), mg::Error);
  EXPECT_THROW(parse_split("1,1,1,1"), mg::Error);
  EXPECT_THROW(parse_split("1..2,1"), mg::Error);
  GPTIndexConfig cfg;
  cfg.sequence_length = 0;
  EXPECT_THROW(build_gpt_indices(kSpecLengths, iota_ids(10), std::nullopt, cfg), mg::Error);
  cfg.sequence_length = 8;
  cfg.add_extra_token_to_sequence = 2;
  EXPECT_THROW(build_gpt_indices(kSpecLengths, iota_ids(10), std::nullopt, cfg), mg::Error);
  cfg.add_extra_token_to_sequence = 1;
  EXPECT_THROW(build_gpt_indices(kSpecLengths, iota_ids(10), int64_t{-1}, cfg), mg::Error);
  // An empty split cannot give samples (Megatron would loop forever).
  EXPECT_THROW(build_gpt_indices(kSpecLengths, {}, int64_t{3}, cfg), mg::Error);
  const std::vector<int32_t> bad_id = {3, 10};
  EXPECT_THROW(build_gpt_indices(kSpecLengths, bad_id, std::nullopt, cfg), mg::Error);
  try {
    build_gpt_indices(kSpecLengths, {}, int64_t{3}, cfg);
  } catch (const mg::Error& e) {
    EXPECT_NE(e.message().find("0 tokens"), std::string::npos) << e.message();
  }
  LabelledSource src(kSpecLengths);
  GPTDataset ds(src, iota_ids(10), std::nullopt, cfg);
  EXPECT_THROW(ds.get(6), mg::Error);
  EXPECT_THROW(ds.get(-1), mg::Error);
}

}  // namespace
}  // namespace mg::datasets
