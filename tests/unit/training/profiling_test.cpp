// The op profile (--profile-op-table, ops::OpProfiler) and the host round-trips of a training step
// (host_sync.h), on the CPU platform: a GEMM's FLOPs are 2·M·N·K, causal attention counts the kept
// positions, shares of the step sum to at most 100 %, calls outside the window are not counted,
// and a step of 4 micro-batches reads its losses once.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/common/host_sync.h"
#include "megatron/core/ops/op_profiler.h"
#include "megatron/runtime.h"
#include "megatron/training/arguments.h"
#include "megatron/training/training.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

Runtime& cpu_runtime() {
  return mg::init({.platform = "cpu"});
}

TEST(OpProfiler, CountsGemmFlopsAttentionPositionsAndBytes) {
  Runtime& rt = cpu_runtime();
  ops::OpProfiler prof(*rt.ops, *rt.platform, rt.device);
  const ops::OpTable& t = prof.table();
  const int64_t m = 8, n = 16, k = 32, batch = 3;
  Tensor a = Tensor::zeros({m, k}, DType::f32), b = Tensor::zeros({k, n}, DType::f32);
  Tensor c = Tensor::zeros({m, n}, DType::f32);
  Tensor a3 = Tensor::zeros({batch, k, m}, DType::f32),
         b3 = Tensor::zeros({batch, k, n}, DType::f32);
  Tensor c3 = Tensor::zeros({batch, m, n}, DType::f32);

  t.gemm(c, a, b, {});  // before start(): not profiled
  prof.start();
  prof.begin_step();
  t.gemm(c, a, b, {});
  t.gemm(c3, a3, b3, {.trans_a = true});
  t.axpy(c, c, 1.0f);
  const int64_t s = 16, bb = 2, nh = 2, hd = 8;
  Tensor q = Tensor::zeros({s, bb, nh, hd}, DType::f32),
         out = Tensor::zeros({s, bb, nh, hd}, DType::f32);
  Tensor lse = Tensor::zeros({bb, nh, s}, DType::f32);
  ops::AttentionArgs causal;
  causal.causal = true;
  t.attention_fwd(out, lse, q, q, q, causal);
  prof.end_step();
  prof.stop();
  t.gemm(c, a, b, {});  // after stop(): not profiled
  const ops::OpProfileReport rep = prof.report();

  ASSERT_EQ(rep.steps, 1);
  EXPECT_GT(rep.step_ms, 0.0);
  const ops::OpProfileRow* g = rep.find("gemm");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->calls, 2);
  EXPECT_DOUBLE_EQ(g->flops, 2.0 * m * n * k + 2.0 * batch * m * n * k);
  EXPECT_DOUBLE_EQ(g->bytes, 4.0 * (m * k + k * n + m * n + batch * (k * m + k * n + m * n)));
  const ops::OpProfileRow* ax = rep.find("axpy");
  ASSERT_NE(ax, nullptr);
  EXPECT_EQ(ax->flops, 0.0);  // unknown: GB/s only
  EXPECT_DOUBLE_EQ(ax->bytes, 2.0 * 4.0 * m * n);
  const ops::OpProfileRow* at = rep.find("attention_fwd");
  ASSERT_NE(at, nullptr);
  // Causal, Sq = Sk = 16: 16·17/2 = 136 kept positions per (batch, head), 4·HD FLOPs each.
  EXPECT_DOUBLE_EQ(at->flops, 4.0 * hd * 136.0 * bb * nh);
  double shares = 0.0;
  for (const auto& r : rep.rows) {
    EXPECT_GE(r.total_ms, 0.0) << r.op;
    shares += rep.share(r);
  }
  EXPECT_LE(shares, 100.0 + 1e-9);
  EXPECT_LE(rep.ops_ms, rep.step_ms);
  // The table lists every op with its numbers.
  const std::string table = ops::format_op_profile(rep);
  for (const char* op : {"gemm", "axpy", "attention_fwd", "(outside ops)", "(step)"})
    EXPECT_NE(table.find(op), std::string::npos) << op << " missing from\n" << table;
  // The report forgets what it read.
  EXPECT_TRUE(prof.report().rows.empty());
}

