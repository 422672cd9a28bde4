// Tests of MegatronPretrainingSampler and DataIterator (megatron/core/datasets/data_samplers.h):
// Megatron's rank/micro-batch layout, drop_last, the exact restore of consumed_samples, cyclic
// wrap-around, prefetching equal to no prefetching, collation into [B, S] tensors, and errors.
#include "megatron/core/datasets/data_samplers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "megatron/core/common/error.h"

namespace mg::datasets {
namespace {

// Sample k: tokens all k, labels k+1, doc_ids when asked; throws at `fail_at`.
class FakeDataset final : public MegatronDataset {
 public:
  FakeDataset(int64_t n, int64_t S, bool doc_ids = false, int64_t fail_at = -1)
      : n_(n), S_(S), doc_ids_(doc_ids), fail_at_(fail_at) {}
  int64_t size() const override { return n_; }
  GPTSample get(int64_t k) const override {
    MG_CHECK(k != fail_at_, "FakeDataset: sample " << k << " is broken");
    ++gets;
    GPTSample s;
    const std::size_t S = static_cast<std::size_t>(S_);
    s.tokens.assign(S, k);
    s.labels.assign(S, k + 1);
    s.loss_mask.assign(S, 1.0f);
    for (std::size_t i = 0; i < S; ++i) s.position_ids.push_back(static_cast<int64_t>(i));
    if (doc_ids_)
      for (std::size_t i = 0; i < S; ++i) s.doc_ids.push_back(static_cast<int32_t>(i / 2));
    return s;
  }
  std::string_view class_name() const override { return "FakeDataset"; }
  const std::string& unique_description() const override { return desc_; }
  const std::string& unique_description_hash() const override { return desc_; }
  mutable std::atomic<int64_t> gets{0};

