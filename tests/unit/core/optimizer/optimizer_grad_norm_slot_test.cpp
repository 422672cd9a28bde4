// The op table's grad_norm / clip_grad_norm slots are what MegatronOptimizer calls on every
// parallel layout (tensor, pipeline, expert parallel, the distributed optimizer's shards), so a
// platform's or plugin's override applies at scale: an override that records its calls wraps the
// generic implementation in a copy of the CPU op table. On each layout (the world group in one
// role) the recorded calls, the groups handed to the slot (ops::GradNormArgs) and the norm are
// checked against an f64 reference that counts every parameter once over the ranks: TP-replicated
// ones once, the pipeline's replica of the tied embedding not at all, experts on every rank,
// shards once. Also: the slot's result is what step() reports, and clipping scales every grad.
//
// Runs as a one-rank unit test and under mpirun (CTest label `mpi`, np 2 and 3): with one rank the
// groups are empty; with more, an optimizer that bypassed the slots leaves the record empty.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "tests/unit/core/optimizer/optimizer_test_util.h"

namespace mg::test::opt {
namespace {

using optimizer::GradStatsGroups;
using optimizer::MegatronOptimizer;
using optimizer::OptimizerConfig;
using optimizer::ShardOptions;

comm::Communicator& communicator() {
  static std::unique_ptr<comm::Communicator> c = [] {
    auto p = comm::init_communicator("");
    p->set_default_timeout(std::chrono::seconds(20));
    return p;
  }();
  return *c;
}

// What the overriding slots saw.
struct Record {
  int grad_norm_calls = 0, clip_calls = 0;
  std::size_t groups = 0, grads_for_norm = 0, expert_grads = 0;
  bool expert_group = false;
  double max_norm = 0.0;
};
Record g_record;
double g_factor = 1.0;  // the override's result = generic * g_factor
ops::OpFn<ops::OpId::grad_norm> g_generic_grad_norm = nullptr;
ops::OpFn<ops::OpId::clip_grad_norm> g_generic_clip = nullptr;

void record_args(std::span<const Tensor> grads_for_norm, const ops::GradNormArgs& args) {
  g_record.groups = args.groups.size();
  g_record.grads_for_norm = grads_for_norm.size();
  g_record.expert_grads = args.expert_grads.size();
  g_record.expert_group = args.expert_group != nullptr;
}

double recording_grad_norm(std::span<const Tensor> grads, const ops::GradNormArgs& args) {
  ++g_record.grad_norm_calls;
  record_args(grads, args);
  return g_generic_grad_norm(grads, args) * g_factor;
}

double recording_clip(std::span<Tensor> grads, std::span<const Tensor> grads_for_norm,
                      double max_norm, const ops::GradNormArgs& args) {
  ++g_record.clip_calls;
  record_args(grads_for_norm, args);
  g_record.max_norm = max_norm;
  return g_generic_clip(grads, grads_for_norm, max_norm, args);
}

// The CPU table with both slots overridden (as a plugin would).
const ops::OpTable& overriding_ops() {
  static const ops::OpTable table = [] {
    ops::OpTable t = ops_on("cpu");
    g_generic_grad_norm = t.grad_norm;
    g_generic_clip = t.clip_grad_norm;
    t.grad_norm = &recording_grad_norm;
    t.clip_grad_norm = &recording_clip;
    return t;
  }();
  return table;
}

enum class Layout { single, tp, pp, expert, shard };

struct Case {
  Layout layout;
  std::string name;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

// Per parameter of specs(): does its gradient differ over the ranks in this layout?
bool differs(Layout layout, std::size_t i) {
  switch (layout) {
    case Layout::tp:
      return i != 1;  // decoder.final_layernorm.weight is TP-replicated, the rest sharded
    case Layout::pp:
      return true;  // each stage holds other parameters
    case Layout::expert:
      return i == 3;  // the fc1 weight is a routed expert's
    case Layout::single:
    case Layout::shard:
      return false;  // one rank / data-parallel grads are all-reduced: equal everywhere
  }
  return false;
}

// Parameter 0 (output_layer.weight) on the last pipeline stage is the tied-embedding replica.
bool is_shared(Layout layout, int rank, int size) {
  return layout == Layout::pp && size > 1 && rank == size - 1;
}

// The gradients of every rank: rank r's value of a differing parameter comes from seed base + r.
std::vector<std::vector<double>> grads_on(Layout layout, int rank, uint64_t base) {
  auto g = make_grads(base);
  const auto mine = make_grads(base + 1000 * static_cast<uint64_t>(rank));
  for (std::size_t i = 0; i < g.size(); ++i)
    if (differs(layout, i)) g[i] = mine[i];
  return g;
}

// sqrt of the f64 sum of squares, every parameter once over the ranks.
double reference_norm(Layout layout, int size, uint64_t base) {
  double sq = 0.0;
  for (int r = 0; r < size; ++r) {
    const auto g = grads_on(layout, r, base);
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (!differs(layout, i) && r > 0) continue;  // equal on every rank: counted once
      if (i == 0 && is_shared(layout, r, size)) continue;
      for (double v : g[i]) sq += v * v;
    }
  }
  return std::sqrt(sq);
}

class GradNormSlotTest : public ::testing::TestWithParam<Case> {};

TEST_P(GradNormSlotTest, OptimizerCallsTheOverriddenSlotWithTheLayoutsGroups) {
  const Layout layout = GetParam().layout;
  comm::Communicator& c = communicator();
  const comm::ProcessGroupPtr world = c.world();
  const int rank = world->rank(), size = world->size();
  const bool parallel = size > 1 && layout != Layout::single;

  auto m = make_model(DType::f32, DType::f32, Device::cpu());
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    if (layout == Layout::tp && differs(layout, i)) m.params[i].tensor_parallel_dim = 0;
    if (layout == Layout::expert) m.params[i].is_expert = differs(layout, i);
  }
  m.params[0].shared = is_shared(layout, rank, size);
  GradStatsGroups groups;
  std::optional<ShardOptions> shard;
  if (layout == Layout::tp) groups.tp = world;
  if (layout == Layout::pp) groups.pp = world;
  if (layout == Layout::expert) groups.expert = world;
  if (layout == Layout::shard) {
    // Contiguous chunks of the flat buffer, one per rank (they cut through parameters).
    const int64_t total = m.buffer.grads.numel();
    const int64_t chunk = (total + size - 1) / size;
    shard.emplace();
    shard->ranges = {{std::min(total, rank * chunk), std::min(total, (rank + 1) * chunk)}};
    shard->group = world;
  }

