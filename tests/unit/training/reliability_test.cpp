// Nothing bad gets saved (issue 24): a diverging fp16 run and a NaN gradient under a finite loss
// stop with an error and leave the tracker on the last good checkpoint; fp16 stops after a bounded
// number of skips at the minimum loss scale; a save refuses NaN weights naming them; an absurd
// --seq-length is refused up front with the estimate; the estimate covers what a run allocates.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/datasets/indexed_dataset.h"
#include "megatron/core/dist_checkpointing/safetensors.h"
#include "megatron/training/checkpointing.h"
#include "megatron/training/memory_estimate.h"
#include "megatron/training/reliability.h"
#include "megatron/training/training.h"
#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  return test::scratch_dir("mg_reliability_test", name);
}

// A tiny GPT on mock data; the lr warms up from 0 over 2 iterations (iteration 1 does not move the
// weights, so its checkpoint is good whatever --lr is).
std::vector<std::string> tiny(int64_t iters, std::vector<std::string> extra = {}) {
  const std::vector<std::pair<std::string, std::string>> base = {
      {"--num-layers", "2"},
      {"--hidden-size", "32"},
      {"--num-attention-heads", "4"},
      {"--seq-length", "32"},
      {"--micro-batch-size", "2"},
      {"--global-batch-size", "2"},
      {"--train-iters", std::to_string(iters)},
      {"--lr-warmup-iters", "2"},
      {"--vocab-size", "128"},
      {"--eval-iters", "0"},
      {"--log-interval", "1"}};
  std::vector<std::string> f = test::flags_with(base, extra);  // each replaced where given
  f.insert(f.begin(), "--mock-data");
  return f;
}

PretrainResult run(const std::vector<std::string>& flags, std::string* log_out = nullptr,
                   const PretrainHooks& hooks = {}) {
  std::ostringstream log;
  PretrainResult r;
  try {
    r = pretrain(parse_args(flags), log, hooks);
  } catch (...) {
    if (log_out) *log_out = log.str();
    throw;
  }
  if (log_out) *log_out = log.str();
  return r;
}

// Every float in the model file of checkpoint `iteration` under `dir` is finite.
void expect_checkpoint_finite(const std::string& dir, int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(iteration));
  const fs::path d = fs::path(dir) / name;
  ASSERT_TRUE(fs::exists(d)) << d;
  int64_t tensors = 0;
  for (const auto& f : fs::directory_iterator(d)) {
    if (f.path().extension() != ".safetensors") continue;
    const dist_checkpointing::SafetensorsFile file(f.path().string());
    for (const auto& key : file.names()) {
      ++tensors;
      const Tensor t = file.tensor(key);
      if (!is_floating(t.dtype())) continue;
      for (double v : t.to_vector<double>())
        ASSERT_TRUE(std::isfinite(v)) << f.path() << " " << key;
    }
  }
  EXPECT_GT(tensors, 0);
}

TEST(Reliability, DivergingFp16RunStopsAndKeepsTheTrackerOnTheLastGoodCheckpoint) {
  test::ensure_runtime();
  const std::string dir = temp_dir("fp16_diverge");
  // lr 1e10: iteration 2's Adam step moves the f32 masters to ~1e10, which round to inf in fp16.
  const auto e = test::error_message([&] {
    run(tiny(20, {"--fp16", "--initial-loss-scale", "16", "--lr", "1e10", "--save", dir,
                  "--save-interval", "1"}));
  });
  EXPECT_NE(e.find("refusing to save iteration 2"), std::string::npos) << e;
  EXPECT_NE(e.find("holds NaN/inf values; the tracker stays at iteration 1"), std::string::npos)
      << e;
  EXPECT_EQ(read_latest_iteration(dir), 1);
  expect_checkpoint_finite(dir, 1);
  EXPECT_FALSE(fs::exists(fs::path(dir) / "iter_0000002"));
}

