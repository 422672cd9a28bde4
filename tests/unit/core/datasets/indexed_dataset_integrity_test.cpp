// Data-file integrity (issue 24): an .idx is checked against its .bin (the sequences tile the .bin
// and their lengths x item size add up to its size), so a changed dtype byte, an enlarged length
// that stays inside the .bin, another corpus's .idx and a .bin/.idx pair from two runs (a
// replacement interrupted between its renames) are refused naming the file; replacing a prefix
// removes the old .idx first; preprocess_data refuses an input without tokens unless
// --allow-empty.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/datasets/indexed_dataset.h"
#include "tests/unit/test_util.h"

namespace {

namespace fs = std::filesystem;
using mg::datasets::get_bin_path;
using mg::datasets::get_idx_path;
using mg::datasets::IndexDType;
using mg::datasets::IndexedDataset;
using mg::datasets::IndexedDatasetBuilder;

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("mg_idx_integrity_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}
void write_file(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// A uint16 dataset of `docs` documents; document d has d + 3 tokens (ids above 255).
std::string build(const fs::path& dir, const std::string& name, int docs, int64_t base = 300) {
  const std::string prefix = (dir / name).string();
  IndexedDatasetBuilder b(get_bin_path(prefix), IndexDType::uint16);
  for (int d = 0; d < docs; ++d) {
    std::vector<int64_t> ids;
    for (int i = 0; i < d + 3; ++i) ids.push_back(base + 7 * d + i);
    b.add_item(std::span<const int64_t>(ids));
    b.end_document();
  }
  b.finalize(get_idx_path(prefix));
  return prefix;
}

std::string open_error(const std::string& prefix) {
  return mg::test::error_message([&] { IndexedDataset ds(prefix); });
}

constexpr std::size_t kHeader = 34;  // magic 9, version 8, dtype 1, counts 8 + 8

TEST(IndexedDatasetIntegrity, ADtypeByteChangedIsRefusedNamingTheFile) {
  const auto dir = temp_dir("dtype");
  const std::string prefix = build(dir, "a", 4);
  EXPECT_NO_THROW(IndexedDataset ds(prefix));
  std::string idx = read_file(get_idx_path(prefix));
  ASSERT_EQ(static_cast<int>(idx[17]), 8);  // uint16
  idx[17] = 1;                              // uint8: every sequence still lies inside the .bin
  write_file(get_idx_path(prefix), idx);
  const auto e = open_error(prefix);
  EXPECT_NE(e.find("IndexedDataset " + get_idx_path(prefix)), std::string::npos) << e;
  EXPECT_NE(e.find("the .idx does not describe this .bin"), std::string::npos) << e;
}

TEST(IndexedDatasetIntegrity, AnEnlargedMiddleLengthIsRefused) {
  const auto dir = temp_dir("length");
  const std::string prefix = build(dir, "a", 4);
  std::string idx = read_file(get_idx_path(prefix));
  int32_t len = 0;
  std::memcpy(&len, idx.data() + kHeader + 4, 4);  // sequence 1
  ASSERT_EQ(len, 4);
  len += 2;  // still inside the .bin
  std::memcpy(idx.data() + kHeader + 4, &len, 4);
  write_file(get_idx_path(prefix), idx);
  const auto e = open_error(prefix);
  EXPECT_NE(e.find(get_idx_path(prefix)), std::string::npos) << e;
  EXPECT_NE(e.find("does not describe this .bin"), std::string::npos) << e;
}

TEST(IndexedDatasetIntegrity, TheIndexOfAnotherSmallerCorpusIsRefused) {
  const auto dir = temp_dir("other");
  const std::string big = build(dir, "big", 6), small = build(dir, "small", 3, 1000);
  fs::copy_file(get_idx_path(small), get_idx_path(big), fs::copy_options::overwrite_existing);
  const auto e = open_error(big);
  EXPECT_NE(e.find(get_idx_path(big)), std::string::npos) << e;
  EXPECT_NE(e.find("the .idx and .bin disagree"), std::string::npos) << e;
  EXPECT_NE(e.find(get_bin_path(big)), std::string::npos) << e;
}

// A replacement killed between the two renames of the old order left the new .bin beside the old
// .idx; the reader refuses that pair. The builder now removes the old .idx first.
TEST(IndexedDatasetIntegrity, AMixedPairIsRefusedAndReplacementRemovesTheOldIndexFirst) {
  const auto dir = temp_dir("pair");
  const std::string old_prefix = build(dir, "data", 5);
  const std::string new_prefix = build(dir, "next", 4, 2000);
  fs::copy_file(get_bin_path(new_prefix), get_bin_path(old_prefix),
                fs::copy_options::overwrite_existing);
  const auto e = open_error(old_prefix);
  EXPECT_NE(e.find(get_idx_path(old_prefix)), std::string::npos) << e;

  // Replacing the prefix in place: while the new .bin is being written the old pair is intact;
  // finalize removes the old .idx before the .bin rename, so no moment pairs new and old.
  const std::string prefix = build(dir, "replace", 5);
  {
    IndexedDatasetBuilder b(get_bin_path(prefix), IndexDType::uint16);
    std::vector<int64_t> ids = {400, 401};
    b.add_item(std::span<const int64_t>(ids));
    b.end_document();
    EXPECT_NO_THROW(IndexedDataset still_old(prefix));
    b.finalize(get_idx_path(prefix));
  }
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.sequence_count(), 1u);
}

TEST(IndexedDatasetIntegrity, PreprocessDataRefusesAnEmptyInputUnlessAllowed) {
  const auto dir = temp_dir("empty");
  write_file(dir / "empty.jsonl", "");
  const std::string bin = std::string(MG_BIN_DIR) + "/preprocess_data";
  const std::string common =
      " --workers 1 --tokenizer-type NullTokenizer --vocab-size 300 "
      "--input " +
      (dir / "empty.jsonl").string() + " --output-prefix " + (dir / "out").string();
  auto r = mg::test::run_command(bin + common + " 2>&1");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("holds no token to write"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("empty.jsonl"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "out_text_document.idx"));
  EXPECT_FALSE(fs::exists(dir / "out_text_document.bin"));
  r = mg::test::run_command(bin + common + " --allow-empty 2>&1");
  EXPECT_EQ(r.status, 0) << r.output;
  IndexedDataset ds((dir / "out_text_document").string());
  EXPECT_EQ(ds.sequence_count(), 0u);
}

}  // namespace
