// pretrain_gpt as a user runs it: --help, one clear error line (exit 1) for a bad flag or
// conflicting flags before any work, and a short mock-data run with its Megatron log lines.
#include <gtest/gtest.h>

#include <string>

#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

const std::string kBin = std::string(MG_BIN_DIR) + "/pretrain_gpt";
const std::string kTiny =
    " --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16"
    " --micro-batch-size 2 --train-iters 2 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer"
    " --vocab-size 64 --eval-iters 1 --log-interval 1";

TEST(PretrainGpt, Help) {
  auto r = test::run_command(kBin + " --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.output.find("--num-layers"), std::string::npos);
}

TEST(PretrainGpt, BadFlagsGiveOneLineBeforeAnyWork) {
  auto r = test::run_command(kBin + kTiny + " --hiden-size 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "pretrain_gpt: error: unrecognized argument --hiden-size; did you mean "
            "--hidden-size?\n");
  r = test::run_command(kBin + kTiny + " --bf16 --fp16");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output, "pretrain_gpt: error: --fp16 and --bf16 conflict; give only one of them\n");
}

TEST(PretrainGpt, TrainsOnMockData) {
  auto r = test::run_command(kBin + kTiny);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("] iteration        2/       2 | consumed samples:            4 |"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("test loss at iteration 2 on test set"), std::string::npos);
}

}  // namespace
}  // namespace mg::training