  OptimizerConfig cfg;
  cfg.clip_grad = 0.0;
  MegatronOptimizer opt(cfg, m.params, m.buffer, overriding_ops(), {}, std::move(shard), groups);
  const std::size_t want_groups = parallel && layout != Layout::expert ? 1 : 0;

  // No clipping: grad_norm once per step, with the layout's groups.
  for (int step = 0; step < 2; ++step) {
    const uint64_t base = 100 + 10 * static_cast<uint64_t>(step);
    set_grads(m, grads_on(layout, rank, base));
    g_record = {};
    const auto r = opt.step(1e-3, 0.0);
    const double want = reference_norm(layout, size, base);
    EXPECT_TRUE(r.success);
    EXPECT_EQ(g_record.grad_norm_calls, 1) << "step " << step;
    EXPECT_EQ(g_record.clip_calls, 0);
    EXPECT_EQ(g_record.groups, want_groups);
    EXPECT_EQ(g_record.expert_group, parallel && layout == Layout::expert);
    EXPECT_EQ(g_record.expert_grads, parallel && layout == Layout::expert ? 1u : 0u);
    EXPECT_NEAR(r.grad_norm, want, 1e-12 * want) << "step " << step;
    opt.zero_grad();
  }

  // The slot's result is the step's grad norm.
  g_factor = 0.5;
  set_grads(m, grads_on(layout, rank, 300));
  const auto halved = opt.step(1e-3, 0.0);
  g_factor = 1.0;
  const double want_300 = reference_norm(layout, size, 300);
  EXPECT_NEAR(halved.grad_norm, 0.5 * want_300, 1e-12 * want_300);
  opt.zero_grad();
}

TEST_P(GradNormSlotTest, ClippingGoesThroughClipGradNormAndScalesEveryGrad) {
  const Layout layout = GetParam().layout;
  comm::Communicator& c = communicator();
  const comm::ProcessGroupPtr world = c.world();
  const int rank = world->rank(), size = world->size();
  if (layout == Layout::shard) GTEST_SKIP() << "the shard layout clips only its own pieces";

  auto m = make_model(DType::f32, DType::f32, Device::cpu());
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    if (layout == Layout::tp && differs(layout, i)) m.params[i].tensor_parallel_dim = 0;
    if (layout == Layout::expert) m.params[i].is_expert = differs(layout, i);
  }
  m.params[0].shared = is_shared(layout, rank, size);
  GradStatsGroups groups;
  if (layout == Layout::tp) groups.tp = world;
  if (layout == Layout::pp) groups.pp = world;
  if (layout == Layout::expert) groups.expert = world;

  const uint64_t base = 500;
  const double want = reference_norm(layout, size, base);
  OptimizerConfig cfg;
  cfg.clip_grad = want / 4.0;
  MegatronOptimizer opt(cfg, m.params, m.buffer, overriding_ops(), {}, {}, groups);
  const auto g = grads_on(layout, rank, base);
  set_grads(m, g);
  g_record = {};
  const auto r = opt.step(0.0, 0.0);
  EXPECT_EQ(g_record.clip_calls, 1);
  EXPECT_EQ(g_record.max_norm, cfg.clip_grad);
  EXPECT_NEAR(r.grad_norm, want, 1e-12 * want);
  const double coeff = cfg.clip_grad / (r.grad_norm + 1e-6);
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    std::vector<double> expected = g[i];
    for (double& v : expected) v *= coeff;
    EXPECT_TRUE(all_close(m.params[i].main_grad.to_vector<double>(), expected, {1e-6, 1e-7}))
        << m.params[i].name;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, GradNormSlotTest,
                         ::testing::Values(Case{Layout::single, "single"}, Case{Layout::tp, "tp"},
                                           Case{Layout::pp, "pp"}, Case{Layout::expert, "expert"},
                                           Case{Layout::shard, "shard"}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace mg::test::opt