TEST(Reliability, Fp16StopsAfterBoundedSkipsAtTheMinimumLossScale) {
  test::ensure_runtime();
  std::string log;
  const auto e = test::error_message([&] {
    run(tiny(40, {"--fp16", "--initial-loss-scale", "16", "--lr", "1e10"}), &log);
  });
  EXPECT_NE(e.find(std::to_string(kMaxFp16SkipsAtMinLossScale) +
                   " consecutive iterations skipped (inf/nan loss or gradients) at the minimum "
                   "loss scale 1"),
            std::string::npos)
      << e;
  // 16 -> 1 takes 2 (hysteresis) + 3 halvings; then the bound. Well before --train-iters 40.
  EXPECT_EQ(log.find("iteration       40/"), std::string::npos) << log;
  // --no-check-for-nan-in-loss-and-grad: the user asked to skip; the run ends, every skip counted.
  const PretrainResult r = run(tiny(20, {"--fp16", "--initial-loss-scale", "16", "--lr", "1e10",
                                         "--no-check-for-nan-in-loss-and-grad"}));
  EXPECT_EQ(r.iteration, 20);
  EXPECT_GE(r.skipped_iters, 15);
}

// A NaN in one gradient element while the loss is finite (what a NaN weight does one step later).
class NanGradTest : public ::testing::TestWithParam<std::string> {};

TEST_P(NanGradTest, StopsBeforeTheStepNamingTheParameter) {
  test::ensure_runtime();
  const std::string dir = temp_dir("nan_grad_" + GetParam());
  std::string poisoned;
  PretrainHooks hooks;
  hooks.after_forward_backward = [&](int64_t it, double&, models::LanguageModule& m) {
    if (it != 2) return;
    auto& p = m.parameters()[3];
    poisoned = p.name;
    Tensor g = p.main_grad.slice(0, 1);
    const std::vector<float> nan(static_cast<std::size_t>(g.numel()), std::nanf(""));
    g.copy_(Tensor::from_vector(nan, g.shape()).to(g.dtype()));
  };
  std::vector<std::string> extra = {"--lr", "1e-3", "--save", dir, "--save-interval", "1"};
  if (GetParam() == "bf16") extra.push_back("--bf16");
  const auto e = test::error_message([&] { run(tiny(6, extra), nullptr, hooks); });
  EXPECT_NE(e.find("grad norm is nan at iteration 3"), std::string::npos) << e;
  EXPECT_NE(e.find("the step was not applied; first parameter with a non-finite gradient on this "
                   "rank: " +
                   poisoned),
            std::string::npos)
      << e;
  EXPECT_EQ(read_latest_iteration(dir), 2);
  expect_checkpoint_finite(dir, 2);
  // Opted out: the step is skipped and counted, never applied; the run ends with finite weights.
  const std::string dir2 = temp_dir("nan_grad_skip_" + GetParam());
  extra[3] = dir2;
  extra.push_back("--no-check-for-nan-in-loss-and-grad");
  const PretrainResult r = run(tiny(6, extra), nullptr, hooks);
  EXPECT_EQ(r.iteration, 6);
  EXPECT_EQ(r.skipped_iters, 1);
  EXPECT_EQ(r.nan_iters, 1);
  for (double l : r.train_losses) EXPECT_TRUE(std::isfinite(l));
  expect_checkpoint_finite(dir2, 6);
}

INSTANTIATE_TEST_SUITE_P(Reliability, NanGradTest, ::testing::Values("f32", "bf16"));

TEST(Reliability, SaveRefusesANanWeightNamingIt) {
  test::ensure_runtime();
  const std::string dir = temp_dir("nan_weight");
  PretrainHooks hooks;
  std::string poisoned;
  hooks.after_forward_backward = [&](int64_t it, double&, models::LanguageModule& m) {
    if (it != 1) return;
    auto& p = m.parameters()[2];
    poisoned = p.name;
    Tensor w = p.param.slice(0, 1);
    const std::vector<float> nan(static_cast<std::size_t>(w.numel()), std::nanf(""));
    w.copy_(Tensor::from_vector(nan, w.shape()).to(w.dtype()));
  };
  const auto e = test::error_message([&] {
    run(tiny(4, {"--lr", "1e-3", "--save", dir, "--save-interval", "1"}), nullptr, hooks);
  });
  EXPECT_NE(e.find("refusing to save iteration 2 to " + dir + ": parameter '" + poisoned +
                   "' holds NaN/inf values; the tracker stays at iteration 1"),
            std::string::npos)
      << e;
  EXPECT_EQ(read_latest_iteration(dir), 1);
}

