// --optimizer-cpu-offload's engine against the normal optimizer, on the CPU platform with the
// engine forced on (OptimizerConfig::offload_engine_on_host: both sides are host memory, the
// copies memcpy): the same model weights, grad norms and checkpoint state bit for bit, for
// fractions 1.0 and 0.5 (each also with --overlap-cpu-optimizer-d2h-h2d's pipelined copies), with
// and without the distributed optimizer (shard ranges cutting through
// parameters), f32 / bf16 / fp16, Adam and SGD; which pieces go to the host (Megatron's rule:
// whole pieces while fewer than the fraction are there); checkpoints exchanged between offloaded
// and normal optimizers; a non-finite gradient never reaching the host state. The CUDA
// comparison (offload vs device Adam) is tests/unit/platforms/cuda/cuda_optimizer_offload_test.
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "tests/unit/core/optimizer/optimizer_test_util.h"

namespace {

using mg::Device;
using mg::DType;
using mg::Tensor;
using mg::optimizer::MegatronOptimizer;
using mg::optimizer::OptimizerConfig;
using mg::optimizer::ShardOptions;
using mg::optimizer::StateDict;
using namespace mg::test::opt;

mg::comm::ProcessGroupPtr single_group() {
  static std::unique_ptr<mg::comm::Communicator> c = mg::comm::init_communicator("single");
  return c->world();
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  std::vector<uint8_t> out(h.nbytes());
  std::memcpy(out.data(), h.raw_data(), out.size());
  return out;
}

struct Case {
  DType dtype;
  bool sharded;
  std::string optimizer;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(mg::dtype_name(info.param.dtype)) + (info.param.sharded ? "_dist_opt" : "") +
         "_" + info.param.optimizer;
}

OptimizerConfig config_for(const Case& c, std::optional<double> fraction, bool overlap) {
  OptimizerConfig cfg;
  cfg.optimizer = c.optimizer;
  cfg.clip_grad = 1.0;  // clipping active: the grads are scaled on the "device" before the copy
  cfg.params_dtype = c.dtype;
  cfg.bf16 = c.dtype == DType::bf16;
  cfg.fp16 = c.dtype == DType::f16;
  if (cfg.fp16) cfg.initial_loss_scale = 1024.0;
  if (fraction) {
    cfg.optimizer_cpu_offload = true;
    cfg.optimizer_offload_fraction = *fraction;
    cfg.offload_engine_on_host = true;
    cfg.overlap_cpu_optimizer_d2h_h2d = overlap;
  }
  return cfg;
}

std::optional<ShardOptions> shard_for(const Case& c) {
  if (!c.sharded) return std::nullopt;
  ShardOptions s;
  s.ranges = {{3, 15}, {16, 30}};  // cut through parameters, skip a gap
  s.group = single_group();
  return s;
}

struct Trained {
  TestModel model;
  std::unique_ptr<MegatronOptimizer> opt;
  std::vector<double> norms;
};

Trained make(const Case& c, std::optional<double> fraction, bool overlap = false) {
  Trained t;
  t.model = make_model(c.dtype, DType::f32, Device::cpu());
  t.opt = std::make_unique<MegatronOptimizer>(config_for(c, fraction, overlap), t.model.params,
                                              t.model.buffer, mg::test::ops_on("cpu"),
                                              mg::optimizer::ParamGroupOptions{}, shard_for(c));
  return t;
}

void train(Trained& t, int first_step, int steps) {
  for (int s = first_step; s < first_step + steps; ++s) {
    set_grads(t.model, make_grads(500 + 10 * static_cast<uint64_t>(s),
                                  t.opt->loss_scale() > 1.0f ? 64.0 : 1.0));
    const auto r = t.opt->step(s % 2 ? 2e-2 : 1e-2, 0.1);
    ASSERT_TRUE(r.success) << "step " << s;
    t.norms.push_back(r.grad_norm);
    t.opt->zero_grad();
  }
}

::testing::AssertionResult same_state(const StateDict& a, const StateDict& b) {
  if (a.tensors.size() != b.tensors.size())
    return ::testing::AssertionFailure()
           << a.tensors.size() << " vs " << b.tensors.size() << " state tensors";
  for (const auto& [key, t] : a.tensors) {
    if (!b.has_tensor(key)) return ::testing::AssertionFailure() << "missing " << key;
    const Tensor& u = b.tensor(key);
    if (t.shape() != u.shape() || t.dtype() != u.dtype())
      return ::testing::AssertionFailure() << key << ": " << t.str() << " vs " << u.str();
    if (bytes_of(t) != bytes_of(u)) return ::testing::AssertionFailure() << key << " differs";
  }
  if (a.numbers != b.numbers) return ::testing::AssertionFailure() << "numbers differ";
  if (a.strings != b.strings) return ::testing::AssertionFailure() << "strings differ";
  return ::testing::AssertionSuccess();
}

class OptimizerOffloadTest : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerOffloadTest, BitIdenticalToTheNormalOptimizerForFractionsOneAndHalf) {
  const Case c = GetParam();
  Trained ref = make(c, std::nullopt);
  train(ref, 0, 4);
  EXPECT_EQ(ref.opt->offloaded_numel(), 0);
  EXPECT_EQ(ref.opt->host_state_bytes(), 0);
  const int64_t owned = c.sharded ? 23 : 29;  // optimizer elements of this rank
  for (const auto& [fraction, overlap] :
       {std::pair{1.0, false}, std::pair{0.5, false}, std::pair{1.0, true}, std::pair{0.5, true}}) {
    SCOPED_TRACE("fraction " + std::to_string(fraction) + (overlap ? ", overlapped" : ""));
    Trained off = make(c, fraction, overlap);
    // Megatron's rule, in buffer order: whole pieces while fewer than fraction * owned are there.
    // Unsharded: output_layer.weight (10), final_layernorm (4), fc1.bias (3) = 17 >= 14.5.
    // Sharded [3,15) [16,30): pieces 8, 3 | 3, 9 -> 8, 11, 14 >= 11.5.
    const int64_t want = fraction == 1.0 ? owned : (c.sharded ? 14 : 17);
    EXPECT_EQ(off.opt->offloaded_numel(), want);
    EXPECT_GT(off.opt->host_state_bytes(), 0);
    EXPECT_LT(off.opt->state_bytes(), ref.opt->state_bytes());
    train(off, 0, 4);
    EXPECT_EQ(off.norms, ref.norms);
    EXPECT_EQ(bytes_of(off.model.buffer.params), bytes_of(ref.model.buffer.params));
    EXPECT_TRUE(same_state(off.opt->state_dict(), ref.opt->state_dict()));
    EXPECT_EQ(off.opt->num_steps(), ref.opt->num_steps());
    EXPECT_EQ(off.opt->params_norm(), ref.opt->params_norm());  // --log-params-norm
  }
}

