// The FP8 flags (docs/fp8.md): values into TransformerConfig::fp8, Megatron's defaults, the older
// spellings, and every refusal naming the flag and value.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "megatron/training/arguments.h"
#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

std::vector<std::string> with(std::vector<std::string> extra) {
  std::vector<std::string> v = {"--num-layers",
                                "4",
                                "--hidden-size",
                                "32",
                                "--num-attention-heads",
                                "4",
                                "--seq-length",
                                "16",
                                "--micro-batch-size",
                                "2",
                                "--train-iters",
                                "3",
                                "--lr",
                                "1e-3",
                                "--mock-data",
                                "--tokenizer-type",
                                "NullTokenizer",
                                "--vocab-size",
                                "64",
                                "--bf16"};
  // A flag of the base given again in `extra` replaces the base's value (a flag may appear once).
  for (std::size_t i = 0; i < extra.size(); ++i) {
    auto it = std::find(v.begin(), v.end(), extra[i]);
    if (it != v.end() && i + 1 < extra.size() && it + 1 != v.end() && (it + 1)->rfind("--", 0)) {
      *(it + 1) = extra[++i];
      continue;
    }
    v.push_back(extra[i]);
  }
  return v;
}

std::string error_of(const std::vector<std::string>& extra) {
  return test::error_message([&] { parse_args(with(extra)); });
}

TEST(Fp8Arguments, OffByDefaultAndMegatronsDefaults) {
  const Arguments a = parse_args(with({}));
  EXPECT_FALSE(a.model.fp8.enabled());
  const Arguments b = parse_args(with({"--fp8-format", "hybrid"}));
  const fp8::Fp8Config& f = b.model.fp8;
  EXPECT_EQ(f.format, fp8::Fp8Format::hybrid);
  EXPECT_EQ(f.recipe, fp8::Fp8Recipe::delayed);
  EXPECT_EQ(f.margin, 0);
  EXPECT_EQ(f.amax_history_len, 1);
  EXPECT_EQ(f.amax_compute_algo, fp8::AmaxComputeAlgo::most_recent);
  EXPECT_TRUE(f.wgrad);
  EXPECT_FALSE(f.tp_only_amax_red);
  EXPECT_EQ(f.backward_dtype(), DType::fp8_e5m2);
  EXPECT_EQ(f.forward_dtype(), DType::fp8_e4m3);
}

TEST(Fp8Arguments, ValuesLand) {
  const Arguments a = parse_args(
      with({"--fp8-e4m3", "--fp8-recipe", "tensorwise", "--fp8-margin", "2",
            "--fp8-amax-history-len", "16", "--fp8-amax-compute-algo", "max", "--no-fp8-wgrad",
            "--tp-only-amax-red", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "2",
            "--num-layers-at-end-in-bf16", "1", "--fp8-interval", "1"}));
  const fp8::Fp8Config& f = a.model.fp8;
  EXPECT_EQ(f.format, fp8::Fp8Format::e4m3);
  EXPECT_EQ(f.backward_dtype(), DType::fp8_e4m3);
  EXPECT_EQ(f.recipe, fp8::Fp8Recipe::tensorwise);
  EXPECT_EQ(f.margin, 2);
  EXPECT_EQ(f.amax_history_len, 16);
  EXPECT_EQ(f.amax_compute_algo, fp8::AmaxComputeAlgo::max);
  EXPECT_FALSE(f.wgrad);
  EXPECT_TRUE(f.tp_only_amax_red);
  // 4 layers, 2 at the start and 1 at the end in high precision: only layer 2 in FP8.
  EXPECT_FALSE(f.layer_in_fp8(0, 4));
  EXPECT_FALSE(f.layer_in_fp8(1, 4));
  EXPECT_TRUE(f.layer_in_fp8(2, 4));
  EXPECT_FALSE(f.layer_in_fp8(3, 4));
  EXPECT_EQ(parse_args(with({"--fp8-hybrid"})).model.fp8.format, fp8::Fp8Format::hybrid);
}

