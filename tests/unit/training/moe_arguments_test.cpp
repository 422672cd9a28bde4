// The MoE / expert-parallel flags: values land in TransformerConfig and Arguments with Megatron's
// defaults, --moe-layer-freq as an integer or a pattern, and the early errors naming the bad value
// and what is valid (what this build does not support yet included).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "megatron/training/arguments.h"
#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

using transformer::MoeLoadBalancingType;
using transformer::MoeScoreFunction;
using transformer::MoeTokenDispatcherType;
using transformer::MoeTokenDropPolicy;

std::vector<std::string> with(std::vector<std::string> extra) {
  std::vector<std::string> v = {"--num-layers",
                                "4",
                                "--hidden-size",
                                "64",
                                "--num-attention-heads",
                                "4",
                                "--seq-length",
                                "32",
                                "--micro-batch-size",
                                "2",
                                "--train-iters",
                                "10",
                                "--lr",
                                "1e-3",
                                "--mock-data",
                                "--tokenizer-type",
                                "NullTokenizer",
                                "--vocab-size",
                                "100",
                                "--disable-bias-linear"};
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

std::string error_of(const std::vector<std::string>& args) {
  return test::error_message([&] { parse_args(args); });
}

TEST(MoEArguments, FlagsAndMegatronDefaults) {
  const Arguments d = parse_args(with({"--num-experts", "8"}));
  EXPECT_EQ(d.model.num_moe_experts, 8);
  EXPECT_EQ(d.model.moe_router_topk, 2);
  EXPECT_EQ(d.model.moe_router_load_balancing_type, MoeLoadBalancingType::aux_loss);
  EXPECT_EQ(d.model.moe_token_dispatcher_type, MoeTokenDispatcherType::allgather);
  EXPECT_FALSE(d.model.moe_expert_capacity_factor.has_value());
  EXPECT_EQ(d.model.expert_ffn_hidden_size(), d.model.ffn_hidden_size);
  EXPECT_EQ(d.parallel.expert_model_parallel_size, 1);
  for (int64_t l = 0; l < 4; ++l) EXPECT_TRUE(d.model.is_moe_layer(l));

  const Arguments a = parse_args(with({"--num-experts",
                                       "4",
                                       "--moe-router-topk",
                                       "1",
                                       "--moe-router-load-balancing-type",
                                       "seq_aux_loss",
                                       "--moe-aux-loss-coeff",
                                       "0.01",
                                       "--moe-z-loss-coeff",
                                       "0.001",
                                       "--moe-router-score-function",
                                       "sigmoid",
                                       "--moe-expert-capacity-factor",
                                       "1.5",
                                       "--moe-token-drop-policy",
                                       "position",
                                       "--moe-token-dispatcher-type",
                                       "alltoall",
                                       "--moe-ffn-hidden-size",
                                       "32",
                                       "--moe-shared-expert-intermediate-size",
                                       "16",
                                       "--moe-layer-freq",
                                       "2",
                                       "--moe-grouped-gemm",
                                       "--expert-model-parallel-size",
                                       "2"}));
  const auto& m = a.model;
  EXPECT_EQ(m.moe_router_topk, 1);
  EXPECT_EQ(m.moe_router_load_balancing_type, MoeLoadBalancingType::seq_aux_loss);
  EXPECT_EQ(m.moe_aux_loss_coeff, 0.01);
  EXPECT_EQ(m.moe_z_loss_coeff, 0.001);
  EXPECT_EQ(m.moe_router_score_function, MoeScoreFunction::sigmoid);
  EXPECT_EQ(*m.moe_expert_capacity_factor, 1.5);
  EXPECT_EQ(m.moe_token_drop_policy, MoeTokenDropPolicy::position);
  EXPECT_EQ(m.moe_token_dispatcher_type, MoeTokenDispatcherType::alltoall);
  EXPECT_EQ(m.expert_ffn_hidden_size(), 32);
  EXPECT_EQ(m.moe_shared_expert_intermediate_size, 16);
  EXPECT_TRUE(m.moe_grouped_gemm);
  EXPECT_EQ(a.parallel.expert_model_parallel_size, 2);
  EXPECT_TRUE(m.is_moe_layer(0));
  EXPECT_FALSE(m.is_moe_layer(1));
  EXPECT_TRUE(m.is_moe_layer(2));

  const Arguments p = parse_args(with({"--num-experts", "4", "--moe-layer-freq", "[0, 1, 1, 0]"}));
  EXPECT_FALSE(p.model.is_moe_layer(0));
  EXPECT_TRUE(p.model.is_moe_layer(1));
  EXPECT_TRUE(p.model.is_moe_layer(2));
  EXPECT_FALSE(p.model.is_moe_layer(3));
}

// The layouts of Mixtral / DeepSeek-V3 are accepted: the distributed optimizer with EP and with
// TP (experts sharded over the expert data-parallel group), context parallelism with MoE.
TEST(MoEArguments, DistributedOptimizerAndContextParallelism) {
  const Arguments d = parse_args(with(
      {"--num-experts", "4", "--expert-model-parallel-size", "2", "--use-distributed-optimizer"}));
  EXPECT_TRUE(d.ddp.use_distributed_optimizer);
  EXPECT_EQ(d.parallel.expert_model_parallel_size, 2);
  const Arguments t = parse_args(
      with({"--num-experts", "4", "--tensor-model-parallel-size", "2", "--sequence-parallel",
            "--expert-tensor-parallel-size", "1", "--use-distributed-optimizer"}));
  EXPECT_TRUE(t.ddp.use_distributed_optimizer);
  for (const char* comm : {"p2p", "a2a", "allgather"}) {
    const Arguments c = parse_args(with({"--num-experts", "4", "--expert-model-parallel-size", "2",
                                         "--context-parallel-size", "2", "--cp-comm-type", comm}));
    EXPECT_EQ(c.parallel.context_parallel_size, 2);
    EXPECT_EQ(c.parallel.cp_comm_type, comm);
  }
}

TEST(MoEArguments, ErrorsNameTheValues) {
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos;
  };
  EXPECT_TRUE(has(error_of(with({"--num-experts", "4", "--moe-router-topk", "5"})),
                  "--moe-router-topk 5 must be in [1, --num-experts 4]"));
  EXPECT_TRUE(has(error_of(with({"--expert-model-parallel-size", "2"})), "needs --num-experts"));
  EXPECT_TRUE(has(error_of(with({"--num-experts", "6", "--expert-model-parallel-size", "4"})),
                  "--num-experts 6 must be divisible by --expert-model-parallel-size 4"));
  // Expert TP: Megatron's default (TP) is accepted; it must divide the experts' hidden size.
  EXPECT_FALSE(parse_args(with({"--num-experts", "4", "--tensor-model-parallel-size", "2",
                                "--sequence-parallel"}))
                   .parallel.expert_tensor_parallel_size.has_value());
  EXPECT_TRUE(has(error_of(with({"--num-experts", "4", "--moe-ffn-hidden-size", "30",
                                 "--tensor-model-parallel-size", "4", "--sequence-parallel"})),
                  "--expert-tensor-parallel-size 4 (Megatron's default: TP) must divide the "
                  "experts' hidden size 30"));
  EXPECT_TRUE(has(error_of(with({"--num-experts", "4", "--expert-tensor-parallel-size", "0"})),
                  "--expert-tensor-parallel-size must be >= 1, got 0"));
  // Expert TP with the distributed optimizer parses (pretrain_gpt_moe_etp runs it).
  EXPECT_EQ(parse_args(with({"--num-experts", "4", "--expert-tensor-parallel-size", "2",
                             "--use-distributed-optimizer"}))
                .parallel.expert_tensor_parallel_size,
            2);
  EXPECT_TRUE(has(error_of(with({"--num-experts", "4", "--tensor-model-parallel-size", "2",
                                 "--expert-tensor-parallel-size", "1"})),
                  "needs --sequence-parallel"));
  EXPECT_TRUE(has(error_of(with({"--num-experts", "4", "--moe-expert-capacity-factor", "1"})),
                  "--moe-token-dispatcher-type alltoall only"));
  EXPECT_TRUE(has(error_of(with({"--num-experts", "4", "--moe-layer-freq", "[1,0]"})),
                  "one per layer (num_layers 4)"));
  EXPECT_TRUE(has(error_of(with({"--num-experts", "4", "--moe-layer-freq", "x"})),
                  "--moe-layer-freq x: expected an integer or a list"));
  // Experts take biases (SequentialMLP); the grouped GEMM and the shared experts do not.
  auto without_disable_bias = [](std::vector<std::string> v) {
    v.erase(std::find(v.begin(), v.end(), "--disable-bias-linear"));
    return v;
  };
  EXPECT_TRUE(parse_args(without_disable_bias(with({"--num-experts", "4"}))).model.add_bias_linear);
  EXPECT_TRUE(
      has(error_of(without_disable_bias(with({"--num-experts", "4", "--moe-grouped-gemm"}))),
          "--moe-grouped-gemm: bias in the expert layer is not supported"));
  EXPECT_TRUE(has(error_of(without_disable_bias(
                      with({"--num-experts", "4", "--moe-shared-expert-intermediate-size", "8"}))),
                  "bias is not supported in the shared experts"));
}

}  // namespace
}  // namespace mg::training
