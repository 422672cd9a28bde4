// merge_datasets end to end: runs the built binary (MG_BIN_DIR) on copies of the Megatron-written
// corpora and compares with tests/fixtures/megatron_core/merged_ac.{bin,idx}, which Megatron-Core's
// own IndexedDatasetBuilder.add_index wrote in merge_datasets.py's order; plus the error cases.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/unit/test_util.h"

namespace {
namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(MG_TEST_FIXTURES_DIR) / "megatron_core";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class MergeDatasets : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mg_merge_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "in");
    fs::create_directories(dir_ / "out");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void copy_corpus(const std::string& name, const std::string& as) {
    for (const char* ext : {".bin", ".idx"})
      fs::copy_file(kFixtures / (name + ext), dir_ / "in" / (as + ext));
  }
  mg::test::CommandResult merge(const std::string& input, const std::string& out) {
    return mg::test::run_command(std::string(MG_BIN_DIR) + "/merge_datasets --input '" + input +
                                 "' --output-prefix '" + out + "'");
  }
  fs::path dir_;
};

TEST_F(MergeDatasets, ByteIdenticalToMegatrons) {
  // Named so that the sorted order is a then c, whatever the directory listing order.
  copy_corpus("corpus_c", "part_2");
  copy_corpus("corpus_a", "part_1");
  const auto r = merge((dir_ / "in").string(), (dir_ / "out" / "merged").string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("merged 2 datasets"), std::string::npos) << r.output;
  EXPECT_EQ(read_file(dir_ / "out" / "merged.bin"), read_file(kFixtures / "merged_ac.bin"));
  EXPECT_EQ(read_file(dir_ / "out" / "merged.idx"), read_file(kFixtures / "merged_ac.idx"));
}

TEST_F(MergeDatasets, RejectsMixedDtypes) {
  copy_corpus("corpus_a", "a");
  copy_corpus("corpus_b", "b");  // int32
  const auto r = merge((dir_ / "in").string(), (dir_ / "out" / "merged").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("has dtype int32, this builder writes uint16"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "out" / "merged.idx"));  // nothing half-written
  EXPECT_FALSE(fs::exists(dir_ / "out" / "merged.bin"));
}

TEST_F(MergeDatasets, RejectsBadInputs) {
  auto expect_fail = [&](const std::string& in, const std::string& out, const std::string& what) {
    const auto r = merge(in, out);
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find(what), std::string::npos) << r.output;
  };
  expect_fail((dir_ / "in").string(), (dir_ / "out" / "m").string(), "holds no .bin/.idx pair");
  expect_fail((dir_ / "missing").string(), (dir_ / "out" / "m").string(),
              "is not a directory or does not exist");
  copy_corpus("corpus_a", "a");
  expect_fail((dir_ / "in").string(), (dir_ / "nowhere" / "m").string(),
              "is not a directory or does not exist");
  expect_fail((dir_ / "in").string(), (dir_ / "in" / "m").string(), "is inside --input");
  fs::remove(dir_ / "in" / "a.idx");
  expect_fail((dir_ / "in").string(), (dir_ / "out" / "m").string(), ".idx file not provided");
  fs::remove(dir_ / "in" / "a.bin");
  copy_corpus("corpus_c", "c");
  { std::ofstream(dir_ / "in" / "README.txt") << "x"; }
  expect_fail((dir_ / "in").string(), (dir_ / "out" / "m").string(), "is not a .bin or .idx");
}

}  // namespace