// --fp8-dot-product-attention (docs/fp8.md "FP8 attention"): lands in the config, needs FP8, the
// delayed recipe, no CP, no attention dropout, no document masks.
TEST(Fp8Arguments, DotProductAttention) {
  const std::vector<std::string> on = {"--fp8-format", "hybrid", "--fp8-dot-product-attention",
                                       "--attention-dropout", "0"};
  EXPECT_TRUE(parse_args(with(on)).model.fp8.dot_product_attention);
  EXPECT_FALSE(parse_args(with({"--fp8-format", "hybrid"})).model.fp8.dot_product_attention);
  EXPECT_NE(error_of({"--fp8-dot-product-attention", "--attention-dropout", "0"})
                .find("--fp8-dot-product-attention needs --fp8-format"),
            std::string::npos);
  auto plus = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = on;
    v.insert(v.end(), extra.begin(), extra.end());
    return error_of(v);
  };
  EXPECT_NE(plus({"--fp8-recipe", "tensorwise"}).find("needs --fp8-recipe delayed"),
            std::string::npos);
  EXPECT_NE(plus({"--context-parallel-size", "2"}).find("--context-parallel-size 2"),
            std::string::npos);
  EXPECT_NE(plus({"--reset-attention-mask"}).find("--reset-attention-mask"), std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--fp8-dot-product-attention"})
                .find("needs --attention-dropout 0"),
            std::string::npos);
  // Transformer Engine's NVTE_FP8_DPA_BWD: 0 = the backward in the model dtype.
  EXPECT_TRUE(parse_args(with(on)).model.fp8.dot_product_attention_fp8_backward);
  ::setenv("NVTE_FP8_DPA_BWD", "0", 1);
  EXPECT_FALSE(parse_args(with(on)).model.fp8.dot_product_attention_fp8_backward);
  ::setenv("NVTE_FP8_DPA_BWD", "2", 1);
  EXPECT_NE(error_of(on).find("NVTE_FP8_DPA_BWD=2"), std::string::npos);
  ::unsetenv("NVTE_FP8_DPA_BWD");
}

// --fp8-multi-head-attention (Transformer Engine's fp8_mha): lands in the config and implies
// --fp8-dot-product-attention (TE forces fp8_dpa), whose requirements then name it.
TEST(Fp8Arguments, MultiHeadAttention) {
  const std::vector<std::string> on = {"--fp8-format", "hybrid", "--fp8-multi-head-attention",
                                       "--attention-dropout", "0"};
  const Arguments a = parse_args(with(on));
  EXPECT_TRUE(a.model.fp8.multi_head_attention);
  EXPECT_TRUE(a.model.fp8.dot_product_attention);
  EXPECT_FALSE(parse_args(with({"--fp8-format", "hybrid"})).model.fp8.multi_head_attention);
  EXPECT_NE(error_of({"--fp8-multi-head-attention", "--attention-dropout", "0"})
                .find("--fp8-multi-head-attention needs --fp8-format"),
            std::string::npos);
  std::vector<std::string> tw = on;
  tw.insert(tw.end(), {"--fp8-recipe", "tensorwise"});
  EXPECT_NE(error_of(tw).find("--fp8-multi-head-attention needs --fp8-recipe delayed"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--fp8-multi-head-attention"})
                .find("--fp8-multi-head-attention needs --attention-dropout 0"),
            std::string::npos);
}

TEST(Fp8Arguments, Refusals) {
  EXPECT_NE(error_of({"--fp8-format", "e5m2"}).find("--fp8-format"), std::string::npos);
  EXPECT_NE(error_of({"--fp8-e4m3", "--fp8-hybrid"}).find("conflict"), std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "e4m3", "--fp8-hybrid"}).find("conflicts"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"}).find("not built yet"),
            std::string::npos);
  // --fp8-param-gather: Megatron's "only supported with distributed optimizer"; needs FP8.
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--fp8-param-gather"})
                .find("--fp8-param-gather needs --use-distributed-optimizer"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-param-gather", "--use-distributed-optimizer"})
                .find("--fp8-param-gather needs --fp8-format"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--fp8-param-gather", "--use-distributed-optimizer",
                      "--optimizer-cpu-offload"})
                .find("--optimizer-cpu-offload"),
            std::string::npos);
  EXPECT_TRUE(parse_args(with({"--fp8-format", "hybrid", "--fp8-param-gather",
                               "--use-distributed-optimizer"}))
                  .model.fp8.param_gather);
  EXPECT_TRUE(
      parse_args(with({"--fp8-format", "hybrid", "--fp8-param-gather", "--use-megatron-fsdp",
                       "--data-parallel-sharding-strategy", "optim_grads_params"}))
          .model.fp8.param_gather);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--fp8-interval", "2"}).find("--fp8-interval 2"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-margin", "1"}).find("needs --fp8-format"), std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--num-layers-at-end-in-bf16", "1"})
                .find("needs --first-last-layers-bf16"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--first-last-layers-bf16",
                      "--num-layers-at-start-in-bf16", "3", "--num-layers-at-end-in-bf16", "2"})
                .find("at most --num-layers 4"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--fp8-amax-history-len", "0"})
                .find("--fp8-amax-history-len 0"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--seq-length", "20"})
                .find("tokens per micro-batch (--seq-length / CP x --micro-batch-size) is 40"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--hidden-size", "40"}).find("--hidden-size is 40"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--num-attention-heads", "8",
                      "--group-query-attention", "--num-query-groups", "2"})
                .find("key / value projection per tensor-parallel rank is 8"),
            std::string::npos);
  EXPECT_NE(error_of({"--fp8-format", "hybrid", "--recompute-granularity", "full",
                      "--recompute-method", "uniform", "--recompute-num-layers", "1"})
                .find("--recompute-granularity full"),
            std::string::npos);
}

}  // namespace
}  // namespace mg::training
