// Tests of Megatron's indexed dataset (megatron/core/datasets/indexed_dataset.h) against
// FORMATS.md §1: the spec's worked example byte for byte (tests/fixtures/indexed_dataset, typed in
// from the spec's hex), round trips for every dtype of the code table, empty documents, several
// sequences per document, add_index merging, header validation of corrupt files, token range
// checks and the atomic finalize.
//
// The expected .idx bytes of round trips come from `expected_idx` below, a plain serialiser of the
// §1.3 table written here; it never calls the library.
#include <gtest/gtest.h>

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "megatron/core/datasets/indexed_dataset.h"
#include "tests/unit/test_util.h"

namespace {

namespace fs = std::filesystem;
using mg::datasets::IndexDType;
using mg::datasets::IndexedDataset;
using mg::datasets::IndexedDatasetBuilder;

const fs::path kFixtures = fs::path(MG_TEST_FIXTURES_DIR) / "indexed_dataset";

// A fresh directory per test, removed at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    path_ = fs::temp_directory_path() /
            ("mg_idx_" + std::to_string(static_cast<long>(::getpid())) + "_" + name);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string prefix(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in.is_open()) << p;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

template <typename T>
void put_le(std::vector<uint8_t>& out, T v) {
  const auto u = static_cast<uint64_t>(v);
  for (std::size_t k = 0; k < sizeof(T); ++k) out.push_back(static_cast<uint8_t>(u >> (8 * k)));
}

// The .idx of FORMATS.md §1.3, serialised field by field.
std::vector<uint8_t> expected_idx(uint8_t code, std::size_t itemsize,
                                  const std::vector<int32_t>& lengths,
                                  const std::vector<int64_t>& doc_idx) {
  std::vector<uint8_t> out = {0x4d, 0x4d, 0x49, 0x44, 0x49, 0x44, 0x58, 0x00, 0x00};
  put_le<uint64_t>(out, 1);
  out.push_back(code);
  put_le<uint64_t>(out, lengths.size());
  put_le<uint64_t>(out, doc_idx.size());
  for (int32_t l : lengths) put_le<int32_t>(out, l);
  int64_t ptr = 0;
  for (int32_t l : lengths) {
    put_le<int64_t>(out, ptr);
    ptr += static_cast<int64_t>(l) * static_cast<int64_t>(itemsize);
  }
  for (int64_t d : doc_idx) put_le<int64_t>(out, d);
  return out;
}

// ---- dtype code table ---------------------------------------------------------------------------

TEST(IndexedDatasetDType, CodeTableMatchesSpec) {
  struct Row {
    uint8_t code;
    const char* name;
    std::size_t bytes;
  };
  // FORMATS.md §1.4.
  const Row rows[] = {{1, "uint8", 1}, {2, "int8", 1},    {3, "int16", 2},   {4, "int32", 4},
                      {5, "int64", 8}, {6, "float64", 8}, {7, "float32", 4}, {8, "uint16", 2}};
  for (const Row& r : rows) {
    const IndexDType t = mg::datasets::index_dtype_from_code(r.code);
    EXPECT_EQ(mg::datasets::index_dtype_code(t), r.code);
    EXPECT_EQ(mg::datasets::index_dtype_name(t), r.name);
    EXPECT_EQ(mg::datasets::index_dtype_size(t), r.bytes) << r.name;
  }
  EXPECT_NE(
      mg::test::error_message([] { mg::datasets::index_dtype_from_code(0); }).find("dtype code 0"),
      std::string::npos);
  EXPECT_THROW(mg::datasets::index_dtype_from_code(9), mg::Error);
}

TEST(IndexedDatasetDType, OptimalTokenDtypeAsPreprocessData) {
  using mg::datasets::optimal_token_dtype;
  EXPECT_EQ(optimal_token_dtype(50257), IndexDType::uint16);  // GPT-2
  EXPECT_EQ(optimal_token_dtype(32000), IndexDType::uint16);  // Llama-2
  EXPECT_EQ(optimal_token_dtype(65499), IndexDType::uint16);  // last uint16 size
  EXPECT_EQ(optimal_token_dtype(65500), IndexDType::int32);   // < 65500, not <= 65535
  EXPECT_EQ(optimal_token_dtype(128256), IndexDType::int32);  // Llama-3
  EXPECT_THROW(optimal_token_dtype(0), mg::Error);
}

TEST(IndexedDatasetDType, PathHelpers) {
  EXPECT_EQ(mg::datasets::get_idx_path("a/my-gpt2_text_document"), "a/my-gpt2_text_document.idx");
  EXPECT_EQ(mg::datasets::get_bin_path("a/my-gpt2_text_document"), "a/my-gpt2_text_document.bin");
}

// ---- the worked example (FORMATS.md §1.5) -------------------------------------------------------

const std::vector<int64_t> kDoc0 = {10, 20, 30, 50256};
const std::vector<int64_t> kDoc1 = {40, 50, 50256};

TEST(IndexedDatasetWorkedExample, WriterMatchesHandWrittenFixture) {
  TempDir dir;
  const std::string prefix = dir.prefix("my-gpt2_text_document");
  IndexedDatasetBuilder b(mg::datasets::get_bin_path(prefix), IndexDType::uint16);
  b.add_item(kDoc0);
  b.end_document();
  b.add_item(kDoc1);
  b.end_document();
  b.finalize(mg::datasets::get_idx_path(prefix));
  EXPECT_EQ(read_bytes(prefix + ".bin"), read_bytes(kFixtures / "worked_example.bin"));
  EXPECT_EQ(read_bytes(prefix + ".idx"), read_bytes(kFixtures / "worked_example.idx"));
}

TEST(IndexedDatasetWorkedExample, AddDocumentMatchesFixture) {
  TempDir dir;
  const std::string prefix = dir.prefix("ex");
  IndexedDatasetBuilder b(prefix + ".bin", IndexDType::uint16);
  const std::vector<int64_t> one0 = {4}, one1 = {3};
  b.add_document(kDoc0, one0);
  b.add_document(kDoc1, one1);
  b.finalize(prefix + ".idx");
  EXPECT_EQ(read_bytes(prefix + ".bin"), read_bytes(kFixtures / "worked_example.bin"));
  EXPECT_EQ(read_bytes(prefix + ".idx"), read_bytes(kFixtures / "worked_example.idx"));
}

TEST(IndexedDatasetWorkedExample, ReaderDecodesFixture) {
  const std::string prefix = (kFixtures / "worked_example").string();
  ASSERT_TRUE(IndexedDataset::exists(prefix));
  const IndexedDataset ds(prefix);
  EXPECT_EQ(ds.dtype(), IndexDType::uint16);
  EXPECT_EQ(ds.sequence_count(), 2u);
  EXPECT_EQ(ds.document_count(), 2u);
  EXPECT_EQ(ds.sequence_lengths(), (std::vector<int32_t>{4, 3}));
  EXPECT_EQ(ds.sequence_pointers(), (std::vector<int64_t>{0, 8}));
  EXPECT_EQ(ds.document_indices(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(ds.get(0), kDoc0);
  EXPECT_EQ(ds.get(1), kDoc1);
  EXPECT_EQ(ds.get(0, 1, 2), (std::vector<int64_t>{20, 30}));
  EXPECT_EQ(ds.get(1, 3), std::vector<int64_t>{});
  const std::span<const uint16_t> s = ds.get_span<uint16_t>(1);
  EXPECT_EQ(std::vector<uint16_t>(s.begin(), s.end()), (std::vector<uint16_t>{40, 50, 0xC450}));
  EXPECT_THROW(ds.get_span<int16_t>(0), mg::Error);
  EXPECT_THROW(ds.get_span<int32_t>(0), mg::Error);
  EXPECT_THROW(ds.get(2), mg::Error);
  EXPECT_THROW(ds.get(0, 5), mg::Error);
  EXPECT_THROW(ds.get(0, 2, 3), mg::Error);
}

// ---- round trips over the code table ------------------------------------------------------------

struct DTypeCase {
  IndexDType t;
  int64_t lo, hi;  // the ids each dtype holds exactly
};

void PrintTo(const DTypeCase& c, std::ostream* os) {
  *os << mg::datasets::index_dtype_name(c.t) << " [" << c.lo << ", " << c.hi << "]";
}

class IndexedDatasetRoundTrip : public ::testing::TestWithParam<DTypeCase> {};

template <typename T>
void expect_span_equals(const IndexedDataset& ds, std::size_t i, const std::vector<int64_t>& want) {
  const std::span<const T> s = ds.get_span<T>(i);
  ASSERT_EQ(s.size(), want.size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % alignof(T), 0u);
  for (std::size_t k = 0; k < s.size(); ++k) EXPECT_EQ(static_cast<int64_t>(s[k]), want[k]);
}

TEST_P(IndexedDatasetRoundTrip, WriteReadBackAndBytes) {
  const DTypeCase c = GetParam();
  TempDir dir;
  const std::string prefix = dir.prefix("rt");
  std::mt19937_64 rng(1234 + index_dtype_code(c.t));
  std::uniform_int_distribution<int64_t> id(c.lo, c.hi);

  // Documents of 1, 3 (one empty), 0 and 2 sequences, odd lengths, the range ends included.
  const std::vector<std::vector<std::size_t>> docs = {{7}, {13, 0, 1}, {}, {31, 5}};
  std::vector<std::vector<int64_t>> seqs;
  std::vector<int32_t> lengths;
  std::vector<int64_t> doc_idx = {0};
  IndexedDatasetBuilder b(prefix + ".bin", c.t);
  for (const auto& doc : docs) {
    for (std::size_t len : doc) {
      std::vector<int64_t> s(len);
      for (auto& v : s) v = id(rng);
      if (len >= 2) {
        s[0] = c.lo;
        s[1] = c.hi;
      }
      b.add_item(s);
      seqs.push_back(s);
      lengths.push_back(static_cast<int32_t>(len));
    }
    b.end_document();
    doc_idx.push_back(static_cast<int64_t>(seqs.size()));
  }
  b.finalize(prefix + ".idx");

  const std::size_t item = mg::datasets::index_dtype_size(c.t);
  EXPECT_EQ(read_bytes(prefix + ".idx"),
            expected_idx(mg::datasets::index_dtype_code(c.t), item, lengths, doc_idx));
  std::size_t total = 0;
  for (int32_t l : lengths) total += static_cast<std::size_t>(l);
  EXPECT_EQ(fs::file_size(prefix + ".bin"), total * item);

  const IndexedDataset ds(prefix);
  EXPECT_EQ(ds.dtype(), c.t);
  ASSERT_EQ(ds.sequence_count(), seqs.size());
  EXPECT_EQ(ds.document_count(), docs.size());
  EXPECT_EQ(ds.sequence_lengths(), lengths);
  EXPECT_EQ(ds.document_indices(), doc_idx);
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(ds.get(i), seqs[i]) << "sequence " << i;
    switch (c.t) {
      case IndexDType::uint8:
        expect_span_equals<uint8_t>(ds, i, seqs[i]);
        break;
      case IndexDType::int8:
        expect_span_equals<int8_t>(ds, i, seqs[i]);
        break;
      case IndexDType::int16:
        expect_span_equals<int16_t>(ds, i, seqs[i]);
        break;
      case IndexDType::int32:
        expect_span_equals<int32_t>(ds, i, seqs[i]);
        break;
      case IndexDType::int64:
        expect_span_equals<int64_t>(ds, i, seqs[i]);
        break;
      case IndexDType::float64:
        expect_span_equals<double>(ds, i, seqs[i]);
        break;
      case IndexDType::float32:
        expect_span_equals<float>(ds, i, seqs[i]);
        break;
      case IndexDType::uint16:
        expect_span_equals<uint16_t>(ds, i, seqs[i]);
        break;
    }
  }
  // Little-endian on disk: the first token of sequence 0 is c.lo, check its bytes directly.
  const std::vector<uint8_t> bin = read_bytes(prefix + ".bin");
  if (c.t != IndexDType::float32 && c.t != IndexDType::float64) {
    for (std::size_t k = 0; k < item; ++k) {
      EXPECT_EQ(bin[k], static_cast<uint8_t>(static_cast<uint64_t>(c.lo) >> (8 * k))) << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllCodes, IndexedDatasetRoundTrip,
    ::testing::Values(DTypeCase{IndexDType::uint8, 0, 255}, DTypeCase{IndexDType::int8, -128, 127},
                      DTypeCase{IndexDType::int16, -32768, 32767},
                      DTypeCase{IndexDType::int32, INT32_MIN, INT32_MAX},
                      DTypeCase{IndexDType::int64, INT64_MIN, INT64_MAX},
                      DTypeCase{IndexDType::float64, -(int64_t{1} << 53), int64_t{1} << 53},
                      DTypeCase{IndexDType::float32, -(int64_t{1} << 24), int64_t{1} << 24},
                      DTypeCase{IndexDType::uint16, 0, 65535}),
    [](const ::testing::TestParamInfo<DTypeCase>& info) {
      return std::string(mg::datasets::index_dtype_name(info.param.t));
    });

// ---- documents ----------------------------------------------------------------------------------

TEST(IndexedDatasetDocuments, EmptyDocumentsAreEqualConsecutiveEntries) {
  TempDir dir;
  const std::string prefix = dir.prefix("empty");
  IndexedDatasetBuilder b(prefix + ".bin", IndexDType::int32);
  b.end_document();
  const std::vector<int32_t> s = {5, 6};
  b.add_item(s);
  b.end_document();
  b.end_document();
  b.finalize(prefix + ".idx");
  const IndexedDataset ds(prefix);
  EXPECT_EQ(ds.document_count(), 3u);
  EXPECT_EQ(ds.document_indices(), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(ds.get(0), (std::vector<int64_t>{5, 6}));
}

TEST(IndexedDatasetDocuments, NoSequencesAtAll) {
  TempDir dir;
  const std::string prefix = dir.prefix("none");
  IndexedDatasetBuilder b(prefix + ".bin", IndexDType::uint16);
  b.finalize(prefix + ".idx");
  EXPECT_EQ(read_bytes(prefix + ".idx"), expected_idx(8, 2, {}, {0}));
  EXPECT_EQ(fs::file_size(prefix + ".bin"), 0u);
  const IndexedDataset ds(prefix);
  EXPECT_EQ(ds.sequence_count(), 0u);
  EXPECT_EQ(ds.document_count(), 0u);
}

TEST(IndexedDatasetDocuments, SeveralSequencesPerDocument) {
  TempDir dir;
  const std::string prefix = dir.prefix("sent");
  IndexedDatasetBuilder b(prefix + ".bin", IndexDType::uint16);
  // Document 0: three sentences via add_document (one empty); document 1: two via add_item.
  const std::vector<int64_t> tokens = {1, 2, 3, 4, 5}, lens = {2, 0, 3};
  b.add_document(tokens, lens);
  const std::vector<int64_t> s0 = {6}, s1 = {7, 8, 9, 10};
  b.add_item(s0);
  b.add_item(s1);
  b.end_document();
  b.finalize(prefix + ".idx");
  EXPECT_EQ(read_bytes(prefix + ".idx"), expected_idx(8, 2, {2, 0, 3, 1, 4}, {0, 3, 5}));
  const IndexedDataset ds(prefix);
  EXPECT_EQ(ds.sequence_pointers(), (std::vector<int64_t>{0, 4, 4, 10, 12}));
  EXPECT_EQ(ds.get(2), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(ds.get(1), std::vector<int64_t>{});
  EXPECT_EQ(ds.get(4, 1, 2), (std::vector<int64_t>{8, 9}));

  const std::vector<int64_t> bad_lens = {2, 2};
  EXPECT_NE(
      mg::test::error_message([&] { b.add_document(tokens, bad_lens); }).find("after finalize"),
      std::string::npos);
  IndexedDatasetBuilder b2(dir.prefix("bad") + ".bin", IndexDType::uint16);
  EXPECT_NE(mg::test::error_message([&] {
              b2.add_document(tokens, bad_lens);
            }).find("sum to 4 but 5 tokens"),
            std::string::npos);
}

// ---- add_index ----------------------------------------------------------------------------------

TEST(IndexedDatasetAddIndex, MergingPartitionsEqualsWritingSequentially) {
  TempDir dir;
  const std::vector<std::vector<std::vector<int64_t>>> part_a = {{{1, 2, 3}}, {{4}, {5, 6}}, {}};
  const std::vector<std::vector<std::vector<int64_t>>> part_b = {{{7, 8}}, {}, {{9}, {}, {10, 11}}};
  auto write = [](IndexedDatasetBuilder& b, const auto& docs) {
    for (const auto& doc : docs) {
      for (const auto& s : doc) b.add_item(s);
      b.end_document();
    }
  };
  const std::string a = dir.prefix("a"), pb = dir.prefix("b"), seq = dir.prefix("seq"),
                    merged = dir.prefix("merged");
  for (const auto& [prefix, docs] : {std::pair{a, part_a}, std::pair{pb, part_b}}) {
    IndexedDatasetBuilder b(prefix + ".bin", IndexDType::int32);
    write(b, docs);
    b.finalize(prefix + ".idx");
  }
  {
    IndexedDatasetBuilder b(seq + ".bin", IndexDType::int32);
    write(b, part_a);
    write(b, part_b);
    b.finalize(seq + ".idx");
  }
  {
    IndexedDatasetBuilder b(merged + ".bin", IndexDType::int32);
    b.add_index(a);
    b.add_index(pb);
    b.finalize(merged + ".idx");
  }
  EXPECT_EQ(read_bytes(merged + ".bin"), read_bytes(seq + ".bin"));
  EXPECT_EQ(read_bytes(merged + ".idx"), read_bytes(seq + ".idx"));
  const IndexedDataset ds(merged);
  EXPECT_EQ(ds.document_indices(), (std::vector<int64_t>{0, 1, 3, 3, 4, 4, 7}));
  EXPECT_EQ(ds.get(6), (std::vector<int64_t>{10, 11}));

  IndexedDatasetBuilder other(dir.prefix("u16") + ".bin", IndexDType::uint16);
  const std::string msg = mg::test::error_message([&] { other.add_index(a); });
  EXPECT_NE(msg.find("int32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("uint16"), std::string::npos) << msg;
}

// ---- token range --------------------------------------------------------------------------------

TEST(IndexedDatasetBuilderRange, OutOfRangeTokenIdsAreRejected) {
  TempDir dir;
  struct Bad {
    IndexDType t;
    int64_t v;
    const char* text;
  };
  const Bad cases[] = {{IndexDType::uint8, 256, "256"},
                       {IndexDType::uint8, -1, "-1"},
                       {IndexDType::int8, 128, "128"},
                       {IndexDType::int16, -32769, "-32769"},
                       {IndexDType::uint16, 65536, "65536"},
                       {IndexDType::uint16, -1, "-1"},
                       {IndexDType::int32, int64_t{1} << 31, "2147483648"},
                       {IndexDType::float32, (int64_t{1} << 24) + 1, "16777217"},
                       {IndexDType::float64, (int64_t{1} << 53) + 1, "9007199254740993"}};
  for (const Bad& c : cases) {
    const std::string name = std::string(mg::datasets::index_dtype_name(c.t));
    IndexedDatasetBuilder b(dir.prefix(name) + ".bin", c.t);
    const std::vector<int64_t> s = {1, c.v};
    const std::string msg = mg::test::error_message([&] { b.add_item(s); });
    EXPECT_NE(msg.find(std::string("token id ") + c.text), std::string::npos) << msg;
    EXPECT_NE(msg.find("dtype " + name), std::string::npos) << msg;
    EXPECT_EQ(b.sequence_count(), 0u);
  }
}

// ---- atomicity ----------------------------------------------------------------------------------

TEST(IndexedDatasetBuilderAtomic, NoFinalFilesBeforeFinalize) {
  TempDir dir;
  const std::string prefix = dir.prefix("atomic");
  {
    IndexedDatasetBuilder b(prefix + ".bin", IndexDType::uint16);
    b.add_item(kDoc0);
    b.end_document();
    EXPECT_FALSE(fs::exists(prefix + ".bin"));
    EXPECT_FALSE(fs::exists(prefix + ".idx"));
    EXPECT_TRUE(fs::exists(prefix + ".bin.tmp"));
    EXPECT_FALSE(IndexedDataset::exists(prefix));
    b.finalize(prefix + ".idx");
    EXPECT_TRUE(IndexedDataset::exists(prefix));
    EXPECT_FALSE(fs::exists(prefix + ".bin.tmp"));
    EXPECT_FALSE(fs::exists(prefix + ".idx.tmp"));
    EXPECT_THROW(b.add_item(kDoc1), mg::Error);
  }
  EXPECT_TRUE(IndexedDataset::exists(prefix));  // destroying a finalized builder keeps its files

  const std::string abandoned = dir.prefix("abandoned");
  {
    IndexedDatasetBuilder b(abandoned + ".bin", IndexDType::uint16);
    b.add_item(kDoc0);
    b.end_document();
  }
  EXPECT_FALSE(fs::exists(abandoned + ".bin.tmp"));
  EXPECT_FALSE(fs::exists(abandoned + ".bin"));

  // A sequence never closed by end_document: finalize refuses and writes nothing final.
  const std::string open_doc = dir.prefix("open");
  IndexedDatasetBuilder b(open_doc + ".bin", IndexDType::uint16);
  b.add_item(kDoc0);
  const std::string msg = mg::test::error_message([&] { b.finalize(open_doc + ".idx"); });
  EXPECT_NE(msg.find("end_document"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(open_doc + ".bin"));
  EXPECT_FALSE(fs::exists(open_doc + ".idx"));
}

// ---- corrupt files ------------------------------------------------------------------------------

class IndexedDatasetCorrupt : public ::testing::Test {
 protected:
  // Copies the worked example to a temporary prefix, applies `edit` to the .idx bytes (and
  // `bin_edit` to the .bin), opens it and returns the error message.
  std::string open_edited(void (*edit)(std::vector<uint8_t>&),
                          void (*bin_edit)(std::vector<uint8_t>&) = nullptr) {
    prefix_ = dir_.prefix("corrupt");
    std::vector<uint8_t> idx = read_bytes(kFixtures / "worked_example.idx");
    std::vector<uint8_t> bin = read_bytes(kFixtures / "worked_example.bin");
    if (edit) edit(idx);
    if (bin_edit) bin_edit(bin);
    write_bytes(prefix_ + ".idx", idx);
    write_bytes(prefix_ + ".bin", bin);
    const std::string msg = mg::test::error_message([&] { IndexedDataset ds(prefix_); });
    EXPECT_NE(msg.find(prefix_ + ".idx"), std::string::npos) << "message names the file: " << msg;
    return msg;
  }
  TempDir dir_;
  std::string prefix_;
};

#define EXPECT_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << (msg)

TEST_F(IndexedDatasetCorrupt, UneditedFixtureOpens) {
  const std::string prefix = dir_.prefix("ok");
  write_bytes(prefix + ".idx", read_bytes(kFixtures / "worked_example.idx"));
  write_bytes(prefix + ".bin", read_bytes(kFixtures / "worked_example.bin"));
  EXPECT_NO_THROW(IndexedDataset ds(prefix));
  // Trailing bytes (e.g. the unflagged multimodal sequence_modes) are ignored, as in Megatron.
  std::vector<uint8_t> idx = read_bytes(kFixtures / "worked_example.idx");
  idx.push_back(0);
  idx.push_back(1);
  write_bytes(prefix + ".idx", idx);
  EXPECT_EQ(IndexedDataset(prefix).get(1), kDoc1);
}

TEST_F(IndexedDatasetCorrupt, TruncatedHeader) {
  EXPECT_HAS(open_edited([](auto& b) { b.resize(20); }), "truncated header");
}
TEST_F(IndexedDatasetCorrupt, TruncatedArrays) {
  EXPECT_HAS(open_edited([](auto& b) { b.resize(81); }), "sequence_count 2 and document_count 3");
}
TEST_F(IndexedDatasetCorrupt, HugeSequenceCount) {
  EXPECT_HAS(open_edited([](auto& b) { b[25] = 0x10; }), "the file has 82");
}
TEST_F(IndexedDatasetCorrupt, BadMagic) {
  EXPECT_HAS(open_edited([](auto& b) { b[1] = 'X'; }), "bad magic");
}
TEST_F(IndexedDatasetCorrupt, BadVersion) {
  EXPECT_HAS(open_edited([](auto& b) { b[9] = 2; }), "version 2");
}
TEST_F(IndexedDatasetCorrupt, BadDtypeCode) {
  EXPECT_HAS(open_edited([](auto& b) { b[17] = 9; }), "dtype code 9");
  EXPECT_HAS(open_edited([](auto& b) { b[17] = 0; }), "dtype code 0");
}
TEST_F(IndexedDatasetCorrupt, ZeroDocumentCount) {
  EXPECT_HAS(open_edited([](auto& b) { b[26] = 0; }), "document_count");
}
TEST_F(IndexedDatasetCorrupt, LastDocumentIndexIsNotN) {
  EXPECT_HAS(open_edited([](auto& b) { b[74] = 1; }), "last document_indices entry is 1");
}
TEST_F(IndexedDatasetCorrupt, FirstDocumentIndexIsNotZero) {
  EXPECT_HAS(open_edited([](auto& b) { b[58] = 1; }), "document_indices[0] is 1");
}
TEST_F(IndexedDatasetCorrupt, DecreasingDocumentIndices) {
  EXPECT_HAS(open_edited([](auto& b) { b[66] = 3; }), "document_indices[2] = 2 is below");
}
TEST_F(IndexedDatasetCorrupt, NegativeLength) {
  EXPECT_HAS(open_edited([](auto& b) { b[37] = 0x80; }), "sequence_lengths[0]");
}
TEST_F(IndexedDatasetCorrupt, PointerPastBin) {
  EXPECT_HAS(open_edited(nullptr, [](auto& b) { b.resize(12); }), "sequence 1");
}
TEST_F(IndexedDatasetCorrupt, MisalignedPointer) {
  EXPECT_HAS(open_edited([](auto& b) { b[50] = 7; }), "sequence_pointers = 7");
}

TEST(IndexedDatasetOpen, MissingFilesNameThePath) {
  TempDir dir;
  const std::string prefix = dir.prefix("missing");
  EXPECT_FALSE(IndexedDataset::exists(prefix));
  const std::string msg = mg::test::error_message([&] { IndexedDataset ds(prefix); });
  EXPECT_HAS(msg, prefix);
}

}  // namespace
