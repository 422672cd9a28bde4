// The per-rank memory estimate (memory_estimate.h): its parameter count equals the model's own for
// dense, GQA/SwiGLU/RMSNorm, MoE and pipeline-stage models; the state bytes follow the dtypes and
// the distributed optimizer; activations scale with sequence length and micro-batch size and are
// divided by TP/SP/CP and cut by full recompute; an absurd --seq-length is refused naming the flag.
#include "megatron/training/memory_estimate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/pipeline_parallel/layer_layout.h"
#include "megatron/training/model_provider.h"
#include "tests/unit/test_util.h"

namespace mg::training {
namespace {

constexpr int64_t kVocab = 300;  // padded to 384 (128 x TP 1)

// The base flags, each replaced where `extra` gives it.
Arguments parse(std::vector<std::string> extra) {
  const std::vector<std::pair<std::string, std::string>> base = {
      {"--num-layers", "4"},  {"--hidden-size", "64"},     {"--num-attention-heads", "4"},
      {"--seq-length", "32"}, {"--micro-batch-size", "2"}, {"--train-iters", "1"},
      {"--lr", "1e-3"},       {"--vocab-size", "300"}};
  std::vector<std::string> a = {"--mock-data"};
  for (const auto& [k, v] : base)
    if (std::find(extra.begin(), extra.end(), k) == extra.end()) a.insert(a.end(), {k, v});
  a.insert(a.end(), extra.begin(), extra.end());
  return parse_args(a);
}

// The model's own parameter count on pipeline rank p of pp (its chunks built alone).
int64_t model_count(const Arguments& args, int pp = 1, int p = 0) {
  test::ensure_runtime();
  models::GPTModelParallel par;
  if (pp > 1)
    par.pipeline_chunks =
        pipeline_parallel::make_pipeline_layout(args.model.num_layers, pp, 1, std::nullopt,
                                                std::nullopt, std::nullopt)
            .chunks(p);
  auto m = model_provider(args.model, kVocab, test::ops_on("cpu"), Device::cpu(), par);
  return m->num_parameters();
}

TEST(MemoryEstimate, ParameterCountEqualsTheModelsForEachArchitecture) {
  const std::vector<std::vector<std::string>> variants = {
      {},  // GPT-2: layernorm, gelu, biases, learned positions, tied
      {"--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear",
       "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights",
       "--group-query-attention", "--num-query-groups", "2"},
      {"--qk-layernorm", "--add-qkv-bias", "--disable-bias-linear", "--ffn-hidden-size", "96"},
      {"--num-experts", "4", "--moe-router-topk", "2", "--moe-shared-expert-intermediate-size",
       "48", "--moe-layer-freq", "2", "--swiglu", "--disable-bias-linear"},
  };
  for (const auto& v : variants) {
    const Arguments a = parse(v);
    const MemoryLayout l = memory_layout(a, 1);
    const MemoryEstimate e = estimate_memory(a, kVocab, l, 0);
    EXPECT_EQ(static_cast<int64_t>(e.num_parameters), model_count(a))
        << "flags: " << testing::PrintToString(v);
  }
}

TEST(MemoryEstimate, ParameterCountPerPipelineStage) {
  for (const auto& v :
       std::vector<std::vector<std::string>>{{}, {"--untie-embeddings-and-output-weights"}}) {
    std::vector<std::string> f = v;
    f.insert(f.end(), {"--pipeline-model-parallel-size", "2", "--global-batch-size", "8"});
    const Arguments a = parse(f);
    const MemoryLayout l = memory_layout(a, 2);
    EXPECT_EQ(l.pp, 2);
    EXPECT_EQ(l.num_microbatches, 4);
    for (int p = 0; p < 2; ++p)
      EXPECT_EQ(static_cast<int64_t>(estimate_memory(a, kVocab, l, p).num_parameters),
                model_count(a, 2, p))
          << "rank " << p << " flags " << testing::PrintToString(v);
    // 1F1B: the first stage holds min(PP, M) micro-batches, the last one.
    EXPECT_EQ(estimate_memory(a, kVocab, l, 0).microbatches_in_flight, 2);
    EXPECT_EQ(estimate_memory(a, kVocab, l, 1).microbatches_in_flight, 1);
  }
}

TEST(MemoryEstimate, StateBytesFollowDtypesAndTheDistributedOptimizer) {
  const Arguments f32 = parse({});
  const MemoryEstimate e32 = estimate_memory(f32, kVocab, memory_layout(f32, 1), 0);
  const double n = e32.num_parameters;
  EXPECT_DOUBLE_EQ(e32.parameter_bytes, 4 * n);
  EXPECT_DOUBLE_EQ(e32.gradient_bytes, 4 * n);
  EXPECT_DOUBLE_EQ(e32.optimizer_bytes, 8 * n);  // Adam's two f32 moments, params are the masters

  const Arguments bf = parse({"--bf16"});
  const MemoryEstimate ebf = estimate_memory(bf, kVocab, memory_layout(bf, 1), 0);
  EXPECT_DOUBLE_EQ(ebf.parameter_bytes, 2 * n);
  EXPECT_DOUBLE_EQ(ebf.gradient_bytes, 4 * n);    // f32 main grads
  EXPECT_DOUBLE_EQ(ebf.optimizer_bytes, 12 * n);  // f32 master + 2 moments

  const Arguments sgd = parse({"--optimizer", "sgd"});
  EXPECT_DOUBLE_EQ(estimate_memory(sgd, kVocab, memory_layout(sgd, 1), 0).optimizer_bytes, 4 * n);

  const Arguments dopt = parse({"--bf16", "--use-distributed-optimizer"});
  const MemoryLayout l4 = memory_layout(dopt, 4);
  EXPECT_EQ(l4.dp, 4);
  EXPECT_EQ(sharding_divisors(dopt, l4).optimizer_state, 4);
  EXPECT_EQ(sharding_divisors(dopt, l4).gradients, 1);
  EXPECT_EQ(sharding_divisors(bf, memory_layout(bf, 4)).optimizer_state, 1);
  const MemoryEstimate ed = estimate_memory(dopt, kVocab, l4, 0);
  EXPECT_DOUBLE_EQ(ed.optimizer_bytes, 12 * n / 4);
  EXPECT_DOUBLE_EQ(ed.parameter_bytes, 2 * n);
  EXPECT_EQ(ed.fsdp_parameter_bytes + ed.fsdp_gradient_bytes, 0.0);

  // FSDP: the strategies divide over the dp-cp group; ZeRO-2/3 hold unsharded copies in flight.
  const Arguments z2 =
      parse({"--bf16", "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"});
  const MemoryEstimate e2 = estimate_memory(z2, kVocab, memory_layout(z2, 4), 0);
  EXPECT_DOUBLE_EQ(e2.gradient_bytes, 4 * n / 4);
  EXPECT_DOUBLE_EQ(e2.parameter_bytes, 2 * n);
  EXPECT_DOUBLE_EQ(e2.fsdp_gradient_bytes, 4 * n * 3 / 4);  // no overlap: all until reduced
  EXPECT_EQ(e2.fsdp_parameter_bytes, 0.0);
  const Arguments z3 =
      parse({"--bf16", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
             "optim_grads_params", "--overlap-grad-reduce", "--overlap-param-gather",
             "--ddp-bucket-size", "1000", "--context-parallel-size", "2"});
  const MemoryLayout l8 = memory_layout(z3, 8);
  EXPECT_EQ(l8.dp * l8.cp, 8);
  EXPECT_EQ(sharding_divisors(z3, l8).parameters, 8);
  const MemoryEstimate e3 = estimate_memory(z3, kVocab, l8, 0);
  EXPECT_DOUBLE_EQ(e3.parameter_bytes, 2 * n / 8);
  EXPECT_DOUBLE_EQ(e3.optimizer_bytes, 12 * n / 8);
  // Two 1000-element buckets gathered (one prefetched), 7/8 of each not this rank's. Gradients:
  // three whole buckets in flight, the one written, the one reduced and the tied embedding's,
  // open from the head's backward to the lookup's. The shard accumulator is gradient_bytes'
  // shard: this rank's own range is given back between micro-batches while the accumulator
  // holds its sum.
  EXPECT_DOUBLE_EQ(e3.fsdp_parameter_bytes, 2 * 1000 * 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(e3.gradient_bytes, 4 * n / 8);
  EXPECT_DOUBLE_EQ(e3.fsdp_gradient_bytes, 3 * 1000 * 4.0);
}

// MoE under the distributed optimizer: routed experts are sharded over the expert data-parallel
// group (world / EP at expert TP 1), the rest over dp-cp.
TEST(MemoryEstimate, ExpertsShardOverTheExpertDataParallelGroup) {
  const std::vector<std::string> moe = {"--bf16",
                                        "--num-experts",
                                        "4",
                                        "--moe-ffn-hidden-size",
                                        "32",
                                        "--disable-bias-linear",
                                        "--use-distributed-optimizer"};
  std::vector<std::string> ep2 = moe;
  ep2.insert(ep2.end(), {"--expert-model-parallel-size", "2"});
  const Arguments a = parse(ep2);
  const MemoryLayout l4 = memory_layout(a, 4);  // DP 4, EP 2: expert data-parallel 2
  const ShardingDivisors d = sharding_divisors(a, l4);
  EXPECT_EQ(d.optimizer_state, 4);
  EXPECT_EQ(d.expert_optimizer_state, 2);
  EXPECT_EQ(d.expert_gradients, 1);
  const MemoryEstimate e = estimate_memory(a, kVocab, l4, 0);
  // 4 MoE layers x 2 local experts x (fc1 32 x 64 + fc2 64 x 32).
  const double ne = 4 * 2 * (32.0 * 64 + 64.0 * 32);
  const double n = e.num_parameters;
  EXPECT_DOUBLE_EQ(e.optimizer_bytes, 12 * ((n - ne) / 4 + ne / 2));
  EXPECT_DOUBLE_EQ(e.parameter_bytes, 2 * n);
  // TP 2 on 2 ranks: data-parallel size 1, but the whole experts are sharded over the 2 TP ranks.
  std::vector<std::string> tp2 = moe;
  tp2.insert(tp2.end(), {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                         "--expert-tensor-parallel-size", "1"});
  const Arguments t = parse(tp2);
  const ShardingDivisors dt = sharding_divisors(t, memory_layout(t, 2));
  EXPECT_EQ(dt.optimizer_state, 1);
  EXPECT_EQ(dt.expert_optimizer_state, 2);
  // Expert TP 2 (Megatron's default with TP 2) on 4 ranks, DP 2: each rank holds half of every
  // local expert, and the expert data-parallel group is world / (ETP x EP) = 2.
  std::vector<std::string> etp2 = moe;
  etp2.insert(etp2.end(), {"--tensor-model-parallel-size", "2", "--sequence-parallel"});
  const Arguments x = parse(etp2);
  const MemoryLayout lx = memory_layout(x, 4);
  EXPECT_EQ(lx.etp, 2);
  EXPECT_EQ(sharding_divisors(x, lx).expert_optimizer_state, 2);
  std::vector<std::string> etp1 = etp2;
  etp1.insert(etp1.end(), {"--expert-tensor-parallel-size", "1"});
  const Arguments y = parse(etp1);
  const double ex = estimate_memory(x, kVocab, lx, 0).num_parameters,
               ey = estimate_memory(y, kVocab, memory_layout(y, 4), 0).num_parameters;
  // The routed experts (4 per layer here, EP 1) lose half their elements per rank under ETP 2.
  EXPECT_DOUBLE_EQ(ey - ex, 4 * 4 * (32.0 * 64 + 64.0 * 32) / 2);
}

// --optimizer-cpu-offload on a device: the fraction's masters, moments and staging are host
// memory, outside the device total; on the CPU platform (optimizer_offload off) nothing moves.
TEST(MemoryEstimate, OptimizerOffloadMovesTheFractionToHostMemory) {
  const Arguments a = parse({"--bf16", "--use-distributed-optimizer", "--optimizer-cpu-offload",
                             "--optimizer-offload-fraction", "0.25"});
  MemoryLayout l = memory_layout(a, 2);
  const MemoryEstimate host = estimate_memory(a, kVocab, l, 0);
  const double n = host.num_parameters;
  EXPECT_DOUBLE_EQ(host.optimizer_bytes, 12 * n / 2);
  EXPECT_EQ(host.host_optimizer_bytes, 0.0);
  l.optimizer_offload = true;
  const MemoryEstimate dev = estimate_memory(a, kVocab, l, 0);
  EXPECT_DOUBLE_EQ(dev.optimizer_bytes, 0.75 * 12 * n / 2);
  // f32 master + 2 moments + f32 gradient staging + bf16 weight staging, of a quarter of the shard.
  EXPECT_DOUBLE_EQ(dev.host_optimizer_bytes, 0.25 * (n / 2) * (4 + 8 + 4 + 2));
  EXPECT_DOUBLE_EQ(host.total_bytes() - dev.total_bytes(), 0.25 * 12 * n / 2);
  EXPECT_NE(dev.str().find("in host memory, offloaded"), std::string::npos) << dev.str();
}

// --fp8-param-gather: the FP8 weight elements equal the model's FP8 parameter storage (dense,
// SwiGLU with GQA, MoE with a shared expert, first / last layers in bf16), and the parameter
// bytes grow by 1 per element (their FP8 copy).
TEST(MemoryEstimate, Fp8ParametersAreOneBytePerElement) {
  const std::vector<std::vector<std::string>> variants = {
      {},
      {"--swiglu", "--disable-bias-linear", "--group-query-attention", "--num-query-groups", "2",
       "--first-last-layers-bf16"},
      {"--num-experts", "4", "--moe-router-topk", "2", "--moe-shared-expert-intermediate-size",
       "48", "--moe-layer-freq", "2", "--swiglu", "--disable-bias-linear"},
  };
  for (auto v : variants) {
    const std::vector<std::string> base = v;
    v.insert(v.end(), {"--fp8-format", "hybrid", "--use-distributed-optimizer", "--bf16"});
    std::vector<std::string> pg = v;
    pg.push_back("--fp8-param-gather");
    const Arguments a = parse(v), b = parse(pg);
    const MemoryLayout l = memory_layout(b, 1);
    const MemoryEstimate e0 = estimate_memory(a, kVocab, l, 0);
    const MemoryEstimate e = estimate_memory(b, kVocab, l, 0);
    test::ensure_runtime();
    auto m = model_provider(b.model, kVocab, test::ops_on("cpu"), Device::cpu(), {});
    ASSERT_NE(m->fp8_state(), nullptr);
    int64_t stored = 0;
    for (const auto& r : m->fp8_state()->param_runs()) stored += r.data.numel();
    EXPECT_GT(stored, 0);
    EXPECT_EQ(static_cast<int64_t>(e.num_fp8_parameters), stored)
        << "flags: " << testing::PrintToString(base);
    EXPECT_EQ(e0.num_fp8_parameters, 0.0);
    EXPECT_EQ(e.parameter_bytes, e0.parameter_bytes + static_cast<double>(stored));
  }
}

TEST(MemoryEstimate, ActivationsScaleWithTokensAndParallelism) {
  auto act = [](std::vector<std::string> f, int world = 1) {
    const Arguments a = parse(f);
    const MemoryLayout l = memory_layout(a, world);
    return estimate_memory(a, kVocab, l, 0);
  };
  const MemoryEstimate e = act({});
  EXPECT_GT(e.activation_bytes, 0);
  EXPECT_GT(e.logits_bytes, 0);
  // Linear in S and B (learned positions grow the parameters, not the activations).
  const MemoryEstimate s2 = act({"--seq-length", "64", "--max-position-embeddings", "64"});
  EXPECT_DOUBLE_EQ(s2.activation_bytes, 2 * e.activation_bytes);
  EXPECT_GT(s2.parameter_bytes, e.parameter_bytes);
  const MemoryEstimate b2 = act({"--micro-batch-size", "4"});
  EXPECT_DOUBLE_EQ(b2.activation_bytes, 2 * e.activation_bytes);
  // CP halves the local tokens.
  const MemoryEstimate cp = act({"--context-parallel-size", "2"}, 2);
  EXPECT_DOUBLE_EQ(cp.activation_bytes, e.activation_bytes / 2);
  // TP shards the per-head and FFN parts; SP the H-wide ones too.
  const MemoryEstimate tp = act({"--tensor-model-parallel-size", "2"}, 2);
  const MemoryEstimate sp = act({"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 2);
  EXPECT_LT(tp.activation_bytes_per_layer, e.activation_bytes_per_layer);
  EXPECT_GT(tp.activation_bytes_per_layer, e.activation_bytes_per_layer / 2);
  EXPECT_DOUBLE_EQ(sp.activation_bytes_per_layer, e.activation_bytes_per_layer / 2);
  // Full recompute keeps each layer's input only.
  const MemoryEstimate rc = act({"--recompute-granularity", "full", "--recompute-method", "uniform",
                                 "--recompute-num-layers", "1"});
  EXPECT_LT(rc.activation_bytes, e.activation_bytes / 2);
  EXPECT_DOUBLE_EQ(rc.activation_bytes_per_layer, e.activation_bytes_per_layer);
}

TEST(MemoryEstimate, AbsurdSequenceLengthIsRefusedNamingTheFlag) {
  const Arguments ok = parse({});
  const MemoryEstimate small = estimate_peak_memory(ok, kVocab, memory_layout(ok, 1));
  AvailableMemory avail{24.0 * (1ull << 30), "host memory 24 GiB"};
  EXPECT_NO_THROW(check_memory_fits(small, avail, ok));
  EXPECT_LT(small.total_bytes(), 64.0 * (1 << 20));

  const Arguments bad = parse({"--seq-length", "100000000", "--position-embedding-type", "rope"});
  const MemoryEstimate big = estimate_peak_memory(bad, kVocab, memory_layout(bad, 1));
  try {
    check_memory_fits(big, avail, bad);
    ADD_FAILURE() << "no error for --seq-length 100000000 (estimate " << big.str() << ")";
  } catch (const Error& err) {
    const std::string m = err.message();
    EXPECT_NE(m.find("--seq-length 100000000"), std::string::npos) << m;
    EXPECT_NE(m.find("host memory 24 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("activations"), std::string::npos) << m;
  }
  // Learned positions: the table of --max-position-embeddings rows drives the parameters.
  const Arguments pos = parse({"--seq-length", "32", "--max-position-embeddings", "400000000"});
  const MemoryEstimate ep = estimate_peak_memory(pos, kVocab, memory_layout(pos, 1));
  try {
    check_memory_fits(ep, avail, pos);
    ADD_FAILURE() << "no error for --max-position-embeddings 400000000";
  } catch (const Error& err) {
    EXPECT_NE(err.message().find("--max-position-embeddings 400000000"), std::string::npos)
        << err.message();
  }
}

TEST(MemoryEstimate, FormatBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1.5 * (1 << 30)), "1.50 GiB");
}

}  // namespace
}  // namespace mg::training
