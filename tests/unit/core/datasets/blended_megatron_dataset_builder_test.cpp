// Tests of the dataset builder glue (megatron/core/datasets/blended_megatron_dataset_builder.h)
// and of §3.9 step 5 (make_gpt_sample) that the Megatron golden test does not pin down: the
// per-split sample counts, config validation messages, Megatron's default cache folder, the
// pad/EOD rules of make_gpt_sample on hand-made text. The Megatron-equality of the builder itself
// is megatron_core_golden_test.cpp.
#include "megatron/core/datasets/blended_megatron_dataset_builder.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/datasets/indexed_dataset.h"

namespace mg::datasets {
namespace {
namespace fs = std::filesystem;

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(MegatronSplitSizes, AsMegatronTrainingComputesThem) {
  // train_iters 1000, gbs 8, eval_interval 100, eval_iters 10.
  const auto s = megatron_split_sizes(1000, 8, 100, 10);
  EXPECT_EQ(*s[0], 8000);
  EXPECT_EQ(*s[1], (1000 / 100 + 1) * 10 * 8);
  EXPECT_EQ(*s[2], 80);
  EXPECT_EQ(*megatron_split_sizes(1000, 8, 100, 10, 12345)[0], 12345);
  expect_error([] { megatron_split_sizes(10, 0, 1, 1); }, "global_batch_size must be > 0");
  expect_error([] { megatron_split_sizes(10, 1, 0, 1); }, "eval_interval must be > 0");
}

TEST(SplitWords, SplitsOnWhitespace) {
  EXPECT_EQ(split_words(" 0.3 a\t0.7  b\n"), (std::vector<std::string>{"0.3", "a", "0.7", "b"}));
  EXPECT_TRUE(split_words("  ").empty());
}

TEST(DataConfig, ValidationNamesTheProblem) {
  DataConfig c;
  c.seq_length = 8;
  expect_error([&] { c.validate(); }, "mock data needs the tokenizer's vocab_size");
  c.vocab_size = 100;
  c.eod_id = 0;
  c.validate();  // mock with vocab and eod: fine
  c.seq_length = 0;
  expect_error([&] { c.validate(); }, "--seq-length must be > 0, got 0");
  c.seq_length = 8;
  c.data_path = {"a"};
  c.train_data_path = {"b"};
  expect_error([&] { c.validate(); }, "are exclusive");
  c.data_path.clear();
  c.split = "99,1,0";
  expect_error([&] { c.validate(); }, "--split \"99,1,0\" cannot be used");
  c.split.reset();
  c.train_data_path.clear();
  c.data_path = {"a"};
  c.eod_id = -1;
  c.reset_attention_mask = true;
  expect_error([&] { c.validate(); }, "need the tokenizer's EOD id");
  c.reset_attention_mask = false;
  c.mock = true;
  expect_error([&] { c.validate(); }, "--mock-data and --data-path");
}

TEST(MakeGPTSample, ResetsMasksAndPads) {
  // S = 6, x = 1, EOD 9, pad -1: text [1 9 2 3 9 4 -1] (a kept partial sample).
  GPTSampleConfig c;
  c.eod_id = 9;
  c.eod_mask_loss = true;
  c.reset_position_ids = true;
  c.reset_attention_mask = true;
  const GPTSample s = make_gpt_sample({1, 9, 2, 3, 9, 4, -1}, 6, 1, c);
  EXPECT_EQ(s.tokens, (std::vector<int64_t>{1, 9, 2, 3, 9, 4}));
  EXPECT_EQ(s.labels, (std::vector<int64_t>{9, 2, 3, 9, 4, 0}));  // pad label -> 0
  EXPECT_EQ(s.position_ids, (std::vector<int64_t>{0, 1, 0, 1, 2, 0}));
  EXPECT_EQ(s.doc_ids, (std::vector<int32_t>{0, 0, 1, 1, 1, 2}));
  EXPECT_EQ(s.loss_mask, (std::vector<float>{1, 0, 1, 1, 0, 0}));  // EODs and the pad label
  // Without the flags: plain positions, no doc_ids, EOD keeps its loss.
  GPTSampleConfig plain;
  plain.eod_id = 9;
  const GPTSample p = make_gpt_sample({1, 9, 2, 3, 9, 4, 5}, 6, 1, plain);
  EXPECT_EQ(p.position_ids, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(p.doc_ids.empty());
  EXPECT_EQ(p.loss_mask, (std::vector<float>(6, 1.0f)));
  // x = 0: labels roll left with a pad at the end.
  const GPTSample z = make_gpt_sample({1, 2, 3}, 3, 0, plain);
  EXPECT_EQ(z.labels, (std::vector<int64_t>{2, 3, 0}));
  EXPECT_EQ(z.loss_mask, (std::vector<float>{1, 1, 0}));
  GPTSampleConfig no_eod;
  no_eod.reset_position_ids = true;
  expect_error([&] { make_gpt_sample({1, 2, 3}, 2, 1, no_eod); }, "need the tokenizer's EOD id");
  expect_error([&] { make_gpt_sample({1, 2}, 2, 1, plain); }, "expected S + x = 3");
}

TEST(BlendedMegatronDatasetBuilder, CachesUnderThePrefixByDefaultAndNeedsSizesForWeights) {
  const fs::path dir =
      fs::temp_directory_path() / ("mg_builder_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string prefix = (dir / "tiny_text_document").string();
  {
    IndexedDatasetBuilder b(get_bin_path(prefix), IndexDType::uint16);
    for (int d = 0; d < 20; ++d) {
      std::vector<int64_t> t(static_cast<std::size_t>(5 + d), d);
      t.push_back(7);
      b.add_item(std::span<const int64_t>(t));
      b.end_document();
    }
    b.finalize(get_idx_path(prefix));
  }
  DataConfig c;
  c.data_path = {prefix};
  c.split = "80,20,0";
  c.seq_length = 8;
  c.eod_id = 7;
  const DatasetSplits s = BlendedMegatronDatasetBuilder(c, {100, 10, 5}).build();
  ASSERT_NE(s[0], nullptr);
  ASSERT_NE(s[1], nullptr);
  EXPECT_EQ(s[2], nullptr);  // "80,20,0": no test split
  EXPECT_GE(s[0]->size(), 100);
  EXPECT_EQ(s[0]->class_name(), "GPTDataset");
  // Megatron's default: <prefix>/cache/GPTDataset_indices/<md5>-GPTDataset-train-*.
  const fs::path cache = fs::path(prefix) / "cache" / "GPTDataset_indices";
  EXPECT_TRUE(
      fs::exists(cache / (s[0]->unique_description_hash() + "-GPTDataset-train-description.txt")));
  // A second build reads the same indices.
  const DatasetSplits again = BlendedMegatronDatasetBuilder(c, {100, 10, 5}).build();
  for (int64_t k : {0, 17, 99}) EXPECT_EQ(again[0]->get(k).tokens, s[0]->get(k).tokens);
  // A weighted blend needs every split's size.
  DataConfig w = c;
  w.data_path = {"0.5", prefix, "0.5", prefix};
  expect_error(
      [&] {
        BlendedMegatronDatasetBuilder(w, {100, std::nullopt, 5}).build();
      },
      "needs a sample count for every split");
  fs::remove_all(dir);
}

TEST(BlendedMegatronDatasetBuilder, SeveralProcessesStartingTogetherShareOneCache) {
  // Four "ranks" build the same splits into one --data-cache-path at once: one builds under the
  // lock, the others load its files; all agree, and the folder holds exactly one complete entry
  // per split (no temporaries, no duplicates).
  const fs::path dir =
      fs::temp_directory_path() / ("mg_builder_ranks_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string prefix = (dir / "corpus").string();
  {
    IndexedDatasetBuilder b(get_bin_path(prefix), IndexDType::int32);
    for (int d = 0; d < 200; ++d) {
      std::vector<int64_t> t(static_cast<std::size_t>(20 + d % 37), d);
      b.add_item(std::span<const int64_t>(t));
      b.end_document();
    }
    b.finalize(get_idx_path(prefix));
  }
  DataConfig c;
  c.data_path = {"0.4", prefix, "0.6", prefix};
  c.split = "90,10,0";
  c.seq_length = 16;
  c.data_cache_path = (dir / "cache").string();
  std::vector<pid_t> kids;
  for (int r = 0; r < 4; ++r) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        const DatasetSplits s = BlendedMegatronDatasetBuilder(c, {500, 50, 0}).build();
        // Every rank writes what it read; the parent compares.
        std::ofstream out(dir / ("rank" + std::to_string(r)));
        out << s[0]->unique_description_hash() << " " << s[0]->size();
        for (int64_t k = 0; k < s[0]->size(); k += 37) out << " " << s[0]->get(k).tokens[3];
      } catch (...) {
        code = 1;
      }
      ::_exit(code);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::string first;
  for (int r = 0; r < 4; ++r) {
    std::ifstream in(dir / ("rank" + std::to_string(r)));
    const std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (r == 0) first = got;
    EXPECT_FALSE(got.empty());
    EXPECT_EQ(got, first) << "rank " << r;
  }
  int descriptions = 0;
  for (const auto& e : fs::directory_iterator(dir / "cache")) {
    const std::string f = e.path().filename().string();
    EXPECT_EQ(f.find(".tmp"), std::string::npos) << f;
    if (f.ends_with("-description.txt")) ++descriptions;
  }
  // GPTDataset train + valid for each of the 2 prefixes (same prefix, different num_samples),
  // BlendedDataset train + valid; "90,10,0" has no test split.
  EXPECT_EQ(descriptions, 6);
  fs::remove_all(dir);
}

TEST(BlendedMegatronDatasetBuilder, MockIsNotCachedWithoutAPath) {
  DataConfig c;
  c.seq_length = 16;
  c.vocab_size = 1000;
  c.eod_id = 0;
  c.reset_attention_mask = true;
  const DatasetSplits s = BlendedMegatronDatasetBuilder(c, {4, 4, 4}).build();
  ASSERT_NE(s[2], nullptr);
  EXPECT_EQ(s[2]->class_name(), "MockGPTDataset");
  const GPTSample g = s[2]->get(0);
  EXPECT_EQ(g.doc_ids.size(), 16u);
}

}  // namespace
}  // namespace mg::datasets
