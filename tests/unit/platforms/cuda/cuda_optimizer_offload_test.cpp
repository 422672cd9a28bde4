// --optimizer-cpu-offload on CUDA: the offload engine (grads copied to pinned host memory, the CPU
// platform's adamw_step, weights copied back in the model dtype) against the device's Adam, for
// fractions 1.0 and 0.5, with and without the distributed optimizer, bf16 and f32.
//   - The grad norms are bit-identical (both are computed on the device gradients).
//   - The model weights are the model-dtype rounding of the master weights in both runs.
//   - The f32 master weights agree to kMasterUlps ulps: both kernels evaluate the same
//     expressions in the same order with IEEE division and square root; GCC
//     (-ffp-contract=fast) and nvcc each contract a*b+c into FMAs where they choose, and each
//     contraction drops one rounding, so the results may differ in the last bits. The test prints
//     how many elements differ at all.
//   - The optimizer's device allocations shrink by the offloaded state (fraction 1.0: none left).
// Skips with the CUDA platform's reason where no GPU is usable.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/plugin/registry.h"
#include "tests/unit/core/optimizer/optimizer_test_util.h"

namespace mg::test {
namespace {

using optimizer::MegatronOptimizer;
using optimizer::OptimizerConfig;
using optimizer::ShardOptions;
using namespace opt;

// Four steps of Adam, each element's update a few f32 roundings whose FMA contraction may differ
// between the two compilers: a difference of one rounding per contracted expression, carried
// into the next step through m, v and the weight. 8 ulps bounds that with room for the four
// steps; a wrong copy, offset or dtype gives differences of millions of ulps.
constexpr int64_t kMasterUlps = 8;

int64_t ulps_apart(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if ((ia < 0) != (ib < 0)) return a == b ? 0 : INT64_MAX;
  return std::llabs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

comm::ProcessGroupPtr single_group() {
  static std::unique_ptr<comm::Communicator> c = comm::init_communicator("single");
  return c->world();
}

struct OffloadRunResult {
  std::vector<double> norms;
  std::vector<std::vector<double>> masters, model;
  std::size_t device_bytes = 0;  // the optimizer's device allocations
};

OffloadRunResult train(DType dtype, bool sharded, std::optional<double> fraction) {
  const Device dev = device_for("cuda");
  plugin::Platform& platform = plugin::global_registry().platform(dev.type);
  auto m = make_model(dtype, DType::f32, dev);
  OptimizerConfig cfg;
  cfg.params_dtype = dtype;
  cfg.bf16 = dtype == DType::bf16;
  cfg.clip_grad = 1.0;
  if (fraction) {
    cfg.optimizer_cpu_offload = true;
    cfg.optimizer_offload_fraction = *fraction;
  }
  std::optional<ShardOptions> shard;
  if (sharded) {
    shard.emplace();
    shard->ranges = {{3, 15}, {16, 30}};
    shard->group = single_group();
  }
  OffloadRunResult r;
  platform.synchronize(dev.index);
  const std::size_t before = platform.memory_stats(dev.index).allocated_bytes;
  MegatronOptimizer opt(cfg, m.params, m.buffer, ops_on("cuda"), {}, std::move(shard));
  r.device_bytes = platform.memory_stats(dev.index).allocated_bytes - before;
  for (int s = 0; s < 4; ++s) {
    set_grads(m, make_grads(700 + 10 * static_cast<uint64_t>(s)));
    const auto res = opt.step(1e-2, 0.1);
    EXPECT_TRUE(res.success);
    r.norms.push_back(res.grad_norm);
    opt.zero_grad();
  }
  r.model = model_values(m);
  // The f32 masters: per parameter, or the shard's (the model itself for f32).
  if (!sharded)
    r.masters = master_values(opt, m.params.size());
  else if (dtype == DType::f32)
    r.masters = r.model;
  else
    r.masters = {opt.state_dict().tensor("optimizer.shard.fp32_param").to_vector<double>()};
  // The model weights are the model-dtype rounding of the masters.
  if (!sharded) {
    for (std::size_t i = 0; i < m.params.size(); ++i)
      EXPECT_EQ(m.params[i].param.to_vector<double>(),
                opt.master_param(i).to(dtype).to_vector<double>())
          << m.params[i].name;
  }
  return r;
}

class CudaOptimizerOffloadTest : public ::testing::TestWithParam<std::tuple<DType, bool, double>> {
 protected:
  void SetUp() override { MG_SKIP_IF_UNAVAILABLE("cuda"); }
};

TEST_P(CudaOptimizerOffloadTest, MatchesDeviceAdam) {
  const auto [dtype, sharded, fraction] = GetParam();
  const OffloadRunResult dev = train(dtype, sharded, std::nullopt);
  const OffloadRunResult off = train(dtype, sharded, fraction);
  EXPECT_EQ(off.norms, dev.norms);
  EXPECT_LT(off.device_bytes, dev.device_bytes);
  if (fraction == 1.0) {
    EXPECT_LE(off.device_bytes, 4096u) << "only found_inf is left";
  }
  int64_t differing = 0, worst = 0;
  const auto& a = off.masters;
  const auto& b = dev.masters;
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t e = 0; e < a[i].size(); ++e) {
      const int64_t u = ulps_apart(static_cast<float>(a[i][e]), static_cast<float>(b[i][e]));
      differing += u != 0;
      worst = std::max(worst, u);
    }
  std::cout << "offload vs device Adam: " << differing << " elements differ, at most " << worst
            << " ulps (f32)" << std::endl;
  EXPECT_LE(worst, kMasterUlps);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<DType, bool, double>>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) +
         (std::get<1>(info.param) ? "_dist_opt" : "") +
         (std::get<2>(info.param) == 1.0 ? "_fraction_1" : "_fraction_half");
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaOptimizerOffloadTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16),
                                            ::testing::Bool(), ::testing::Values(1.0, 0.5)),
                         case_name);

}  // namespace
}  // namespace mg::test
