// --deterministic-mode: two training runs (dropout on) are bit-identical in every loss, grad norm,
// validation loss and the saved weights and optimizer state; the flag selects its run's op table
// only (a Runtime of its own, mg::init; runtime_test) and shows in the start-up summary; with NCCL
// it needs a fixed NCCL_ALGO (Megatron's check). The multi-rank variant (DP 2 under mpirun) is
// tests/unit/training/deterministic_mode.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "megatron/runtime.h"
#include "megatron/training/training.h"
#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("mg_determinism_test_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

std::vector<std::string> flags(const std::string& save_dir, bool deterministic) {
  std::vector<std::string> f = {"--num-layers",
                                "2",
                                "--hidden-size",
                                "32",
                                "--num-attention-heads",
                                "4",
                                "--seq-length",
                                "32",
                                "--micro-batch-size",
                                "2",
                                "--global-batch-size",
                                "8",
                                "--train-iters",
                                "6",
                                "--lr",
                                "3e-3",
                                "--mock-data",
                                "--vocab-size",
                                "500",
                                "--eval-interval",
                                "3",
                                "--eval-iters",
                                "1",
                                "--log-interval",
                                "1",
                                "--hidden-dropout",
                                "0.1",
                                "--attention-dropout",
                                "0.1",
                                "--bf16",
                                "--save",
                                save_dir};
  if (deterministic) f.push_back("--deterministic-mode");
  return f;
}

TEST(DeterministicMode, TwoRunsAreBitIdentical) {
  test::ensure_runtime();
  const std::string da = temp_dir("a"), db = temp_dir("b"), dc = temp_dir("c");
  std::ostringstream la, lb, lc;
  const PretrainResult a = pretrain(parse_args(flags(da, true)), la);
  // The run's Runtime is its own: deterministic, and not the process's default one.
  Runtime& deterministic = mg::init(RuntimeOptions{.deterministic = true});
  EXPECT_TRUE(deterministic.deterministic());
  EXPECT_NE(&deterministic, &mg::init());
  const PretrainResult b = pretrain(parse_args(flags(db, true)), lb);
  ASSERT_EQ(a.train_losses.size(), 6u);
  EXPECT_EQ(a.train_losses, b.train_losses);
  EXPECT_EQ(a.grad_norms, b.grad_norms);
  EXPECT_EQ(a.valid_loss, b.valid_loss);
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(file_bytes(da + "/iter_0000006/" + f), file_bytes(db + "/iter_0000006/" + f)) << f;
  EXPECT_NE(a.train_losses.front(), a.train_losses.back());  // it trained
  EXPECT_NE(la.str().find(", deterministic mode"), std::string::npos);
  // A run without the flag turns it off again (and is not reported as deterministic).
  const PretrainResult c = pretrain(parse_args(flags(dc, false)), lc);
  EXPECT_FALSE(mg::init().deterministic());
  EXPECT_EQ(lc.str().find(", deterministic mode"), std::string::npos);
  fs::remove_all(fs::path(da).parent_path());
}

TEST(DeterministicMode, FlagParses) {
  EXPECT_FALSE(parse_args(flags("/tmp/unused", false)).deterministic_mode);
  EXPECT_TRUE(parse_args(flags("/tmp/unused", true)).deterministic_mode);
  EXPECT_NE(parse_args(std::vector<std::string>{"--help"}).help_text.find("--deterministic-mode"),
            std::string::npos);
}

TEST(DeterministicMode, NcclNeedsAFixedNcclAlgo) {
  for (const char* ok : {"Tree", "Ring", "CollnetDirect", "CollnetChain", "^NVLS"})
    EXPECT_NO_THROW(check_deterministic_mode("nccl", 8, ok)) << ok;
  for (const char* bad : {"NVLS", "tree,ring", "", "NVLSTree"}) {
    const std::string msg = test::error_message([&] { check_deterministic_mode("nccl", 8, bad); });
    EXPECT_NE(msg.find("NCCL_ALGO"), std::string::npos) << msg;
    const std::string quoted = std::string(1, '\'') + bad + '\'';
    EXPECT_NE(msg.find(quoted), std::string::npos) << msg;
  }
  EXPECT_NE(test::error_message([] { check_deterministic_mode("nccl", 2, nullptr); }).find("unset"),
            std::string::npos);
  // One rank, MPI or the single-rank backend: nothing to pin.
  EXPECT_NO_THROW(check_deterministic_mode("nccl", 1, nullptr));
  EXPECT_NO_THROW(check_deterministic_mode("mpi", 4, nullptr));
  EXPECT_NO_THROW(check_deterministic_mode("single", 1, nullptr));
}

}  // namespace
}  // namespace mg::training