TEST_P(OptimizerOffloadTest, CheckpointsMoveBetweenOffloadedAndNormalOptimizers) {
  const Case c = GetParam();
  Trained ref = make(c, std::nullopt);
  train(ref, 0, 2);
  Trained off = make(c, 0.5);
  train(off, 0, 2);
  // Normal -> offloaded and offloaded -> normal, each into a fresh model holding the weights.
  Trained a = make(c, 0.5), b = make(c, std::nullopt);
  a.model.buffer.params.copy_(ref.model.buffer.params);
  b.model.buffer.params.copy_(off.model.buffer.params);
  a.opt->load_state_dict(ref.opt->state_dict());
  b.opt->load_state_dict(off.opt->state_dict());
  for (Trained* t : {&ref, &off, &a, &b}) train(*t, 2, 2);
  for (Trained* t : {&off, &a, &b}) {
    EXPECT_EQ(bytes_of(t->model.buffer.params), bytes_of(ref.model.buffer.params));
    EXPECT_TRUE(same_state(t->opt->state_dict(), ref.opt->state_dict()));
    EXPECT_EQ(std::vector<double>(t->norms.end() - 2, t->norms.end()),
              std::vector<double>(ref.norms.end() - 2, ref.norms.end()));
  }
}

TEST_P(OptimizerOffloadTest, NonFiniteGradientNeverReachesTheHostState) {
  const Case c = GetParam();
  Trained off = make(c, 1.0);
  train(off, 0, 1);
  const auto before_params = bytes_of(off.model.buffer.params);
  const auto before_state = off.opt->state_dict();
  std::vector<std::vector<uint8_t>> state_bytes;
  for (const auto& [key, t] : before_state.tensors) state_bytes.push_back(bytes_of(t));
  auto g = make_grads(900);
  g[0][3] = std::numeric_limits<double>::quiet_NaN();
  set_grads(off.model, g);
  const auto r = off.opt->step(1e-2, 0.1);
  EXPECT_FALSE(r.success);
  EXPECT_TRUE(r.found_inf);
  EXPECT_EQ(bytes_of(off.model.buffer.params), before_params);
  std::size_t i = 0;
  for (const auto& [key, t] : off.opt->state_dict().tensors)
    EXPECT_EQ(bytes_of(t), state_bytes[i++]) << key;
  EXPECT_EQ(off.opt->num_steps(), 1);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, OptimizerOffloadTest,
    ::testing::Values(Case{DType::f32, false, "adam"}, Case{DType::f32, true, "adam"},
                      Case{DType::bf16, false, "adam"}, Case{DType::bf16, true, "adam"},
                      Case{DType::f16, true, "adam"}, Case{DType::f32, false, "sgd"},
                      Case{DType::bf16, true, "sgd"}),
    case_name);

TEST(OptimizerOffload, IdentityOnTheHostWithoutTheTestSwitch) {
  auto m = make_model(DType::bf16, DType::f32, Device::cpu());
  OptimizerConfig cfg;
  cfg.bf16 = true;
  cfg.params_dtype = DType::bf16;
  cfg.optimizer_cpu_offload = true;
  MegatronOptimizer opt(cfg, m.params, m.buffer, mg::test::ops_on("cpu"));
  EXPECT_EQ(opt.offloaded_numel(), 0);
  EXPECT_EQ(opt.host_state_bytes(), 0);
}

}  // namespace
