// Tests of numpy's SeedSequence + PCG64 + Generator.integers (numpy_pcg64.h) and of
// MockGPTSource (mock_gpt_dataset.h) against numpy itself: tests/fixtures/mock_gpt/
// pcg64_golden.txt was written by gen_mock_fixture.py (PCG64 states, raw 64/32-bit streams,
// bounded draws with heavy Lemire rejection, and the 100,000 mock lengths: the first 2000, sums
// and fixed positions); compared bit for bit. Plus the FORMATS.md §3.12 constants, document
// contents, the "1,1,1" split and a GPTDataset sampling the mock.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/datasets/mock_gpt_dataset.h"
#include "megatron/core/datasets/numpy_pcg64.h"

namespace mg::datasets {
namespace {

// Lines of the golden file whose first word is `tag`, each as a stream after the tag.
std::vector<std::string> records(const std::string& tag) {
  std::ifstream in(std::string(MG_TEST_FIXTURES_DIR) + "/mock_gpt/pcg64_golden.txt");
  EXPECT_TRUE(in.good()) << "missing pcg64_golden.txt";
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (line.rfind(tag + " ", 0) == 0) out.push_back(line.substr(tag.size() + 1));
  return out;
}

NumpyPCG64::u128 parse_u128(const std::string& s) {
  NumpyPCG64::u128 v = 0;
  for (char c : s) v = v * 10 + static_cast<unsigned>(c - '0');
  return v;
}

template <typename T>
std::vector<T> read_n(std::istringstream& is, std::size_t n) {
  std::vector<T> v(n);
  for (auto& e : v) is >> e;
  return v;
}

TEST(NumpyPCG64, SpecConstants) {
  NumpyPCG64 g(0);
  EXPECT_TRUE(g.state() == parse_u128("35399562948360463058890781895381311971"));
  EXPECT_TRUE(g.increment() == parse_u128("87136372517582989555478159403783844777"));
  EXPECT_EQ(g.next_uint32(), 3653403231u);
  EXPECT_EQ(g.next_uint32(), 2735729615u);
  EXPECT_EQ(g.next_uint32(), 2195314465u);
  EXPECT_EQ(g.next_uint32(), 1158725112u);
}

TEST(NumpyPCG64, StatesMatchNumpy) {
  const auto recs = records("state");
  ASSERT_EQ(recs.size(), 3u);
  for (const auto& r : recs) {
    std::istringstream is(r);
    uint64_t seed = 0;
    std::string st, inc;
    is >> seed >> st >> inc;
    NumpyPCG64 g(seed);
    EXPECT_TRUE(g.state() == parse_u128(st)) << "seed " << seed;
    EXPECT_TRUE(g.increment() == parse_u128(inc)) << "seed " << seed;
  }
}

TEST(NumpyPCG64, RawStreamsMatchNumpy) {
  for (const std::string tag : {"raw64", "raw32"}) {
    const auto recs = records(tag);
    ASSERT_EQ(recs.size(), 3u) << tag;
    for (const auto& r : recs) {
      std::istringstream is(r);
      uint64_t seed = 0;
      std::size_t n = 0;
      is >> seed >> n;
      const auto expect = read_n<uint64_t>(is, n);
      NumpyPCG64 g(seed);
      for (std::size_t i = 0; i < n; ++i) {
        const uint64_t got = tag == "raw64" ? g.next_uint64() : g.next_uint32();
        ASSERT_EQ(got, expect[i]) << tag << " seed " << seed << " draw " << i;
      }
    }
  }
}

TEST(NumpyPCG64, BoundedDrawsMatchNumpy) {
  const auto recs = records("bounded");
  ASSERT_EQ(recs.size(), 3u);
  for (const auto& r : recs) {
    std::istringstream is(r);
    uint64_t seed = 0, high = 0;
    uint32_t low = 0;
    std::size_t n = 0;
    is >> seed >> low >> high >> n;
    const auto expect = read_n<uint32_t>(is, n);
    NumpyPCG64 g(seed);
    EXPECT_EQ(g.integers_uint32(low, high, n), expect) << "seed " << seed << " high " << high;
  }
}

TEST(NumpyPCG64, RejectsBadRanges) {
  NumpyPCG64 g(0);
  EXPECT_THROW(g.integers_int32(5, 5, 1), Error);
  EXPECT_THROW(g.integers_uint32(0, (uint64_t{1} << 32) + 1, 1), Error);
  EXPECT_THROW(g.bounded_lemire_uint32(0xFFFFFFFFu), Error);
}

TEST(MockGPT, LengthsMatchNumpy) {
  const std::vector<int32_t> lengths = mock_gpt_document_lengths();
  ASSERT_EQ(lengths.size(), 100000u);
  // FORMATS.md §3.12's (then unverified) first ten, confirmed by numpy.
  EXPECT_EQ(std::vector<int32_t>(lengths.begin(), lengths.begin() + 10),
            (std::vector<int32_t>{3484, 2609, 2094, 1105, 1261, 168, 309, 68, 718, 3331}));

  const auto head = records("lengths_head");
  ASSERT_EQ(head.size(), 1u);
  std::istringstream hs(head[0]);
  std::size_t n = 0;
  hs >> n;
  const auto expect = read_n<int32_t>(hs, n);
  EXPECT_EQ(std::vector<int32_t>(lengths.begin(), lengths.begin() + static_cast<long>(n)), expect);

  const auto sums = records("lengths_sum");
  ASSERT_EQ(sums.size(), 1u);
  std::istringstream ss(sums[0]);
  uint64_t sum = 0, weighted = 0;
  ss >> sum >> weighted;
  uint64_t got_sum = 0, got_weighted = 0;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    got_sum += static_cast<uint64_t>(lengths[i]);
    got_weighted += (i + 1) * static_cast<uint64_t>(lengths[i]);
  }
  EXPECT_EQ(got_sum, sum);
  EXPECT_EQ(got_weighted, weighted);

