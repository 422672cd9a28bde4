// Checkpoint integrity (issue 24): per-tensor XXH3-64 checksums catch a flipped mantissa or
// exponent bit anywhere in any checkpoint file, at --load and in generate's loader, naming the file
// and the tensor (--no-ckpt-checksum opts out); a load into a model with other model-defining
// flags (heads, vocabulary, RoPE base) is an error naming both values unless
// --allow-ckpt-model-mismatch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/dist_checkpointing/safetensors.h"
#include "megatron/training/checkpoint_model.h"
#include "megatron/training/training.h"
#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  return test::scratch_dir("mg_ckpt_integrity", name);
}

std::vector<std::string> tiny(int64_t iters, std::vector<std::string> extra = {}) {
  const std::vector<std::pair<std::string, std::string>> base = {
      {"--num-layers", "2"},
      {"--hidden-size", "32"},
      {"--num-attention-heads", "4"},
      {"--seq-length", "32"},
      {"--micro-batch-size", "2"},
      {"--global-batch-size", "2"},
      {"--train-iters", std::to_string(iters)},
      {"--lr", "1e-3"},
      {"--vocab-size", "128"},
      {"--eval-iters", "0"},
      {"--log-interval", "1"}};
  std::vector<std::string> f = test::flags_with(base, extra);  // each replaced where given
  f.insert(f.begin(), "--mock-data");
  return f;
}

PretrainResult run(const std::vector<std::string>& flags, std::string* log_out = nullptr) {
  std::ostringstream log;
  PretrainResult r = pretrain(parse_args(flags), log);
  if (log_out) *log_out = log.str();
  return r;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}
