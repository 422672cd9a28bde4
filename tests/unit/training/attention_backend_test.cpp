// --attention-backend (Megatron's AttnBackend): parsing (auto by default, flash refused naming the
// valid ones), the provider choice for each backend from the providers a platform has
// (choose_attention_backend: fused = cuDNN or an error, auto = cuDNN where present, local = ours,
// unfused = our row kernel, MG_OP_PROVIDERS wins), and pretrain_gpt's start-up line on the CPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "megatron/training/arguments.h"
#include "megatron/training/training.h"
#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

const std::vector<std::string> kOurs = {"cuda:attention-tiled", "cuda:attention-rows",
                                        "cuda:attention-mma"};
const std::vector<std::string> kCudnnFwd = {"cuda:attention-tiled", "cuda:attention-rows",
                                            "cuda:cudnn", "cuda:attention-mma"};
const std::vector<std::string> kCudnnBwd = {"cuda:attention-tiled", "cuda:attention-rows",
                                            "cuda:cudnn-deterministic", "cuda:cudnn"};
const std::vector<std::string> kCpu = {"cpu:kernel"};

std::vector<std::string> tiny(std::vector<std::string> extra) {
  std::vector<std::string> v = {"--num-layers",
                                "1",
                                "--hidden-size",
                                "32",
                                "--num-attention-heads",
                                "2",
                                "--seq-length",
                                "16",
                                "--micro-batch-size",
                                "2",
                                "--train-iters",
                                "1",
                                "--lr",
                                "1e-3",
                                "--mock-data",
                                "--tokenizer-type",
                                "NullTokenizer",
                                "--vocab-size",
                                "64"};
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

TEST(AttentionBackend, Parsing) {
  EXPECT_EQ(parse_args(tiny({})).attention_backend, "auto");
  for (const char* b : {"auto", "fused", "unfused", "local"})
    EXPECT_EQ(parse_args(tiny({"--attention-backend", b})).attention_backend, b);
  std::string msg = test::error_message([] { parse_args(tiny({"--attention-backend", "flash"})); });
  EXPECT_NE(msg.find("--attention-backend flash: no FlashAttention library"), std::string::npos)
      << msg;
  msg = test::error_message([] { parse_args(tiny({"--attention-backend", "te"})); });
  EXPECT_NE(msg.find("'te' is not one of"), std::string::npos) << msg;
}

TEST(AttentionBackend, FusedAndAutoPreferCudnn) {
  for (const char* b : {"fused", "auto"}) {
    auto c = choose_attention_backend(b, "cuda", kCudnnFwd, kCudnnBwd, false, {});
    EXPECT_EQ(c.providers.at("attention_fwd"), "cuda:cudnn") << b;
    EXPECT_EQ(c.providers.at("attention_bwd"), "cuda:cudnn") << b;
    EXPECT_NE(c.summary.find(std::string("attention backend: ") + b + " -> cuDNN fused attention"),
              std::string::npos)
        << c.summary;
    c = choose_attention_backend(b, "cuda", kCudnnFwd, kCudnnBwd, true, {});
    EXPECT_EQ(c.providers.at("attention_bwd"), "cuda:cudnn-deterministic") << b;
    EXPECT_NE(c.summary.find("deterministic backward"), std::string::npos) << c.summary;
  }
}

TEST(AttentionBackend, FusedWithoutCudnnIsAnErrorOnCudaAndOursOnTheCpu) {
  // The CPU platform: Megatron scripts' --attention-backend fused runs our kernels, said so.
  const auto cpu = choose_attention_backend("fused", "cpu", kCpu, kCpu, false, {});
  EXPECT_TRUE(cpu.providers.empty());
  EXPECT_EQ(cpu.summary,
            "attention backend: fused -> our kernels (no cuDNN on the CPU platform; fused "
            "attention computes the same function)");
  std::string msg = test::error_message(
      [] { choose_attention_backend("fused", "cuda", kOurs, kOurs, false, {}); });
  EXPECT_NE(msg.find("--attention-backend fused: no cuDNN fused attention on platform 'cuda'"),
            std::string::npos)
      << msg;
  // A deterministic run needs the deterministic backward.
  msg = test::error_message([] {
    choose_attention_backend("fused", "cuda", kCudnnFwd, {"cuda:attention-tiled", "cuda:cudnn"},
                             true, {});
  });
  EXPECT_NE(msg.find("cuda:cudnn-deterministic"), std::string::npos) << msg;
}

TEST(AttentionBackend, LocalUnfusedAndAutoWithoutCudnnRunOurs) {
  auto c = choose_attention_backend("local", "cuda", kCudnnFwd, kCudnnBwd, false, {});
  EXPECT_TRUE(c.providers.empty());
  EXPECT_EQ(c.summary, "attention backend: local -> our kernels");
  c = choose_attention_backend("auto", "cpu", kCpu, kCpu, false, {});
  EXPECT_TRUE(c.providers.empty());
  EXPECT_EQ(c.summary,
            "attention backend: auto -> our kernels (no cuDNN fused attention on "
            "platform 'cpu')");
  c = choose_attention_backend("unfused", "cuda", kCudnnFwd, kCudnnBwd, false, {});
  EXPECT_EQ(c.providers.at("attention_fwd"), "cuda:attention-rows");
  EXPECT_EQ(c.providers.at("attention_bwd"), "cuda:attention-rows");
  c = choose_attention_backend("unfused", "cpu", kCpu, kCpu, false, {});
  EXPECT_TRUE(c.providers.empty());
}

TEST(AttentionBackend, OpProvidersEnvironmentWins) {
  const auto c = choose_attention_backend("fused", "cuda", kCudnnFwd, kCudnnBwd, false,
                                          {{"attention_bwd", "cuda:attention-tiled"}});
  EXPECT_EQ(c.providers.at("attention_fwd"), "cuda:cudnn");
  EXPECT_EQ(c.providers.count("attention_bwd"), 0u);
  EXPECT_NE(c.summary.find("MG_OP_PROVIDERS sets attention_bwd=cuda:attention-tiled"),
            std::string::npos)
      << c.summary;
}

TEST(AttentionBackend, PretrainGptSaysWhichBackendRuns) {
  const std::string bin = std::string(MG_BIN_DIR) + "/pretrain_gpt --platform cpu";
  std::string flags;
  for (const auto& f : tiny({"--eval-iters", "0"})) flags += " " + f;
  auto r = test::run_command(bin + flags);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("attention backend: auto -> our kernels (no cuDNN fused attention on "
                          "platform 'cpu')"),
            std::string::npos)
      << r.output;
  r = test::run_command(bin + flags + " --attention-backend fused");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("attention backend: fused -> our kernels (no cuDNN on the CPU platform"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace mg::training