TEST(OpProfiler, OneAtATime) {
  Runtime& rt = cpu_runtime();
  ops::OpProfiler first(*rt.ops, *rt.platform, rt.device);
  EXPECT_THROW(ops::OpProfiler(*rt.ops, *rt.platform, rt.device), Error);
}

TEST(HostSync, ReadsCountAtTheirSite) {
  const HostSyncCounts before = host_sync_counts();
  const Tensor t = Tensor::from_vector(std::vector<float>{1.0f, 2.0f}, {2});
  EXPECT_EQ(host_read<float>(t, HostSync::found_inf)[1], 2.0f);
  (void)t.to_vector<float>();  // a host tensor's copy is no round trip
  const HostSyncCounts d = host_sync_counts() - before;
  EXPECT_EQ(d[HostSync::found_inf], 1);
  EXPECT_EQ(d.total(), 1);
  EXPECT_EQ(d.str(), "found_inf 1");
}

// ---- through pretrain ---------------------------------------------------------------------------

std::vector<std::string> tiny(std::vector<std::string> extra) {
  const std::vector<std::pair<std::string, std::string>> base = {
      {"--num-layers", "2"},    {"--hidden-size", "32"},       {"--num-attention-heads", "4"},
      {"--seq-length", "32"},   {"--micro-batch-size", "1"},   {"--global-batch-size", "4"},
      {"--train-iters", "4"},   {"--vocab-size", "128"},       {"--eval-iters", "0"},
      {"--log-interval", "10"}, {"--profile-step-start", "1"}, {"--profile-step-end", "3"},
      {"--lr", "1e-3"}};
  std::vector<std::string> f = test::flags_with(base, extra);
  f.insert(f.begin(), "--mock-data");
  return f;
}

std::string run(const std::vector<std::string>& flags) {
  std::ostringstream log;
  training::pretrain(training::parse_args(flags), log);
  return log.str();
}

TEST(ProfileOpTable, TrainingStepTableAndHostRoundTrips) {
  const std::string log = run(tiny({"--profile-op-table"}));
  EXPECT_NE(log.find("profiling: iterations [1, 3) on rank(s) 0: --profile-op-table"),
            std::string::npos)
      << log;
  const auto at = log.find(
      "op profile (--profile-op-table), rank 0, platform cpu, 2 step(s) "
      "ending at iteration 3");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string table = log.substr(at);
  // Every family of the step is listed, once per row; shares add up to at most 100 %.
  // gemm_epilogue has a row per epilogue (the tiny GPT: bias, bias_gelu, dgelu_bgrad, bgrad).
  for (const char* op :
       {"gemm_epilogue.bias", "gemm_epilogue.bias_gelu", "gemm_epilogue.dgelu_bgrad",
        "gemm_epilogue.bgrad", "attention_fwd", "attention_bwd", "cross_entropy_fwd",
        "cross_entropy_bwd", "bias_dropout_add_norm_fwd", "adamw_step", "embedding_fwd",
        "embedding_bwd", "(outside ops)"})
    EXPECT_NE(table.find(std::string("\n") + op + " "), std::string::npos) << op << "\n" << table;
  const std::regex row(R"(\n([a-z_0-9.]+) +\S+ +(\d+) +([0-9.]+) +([0-9.]+) +([0-9.]+|-) )");
  double shares = 0.0;
  int rows = 0;
  for (std::sregex_iterator it(table.begin(), table.end(), row), end; it != end; ++it) {
    ++rows;
    if ((*it)[5] != "-") shares += std::stod((*it)[5]);
  }
  EXPECT_GT(rows, 10) << table;
  EXPECT_LE(shares, 100.0 + 0.01 * rows) << table;  // each printed to 0.01
  // 4 micro-batches per step: the losses are read once, the grad norm once (fp32: no found-inf
  // check, as Megatron's FP32Optimizer).
  EXPECT_NE(table.find("host round-trips per step: loss 1, grad_norm 1\n"), std::string::npos)
      << table;
  // The CPU platform does not launch kernels: the line says so rather than printing zeros.
  EXPECT_NE(table.find("kernel launches per step: not counted (platform cpu runs its ops on host "
                       "threads)\n"),
            std::string::npos)
      << table;
}