TEST(Reliability, AbsurdSequenceLengthIsRefusedUpFrontWithTheEstimate) {
  test::ensure_runtime();
  const auto t0 = std::chrono::steady_clock::now();
  const auto e = test::error_message([&] {
    run(tiny(4,
             {"--seq-length", "100000000", "--position-embedding-type", "rope", "--lr", "1e-3"}));
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 5.0);
  EXPECT_NE(e.find("this run cannot fit in memory"), std::string::npos) << e;
  EXPECT_NE(e.find("driven by --seq-length 100000000"), std::string::npos) << e;
  EXPECT_NE(e.find("is available"), std::string::npos) << e;
  EXPECT_NE(e.find("host memory"), std::string::npos) << e;
}

// The estimate is printed at start-up and covers what the run allocated (peak, on the host
// allocator), without overshooting it by more than 2x on this small model.
TEST(Reliability, EstimateCoversTheMeasuredPeak) {
  test::ensure_runtime();
  std::string log;
  run(tiny(3, {"--lr", "1e-3", "--hidden-size", "64", "--seq-length", "128"}), &log);
  const auto at = log.find("memory estimate (pipeline rank 0): ");
  ASSERT_NE(at, std::string::npos) << log;
  const auto peak_at = log.rfind("mem max allocated (MB): ");
  ASSERT_NE(peak_at, std::string::npos) << log;
  const double peak_mb = std::stod(log.substr(peak_at + 24));
  const Arguments a =
      parse_args(tiny(3, {"--lr", "1e-3", "--hidden-size", "64", "--seq-length", "128"}));
  const MemoryEstimate est = estimate_memory(a, 128, memory_layout(a, 1), 0);
  const double est_mb = est.total_bytes() / (1024.0 * 1024.0);
  EXPECT_GE(est_mb, 0.8 * peak_mb) << est.str();
  EXPECT_LE(est_mb, 2.0 * peak_mb) << est.str();
}

// The smaller guards: no data asked for, a negative size, an empty split, stale staging folders.
TEST(Reliability, NoDataFlagIsAnErrorNotMockData) {
  test::ensure_runtime();
  std::vector<std::string> f = tiny(3, {"--lr", "1e-3"});
  f.erase(std::find(f.begin(), f.end(), "--mock-data"));
  const auto e = test::error_message([&] { run(f); });
  EXPECT_NE(e.find("no data: pass --data-path"), std::string::npos) << e;
}

TEST(Reliability, NegativeHiddenSizeIsRefusedAsSuch) {
  const auto e = test::error_message([&] { parse_args(tiny(2, {"--hidden-size", "-1"})); });
  EXPECT_NE(e.find("--hidden-size) must be >= 1, got -1"), std::string::npos) << e;
}

TEST(Reliability, AnEmptySplitNamesTheSplitAndTheFile) {
  test::ensure_runtime();
  const std::string dir = temp_dir("empty_split");
  const std::string prefix = dir + "/tiny";
  {
    datasets::IndexedDatasetBuilder b(datasets::get_bin_path(prefix), datasets::IndexDType::uint16);
    for (int d = 0; d < 3; ++d) {
      std::vector<int64_t> ids(40, 5 + d);
      b.add_item(std::span<const int64_t>(ids));
      b.end_document();
    }
    b.finalize(datasets::get_idx_path(prefix));
  }
  std::vector<std::string> f = tiny(3, {"--lr", "1e-3", "--data-path", prefix, "--split", "98,1,1",
                                        "--eval-iters", "1", "--data-cache-path", dir + "/cache"});
  f.erase(std::find(f.begin(), f.end(), "--mock-data"));
  const auto e = test::error_message([&] { run(f); });
  EXPECT_NE(e.find("the valid split of '" + prefix + "'"), std::string::npos) << e;
}

TEST(Reliability, StaleStagingFoldersOfKilledSavesAreRemoved) {
  test::ensure_runtime();
  const std::string dir = temp_dir("stale");
  // A dead process's staging and moved-aside folders; a live process's (this test's parent) stays.
  const fs::path dead = fs::path(dir) / "iter_0000007.tmp.999999999";
  const fs::path dead_old = fs::path(dir) / "iter_0000003.old.999999998";
  const fs::path live = fs::path(dir) / ("iter_0000009.tmp." + std::to_string(::getppid()));
  for (const auto& p : {dead, dead_old, live}) fs::create_directories(p / "x");
  run(tiny(3, {"--lr", "1e-3", "--save", dir}));
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(dead_old));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_EQ(read_latest_iteration(dir), 3);
}

}  // namespace
}  // namespace mg::training