  const auto at = records("lengths_at");
  ASSERT_EQ(at.size(), 1u);
  std::istringstream as(at[0]);
  std::size_t k = 0;
  as >> k;
  for (std::size_t j = 0; j < k; ++j) {
    std::size_t pos = 0;
    int32_t v = 0;
    as >> pos >> v;
    EXPECT_EQ(lengths[pos], v) << "position " << pos;
  }
  for (int32_t v : lengths) ASSERT_TRUE(v >= 1 && v <= 4095) << v;
}

TEST(MockGPT, DocumentContents) {
  const int64_t V = 97, eod = 50256;
  MockGPTSource src(V, eod);
  ASSERT_EQ(src.sequence_count(), 100000u);
  for (std::size_t i : {0u, 7u, 99999u}) {
    const int64_t L = src.sequence_length(i);
    const std::vector<int64_t> doc = src.read(i, 0, L);
    ASSERT_EQ(static_cast<int64_t>(doc.size()), L);
    for (int64_t j = 0; j + 1 < L; ++j) ASSERT_EQ(doc[static_cast<std::size_t>(j)], (j + 1) % V);
    EXPECT_EQ(doc.back(), eod);
    // A sub-range is the same slice.
    const std::vector<int64_t> part = src.read(i, 3, 5);
    EXPECT_EQ(part, std::vector<int64_t>(doc.begin() + 3, doc.begin() + 8));
  }
  // Document 7 has length 68: [1..66, eod] with V = 97.
  EXPECT_EQ(src.sequence_length(7), 68);
  EXPECT_EQ(src.read(7, 65, 3), (std::vector<int64_t>{66, 67, eod}));
  EXPECT_THROW(src.read(7, 60, 9), Error);
  EXPECT_THROW(src.sequence_length(100000), Error);
  EXPECT_THROW(MockGPTSource(0, 1), Error);
}

TEST(MockGPT, SplitOneOneOne) {
  const auto r = mock_gpt_split_ranges();
  EXPECT_EQ(r[0], (std::pair<int64_t, int64_t>{0, 33333}));
  EXPECT_EQ(r[1], (std::pair<int64_t, int64_t>{33333, 66667}));
  EXPECT_EQ(r[2], (std::pair<int64_t, int64_t>{66667, 100000}));
  const auto valid = mock_gpt_split_indices(1);
  ASSERT_EQ(valid.size(), 33334u);
  EXPECT_EQ(valid.front(), 33333);
  EXPECT_EQ(valid.back(), 66666);
  EXPECT_THROW(mock_gpt_split_indices(3), Error);
}

TEST(MockGPT, GPTDatasetSamplesTheMock) {
  MockGPTSource src(1000, 999);
  GPTIndexConfig config;
  config.sequence_length = 31;
  const GPTDataset ds = make_mock_gpt_dataset(src, 2, 13, config);
  ASSERT_GE(ds.size(), 13);
  for (int64_t k : {int64_t{0}, int64_t{12}}) {
    const auto [text, ids] = ds.raw_sample(k);
    ASSERT_EQ(text.size(), 32u);
    // Rebuild the text independently from the documents and the indices (§3.9).
    const auto& ix = ds.indices();
    const int64_t row = ix.shuffle_index[static_cast<std::size_t>(k)];
    int64_t d = ix.sample_index[static_cast<std::size_t>(2 * row)];
    int64_t off = ix.sample_index[static_cast<std::size_t>(2 * row + 1)];
    std::vector<int64_t> expect;
    while (expect.size() < 32u) {
      const int32_t id = ix.document_index[static_cast<std::size_t>(d)];
      ASSERT_GE(id, 66667);
      const int64_t L = src.sequence_length(static_cast<std::size_t>(id));
      for (int64_t j = off; j < L && expect.size() < 32u; ++j)
        expect.push_back(j == L - 1 ? 999 : (j + 1) % 1000);
      ++d;
      off = 0;
    }
    EXPECT_EQ(text, expect) << "sample " << k;
  }
}

}  // namespace
}  // namespace mg::datasets