// On a GPU the table counts the device work of a step: the platform's kernels and the
// vendor-library calls, at least one per GEMM call of the table (cuBLAS / cuBLASLt providers).
TEST(ProfileOpTable, CountsKernelLaunchesPerStepOnCuda) {
  MG_SKIP_IF_UNAVAILABLE("cuda");
  const std::string log = run(tiny({"--profile-op-table", "--platform", "cuda"}));
  const std::regex line(
      R"(kernel launches per step: ([0-9.]+) of the platform's kernels \+ ([0-9.]+) vendor-library )"
      R"(calls \(GEMMs, fused attention; each may launch more than one kernel\)\n)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, line)) << log;
  const double kernels = std::stod(m[1]), library = std::stod(m[2]);
  const auto at = log.find("op profile (--profile-op-table)");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string table = log.substr(at);
  const std::regex row(R"(\n([a-z_0-9.]+) +(\S+) +(\d+) +[0-9.]+ +[0-9.]+ )");
  double gemm_calls = 0.0;
  for (std::sregex_iterator it(table.begin(), table.end(), row), end; it != end; ++it) {
    const std::string op = (*it)[1], provider = (*it)[2];
    if (op.rfind("gemm", 0) == 0 && provider.find("cublas") != std::string::npos)
      gemm_calls += std::stod((*it)[3]) / 2.0;  // 2 profiled steps
  }
  EXPECT_GT(gemm_calls, 0.0) << table;
  EXPECT_GE(library, gemm_calls) << table;
  EXPECT_GT(kernels, 0.0) << table;  // norms, activations, the optimizer, ...
}

TEST(ProfileOpTable, Fp16StepReadsFoundInfOnce) {
  const std::string log =
      run(tiny({"--profile-op-table", "--fp16", "--initial-loss-scale", "128"}));
  EXPECT_NE(log.find("host round-trips per step: loss 1, found_inf 1, grad_norm 1\n"),
            std::string::npos)
      << log;
}

// An MoE step reads one small buffer of counts per MoE layer and micro-batch (the rows per expert;
// this rank's choices per expert for the log and the load-balancing loss), whatever the router
// options: the chosen experts and the kept mask stay on the device (moe_dispatch_index). 2 MoE
// layers x 4 micro-batches, with a capacity (which used to read the kept mask too) and the
// sequence load-balancing loss; the tiny GPT's log line is not in the profiled steps.
TEST(ProfileOpTable, MoeReadsOneBufferPerLayerAndMicroBatch) {
  for (const char* balancing : {"aux_loss", "seq_aux_loss"}) {
    const std::string log = run(
        tiny({"--profile-op-table", "--num-experts", "4", "--moe-router-topk", "2",
              "--moe-router-load-balancing-type", balancing, "--moe-aux-loss-coeff", "1e-2",
              "--moe-expert-capacity-factor", "1.0", "--moe-token-dispatcher-type", "alltoall"}));
    EXPECT_NE(log.find("host round-trips per step: loss 1, grad_norm 1, moe 8\n"),
              std::string::npos)
        << balancing << "\n"
        << log;
  }
}

TEST(ProfileOpTable, ProfileOnTheCpuSaysThereIsNoTimelineTool) {
  const std::string log = run(tiny({"--profile"}));
  EXPECT_NE(log.find("--profile (platform cpu has no timeline tool: no ranges recorded)"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("op profile"), std::string::npos) << log;  // no table without the flag
}

TEST(ProfileOpTable, BadWindowAndRanksAreRefused) {
  try {
    run(tiny({"--profile-op-table", "--profile-step-start", "3", "--profile-step-end", "3"}));
    FAIL() << "an empty window was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--profile-step-end (3) must be greater than "
                                         "--profile-step-start (3)"),
              std::string::npos)
        << e.what();
  }
  try {
    run(tiny({"--profile-op-table", "--profile-ranks", "0", "5"}));
    FAIL() << "a rank outside the world was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--profile-ranks 5 is not a rank of this run (world "
                                         "size 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(training::parse_args(tiny({"--profile-ranks", "x"})), Error);
}

}  // namespace
}  // namespace mg