 private:
  int64_t n_, S_;
  bool doc_ids_;
  int64_t fail_at_;
  std::string desc_ = "fake";
};

std::vector<std::vector<int64_t>> drain(MegatronPretrainingSampler& s) {
  std::vector<std::vector<int64_t>> out;
  while (auto b = s.next()) out.push_back(*b);
  return out;
}

TEST(MegatronPretrainingSampler, RanksTakeTheirSliceOfEachGroup) {
  // 10 samples, mbs 2, dp 2: groups [0..4), [4..8); rank 1 takes positions 2,3 of each.
  MegatronPretrainingSampler r0(10, 0, 2, 0, 2), r1(10, 0, 2, 1, 2);
  EXPECT_EQ(drain(r0), (std::vector<std::vector<int64_t>>{{0, 1}, {4, 5}}));
  EXPECT_EQ(drain(r1), (std::vector<std::vector<int64_t>>{{2, 3}, {6, 7}}));
  EXPECT_EQ(r1.consumed_samples(), 8);
}

TEST(MegatronPretrainingSampler, KeepsTheLastPartialGroupWithoutDropLast) {
  MegatronPretrainingSampler r0(10, 0, 2, 0, 2, false), r1(10, 0, 2, 1, 2, false);
  EXPECT_EQ(drain(r0), (std::vector<std::vector<int64_t>>{{0, 1}, {4, 5}, {8, 9}}));
  EXPECT_EQ(drain(r1), (std::vector<std::vector<int64_t>>{{2, 3}, {6, 7}}));  // none left for it
  MegatronPretrainingSampler odd(9, 0, 2, 0, 2, false);
  EXPECT_EQ(drain(odd).back(), (std::vector<int64_t>{8}));
}

TEST(MegatronPretrainingSampler, StartsAtConsumedSamples) {
  MegatronPretrainingSampler s(20, 8, 2, 1, 2);
  EXPECT_EQ(*s.next(), (std::vector<int64_t>{10, 11}));
}

TEST(MegatronPretrainingSampler, RejectsBadArguments) {
  EXPECT_THROW(MegatronPretrainingSampler(0, 0, 1, 0, 1), Error);
  EXPECT_THROW(MegatronPretrainingSampler(10, 10, 1, 0, 1), Error);
  EXPECT_THROW(MegatronPretrainingSampler(10, 0, 0, 0, 1), Error);
  EXPECT_THROW(MegatronPretrainingSampler(10, 0, 1, 2, 2), Error);
  try {
    MegatronPretrainingSampler(10, 0, 1, 3, 2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data_parallel_rank 3 must be in [0, 2)"),
              std::string::npos)
        << e.what();
  }
}

TEST(DataIterator, CollatesMicroBatchesIntoTensors) {
  auto ds = std::make_shared<FakeDataset>(12, 4, true);
  DataIteratorOptions o;
  o.micro_batch_size = 3;
  DataIterator it(ds, o);
  auto mb = it.next();
  ASSERT_TRUE(mb.has_value());
  EXPECT_EQ(mb->tokens.shape(), (Shape{3, 4}));
  EXPECT_EQ(mb->tokens.dtype(), DType::i64);
  EXPECT_EQ(mb->labels.dtype(), DType::i64);
  EXPECT_EQ(mb->loss_mask.dtype(), DType::f32);
  EXPECT_EQ(mb->position_ids.dtype(), DType::i64);
  ASSERT_TRUE(mb->doc_ids.defined());
  EXPECT_EQ(mb->doc_ids.dtype(), DType::i32);
  EXPECT_EQ(mb->doc_ids.shape(), (Shape{3, 4}));
  EXPECT_EQ(mb->tokens.to_vector<int64_t>(),
            (std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}));
  EXPECT_EQ(mb->doc_ids.to_vector<int32_t>(),
            (std::vector<int32_t>{0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(mb->sample_indices, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(it.consumed_samples(), 3);
  auto no_doc = DataIterator(std::make_shared<FakeDataset>(4, 4), o).next();
  EXPECT_FALSE(no_doc->doc_ids.defined());
}

std::vector<std::vector<int64_t>> all_indices(DataIterator& it, int max_batches = 1000) {
  std::vector<std::vector<int64_t>> out;
  while (max_batches-- > 0) {
    auto mb = it.next();
    if (!mb) break;
    out.push_back(mb->sample_indices);
  }
  return out;
}

TEST(DataIterator, SinglePassEndsAndPrefetchChangesNothing) {
  auto ds = std::make_shared<FakeDataset>(23, 2);
  for (int depth : {0, 1, 4}) {
    DataIteratorOptions o;
    o.micro_batch_size = 2;
    o.data_parallel_rank = 1;
    o.data_parallel_size = 3;
    o.prefetch_depth = depth;
    DataIterator it(ds, o);
    const auto got = all_indices(it);
    // Groups of 6 from 0: 3 full groups (18 samples); rank 1 takes positions 2,3.
    EXPECT_EQ(got, (std::vector<std::vector<int64_t>>{{2, 3}, {8, 9}, {14, 15}}))
        << "depth " << depth;
    EXPECT_EQ(it.consumed_samples(), 18);
    EXPECT_FALSE(it.next().has_value());  // stays at the end
  }
}

TEST(DataIterator, RestoredPositionContinuesExactly) {
  auto ds = std::make_shared<FakeDataset>(40, 2);
  for (bool cyclic : {false, true}) {
    DataIteratorOptions o;
    o.micro_batch_size = 2;
    o.data_parallel_size = 2;
    o.cyclic = cyclic;
    DataIterator full(ds, o);
    const auto reference = all_indices(full, 25);  // cyclic: crosses the end of the pass
    DataIterator first(ds, o);
    for (int i = 0; i < 7; ++i) first.next();
    const int64_t saved = first.consumed_samples();
    EXPECT_EQ(saved, 28);
    o.consumed_samples = saved;
    DataIterator resumed(ds, o);
    const auto rest = all_indices(resumed, 18);
    ASSERT_EQ(rest.size(), reference.size() - 7) << "cyclic " << cyclic;
    for (std::size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], reference[7 + i]);
  }
}

TEST(DataIterator, CyclicWrapsToSampleZeroAndKeepsCounting) {
  auto ds = std::make_shared<FakeDataset>(7, 2);  // groups of 3: 2 full groups, 1 sample dropped
  DataIteratorOptions o;
  o.micro_batch_size = 3;
  o.cyclic = true;
  DataIterator it(ds, o);
  EXPECT_EQ(all_indices(it, 5), (std::vector<std::vector<int64_t>>{
                                    {0, 1, 2}, {3, 4, 5}, {0, 1, 2}, {3, 4, 5}, {0, 1, 2}}));
  EXPECT_EQ(it.consumed_samples(), 15);  // 2 passes of 6, then 3
  o.consumed_samples = 15;
  DataIterator resumed(ds, o);
  EXPECT_EQ(resumed.next()->sample_indices, (std::vector<int64_t>{3, 4, 5}));
}

TEST(DataIterator, PrefetchesAheadOnItsThread) {
  auto ds = std::make_shared<FakeDataset>(100, 2);
  DataIteratorOptions o;
  o.micro_batch_size = 1;
  o.prefetch_depth = 3;
  DataIterator it(ds, o);
  it.next();
  for (int i = 0; i < 200 && ds->gets.load() < 4; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(ds->gets.load(), 4);  // the one returned + 3 queued, and no more
}

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) as torch 2.x computes it
// (tests/fixtures/megatron_core/torch_randperm.json, written by gen_torch_randperm.py).
TEST(TorchRandperm, MatchesTorch) {
  std::ifstream in(std::filesystem::path(MG_TEST_FIXTURES_DIR) / "megatron_core" /
                   "torch_randperm.json");
  const auto j = nlohmann::json::parse(in);
  ASSERT_GE(j["cases"].size(), 5u);
  for (const auto& c : j["cases"]) {
    const auto want = c["perm"].get<std::vector<int64_t>>();
    EXPECT_EQ(torch_randperm(c["n"].get<int64_t>(), c["seed"].get<uint64_t>()), want)
        << "n " << c["n"] << " seed " << c["seed"];
  }
}

// Megatron's MegatronPretrainingRandomSampler (data_sharding): 23 samples, mbs 2, dp 3: groups of
// 6, 18 samples per epoch, each rank a bucket of 6 samples visited in torch_randperm(6, epoch)
// order; the position survives a restore and the count runs on across epochs.
TEST(MegatronPretrainingRandomSampler, EpochPermutationsOfEachRanksBucket) {
  std::vector<std::vector<int64_t>> per_rank(3);
  for (int64_t r = 0; r < 3; ++r) {
    MegatronPretrainingRandomSampler s(23, 0, 2, r, 3);
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<int64_t> got;
      for (int b = 0; b < 3; ++b) {
        const auto batch = s.next();
        ASSERT_EQ(batch.size(), 2u);
        got.insert(got.end(), batch.begin(), batch.end());
      }
      std::vector<int64_t> want;
      for (int64_t k : torch_randperm(6, static_cast<uint64_t>(epoch))) want.push_back(r * 6 + k);
      EXPECT_EQ(got, want) << "rank " << r << " epoch " << epoch;
      if (epoch == 0) per_rank[static_cast<std::size_t>(r)] = got;
    }
    EXPECT_EQ(s.consumed_samples(), 36);  // 2 epochs x 18, all ranks
  }
  EXPECT_NE(torch_randperm(6, 0), torch_randperm(6, 1));  // epochs are reshuffled
  // Restored after 2 micro-batches of epoch 1 (consumed 18 + 12): the same continuation.
  MegatronPretrainingRandomSampler full(23, 0, 2, 1, 3);
  for (int b = 0; b < 5; ++b) full.next();
  MegatronPretrainingRandomSampler resumed(23, 30, 2, 1, 3);
  for (int b = 0; b < 4; ++b) EXPECT_EQ(resumed.next(), full.next()) << "batch " << b;
  EXPECT_THROW(MegatronPretrainingRandomSampler(23, 7, 2, 1, 3), Error);  // not a batch boundary
  EXPECT_THROW(MegatronPretrainingRandomSampler(5, 0, 2, 0, 3), Error);   // < one group
}

// --num-workers: any number of collating threads hands out the same micro-batches in the same
// order as collating on the caller's thread (random sampler and single pass).
TEST(DataIterator, WorkersKeepTheOrder) {
  auto ds = std::make_shared<FakeDataset>(50, 2);
  for (bool random : {false, true}) {
    std::vector<std::vector<int64_t>> reference;
    for (int workers : {0, 1, 3, 8}) {
      DataIteratorOptions o;
      o.micro_batch_size = 2;
      o.data_parallel_rank = 1;
      o.data_parallel_size = 2;
      o.random = random;
      o.cyclic = random;
      o.num_workers = workers;
      o.prefetch_depth = 2 * workers;
      DataIterator it(ds, o);
      const auto got = all_indices(it, 30);
      if (workers == 0) {
        reference = got;
        EXPECT_EQ(got.size(), random ? 30u : 12u);
      }
      EXPECT_EQ(got, reference) << "workers " << workers << " random " << random;
      if (random) {
        EXPECT_EQ(it.consumed_samples(), 30 * 4);
      }
    }
  }
}

TEST(DataIterator, RethrowsDatasetErrors) {
  auto ds = std::make_shared<FakeDataset>(10, 2, false, 3);
  for (int depth : {0, 2}) {
    DataIteratorOptions o;
    o.micro_batch_size = 2;
    o.prefetch_depth = depth;
    DataIterator it(ds, o);
    EXPECT_TRUE(it.next().has_value());
    try {
      it.next();
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sample 3 is broken"), std::string::npos);
    }
    EXPECT_FALSE(it.next().has_value());
  }
}

TEST(DataIterator, RejectsBadOptions) {
  auto ds = std::make_shared<FakeDataset>(10, 2);
  DataIteratorOptions o;
  o.micro_batch_size = 0;
  EXPECT_THROW(DataIterator(ds, o), Error);
  o.micro_batch_size = 4;
  o.consumed_samples = 11;
  EXPECT_THROW(DataIterator(ds, o), Error);
  o.consumed_samples = 0;
  o.cyclic = true;
  o.data_parallel_size = 3;  // a group of 12 > 10 samples: a cyclic pass yields nothing
  EXPECT_THROW(DataIterator(ds, o), Error);
  EXPECT_THROW(DataIterator(nullptr, DataIteratorOptions{}), Error);
}

}  // namespace
}  // namespace mg::datasets