void write_file(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// The [begin, end) byte range of a safetensors file's data buffer.
std::pair<std::size_t, std::size_t> data_range(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return {8 + n, bytes.size()};
}

std::vector<fs::path> safetensors_files(const std::string& dir) {
  std::vector<fs::path> out;
  for (const auto& f : fs::directory_iterator(dir))
    if (f.path().extension() == ".safetensors") out.push_back(f.path());
  std::sort(out.begin(), out.end());
  return out;
}

class ChecksumTest : public ::testing::TestWithParam<std::string> {};

// Flips one bit at several places of every file (a low mantissa bit and the top exponent bit of
// f32 values, spread over the data buffer); every flip fails the load naming the file and tensor.
TEST_P(ChecksumTest, AFlippedBitInAnyFileFailsTheLoadNamingIt) {
  test::ensure_runtime();
  const std::string fmt = GetParam();
  const std::string dir = temp_dir("flip_" + fmt);
  run(tiny(2, {"--save", dir, "--ckpt-format", fmt}));
  const std::string iter_dir = dir + "/iter_0000002";
  const auto files = safetensors_files(iter_dir);
  ASSERT_EQ(files.size(), fmt == "legacy" ? 2u : 1u);
  int flips = 0;
  for (const auto& file : files) {
    const std::string good = read_file(file);
    const auto [begin, end] = data_range(good);
    ASSERT_GT(end, begin + 64);
    for (int k = 0; k < 4; ++k) {
      // A 4-byte aligned f32 in the k-th quarter; byte 0 holds mantissa bits, byte 3 the sign and
      // the top exponent bits.
      const std::size_t at =
          begin + ((end - begin) * static_cast<std::size_t>(2 * k + 1) / 8) / 4 * 4;
      for (auto [byte, bit] : {std::pair<int, int>{0, 0}, std::pair<int, int>{3, 6}}) {
        std::string bad = good;
        bad[at + static_cast<std::size_t>(byte)] ^= static_cast<char>(1 << bit);
        write_file(file, bad);
        const auto e = test::error_message([&] {
          run(tiny(2, {"--load", dir, "--ckpt-format", fmt}));
        });
        EXPECT_NE(e.find("checkpoint file '" + file.string() + "': tensor '"), std::string::npos)
            << e;
        EXPECT_NE(e.find("fails its checksum"), std::string::npos) << e;
        ++flips;
      }
    }
    write_file(file, good);
  }
  EXPECT_EQ(flips, static_cast<int>(files.size()) * 8);
  // Intact again: loads (the test's restore is right, so the failures above were the flips).
  EXPECT_NO_THROW(run(tiny(2, {"--load", dir, "--ckpt-format", fmt})));
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, ChecksumTest, ::testing::Values("sharded", "legacy"));

TEST(Checkpoint, GeneratesLoaderVerifiesAndTheOptOutSkips) {
  test::ensure_runtime();
  const std::string dir = temp_dir("generate");
  run(tiny(2, {"--save", dir}));
  const fs::path file = dir + "/iter_0000002/rank_00000.safetensors";
  const std::string good = read_file(file);
  std::string bad = good;
  bad[data_range(good).first + 4 * 40 + 3] ^= 0x40;  // an exponent bit of one f32
  write_file(file, bad);
  const auto e = test::error_message(
      [&] { load_model_from_checkpoint(dir, test::ops_on("cpu"), Device::cpu()); });
  EXPECT_NE(e.find("fails its checksum"), std::string::npos) << e;
  EXPECT_NE(e.find(file.string()), std::string::npos) << e;

  // --no-ckpt-checksum: no checksums written; the same corruption then loads (the opt-out's cost).
  const std::string dir2 = temp_dir("nochecksum");
  run(tiny(2, {"--save", dir2, "--no-ckpt-checksum"}));
  const fs::path file2 = dir2 + "/iter_0000002/rank_00000.safetensors";
  EXPECT_FALSE(dist_checkpointing::SafetensorsFile(file2.string()).has_checksums());
  EXPECT_TRUE(dist_checkpointing::SafetensorsFile(file.string(), false).has_checksums());
  std::string bad2 = read_file(file2);
  bad2[data_range(bad2).first + 4 * 40] ^= 0x01;
  write_file(file2, bad2);
  EXPECT_NO_THROW(run(tiny(2, {"--load", dir2, "--no-ckpt-checksum"})));
}

// Shapes agree (QKV is 3H x H for any head count at NG = NH), yet the model differs.
TEST(Checkpoint, StrictLoadRefusesOtherModelFlagsNamingBothValues) {
  test::ensure_runtime();
  const std::string dir = temp_dir("strict");
  run(tiny(2, {"--save", dir, "--position-embedding-type", "rope"}));
  auto load = [&](std::vector<std::string> extra, std::string* log = nullptr) {
    extra.insert(extra.end(), {"--load", dir, "--position-embedding-type", "rope"});
    return run(tiny(2, extra), log);
  };
  auto e = test::error_message([&] { load({"--num-attention-heads", "8"}); });
  EXPECT_NE(e.find("holds a model built with other flags"), std::string::npos) << e;
  EXPECT_NE(e.find("--num-attention-heads: the checkpoint has 4, this run 8"), std::string::npos)
      << e;
  // 128 + eod and 200 + eod both pad to 256 rows.
  e = test::error_message([&] { load({"--vocab-size", "200"}); });
  EXPECT_NE(e.find("the checkpoint has 129 tokens, this run 201"), std::string::npos) << e;
  e = test::error_message([&] { load({"--rotary-base", "500000"}); });
  EXPECT_NE(e.find("--rotary-base: the checkpoint has 10000, this run 500000"), std::string::npos)
      << e;
  // The same flags load; an explicit override loads with a warning.
  EXPECT_EQ(load({}).iteration, 2);
  std::string log;
  EXPECT_EQ(load({"--vocab-size", "200", "--allow-ckpt-model-mismatch"}, &log).iteration, 2);
  EXPECT_NE(log.find("WARNING: --allow-ckpt-model-mismatch"), std::string::npos) << log;
}

}  // namespace
}  // namespace mg::training
