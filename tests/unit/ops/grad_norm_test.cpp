// Tests of the named functions grad_norm and clip_grad_norm (generic defaults in
// megatron/core/ops/generic.cpp, composed from l2_norm_sq and multi_tensor_scale), called through
// each platform's resolved op table, on gradients of mixed dtypes, with one-process GradNormArgs
// (the reductions over groups are tested by optimizer_grad_norm_slot_test under mpirun). References
// are naive f64 sums.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "tests/unit/test_util.h"

namespace {

using mg::DType;
using mg::Shape;
using mg::Tensor;
using mg::test::make_tensor;
using mg::test::random_values;
using mg::test::to_doubles;
using mg::test::Tol;
using mg::test::tolerance;

class GradNormTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  std::string platform() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }

  // Gradients of this dtype beside f32 / bf16 / f16 / f64 ones, odd sizes, one empty.
  struct Grads {
    std::vector<Tensor> ts;
    std::vector<std::vector<double>> rounded;
    std::vector<DType> dtypes;
    double norm = 0;  // naive sqrt(sum of squares) of the rounded values
  };
  Grads make_grads(uint64_t seed) const {
    const auto dev = mg::test::device_for(platform());
    Grads g;
    double sum_sq = 0;
    for (auto [shape, dt] : std::vector<std::pair<Shape, DType>>{{{7}, dtype()},
                                                                 {{13, 31}, dtype()},
                                                                 {{0}, dtype()},
                                                                 {{1}, DType::f32},
                                                                 {{17, 3}, DType::bf16},
                                                                 {{29}, DType::f16},
                                                                 {{5}, DType::f64}}) {
      auto t = make_tensor(random_values(mg::shape_numel(shape), ++seed, 0.1, 2.0), shape, dt, dev);
      for (double v : t.rounded) sum_sq += v * v;
      g.ts.push_back(t.t);
      g.rounded.push_back(t.rounded);
      g.dtypes.push_back(dt);
    }
    g.norm = std::sqrt(sum_sq);
    return g;
  }
  // One process: no groups; the gradients' device.
  mg::ops::GradNormArgs args() const {
    mg::ops::GradNormArgs a;
    a.device = mg::test::device_for(platform());
    return a;
  }
  // The CPU sums in f64 (l2_norm_sq's contract); other platforms may reduce in f32.
  Tol norm_tol() const { return platform() == "cpu" ? Tol{0.0, 1e-12} : tolerance(DType::f32); }
};

TEST_P(GradNormTest, GradNormIsSqrtOfSumOfSquares) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const Grads g = make_grads(1);
  const double norm = ops.grad_norm(g.ts, args());
  EXPECT_TRUE(mg::test::all_close({norm}, {g.norm}, norm_tol()));
  EXPECT_EQ(ops.grad_norm(std::vector<Tensor>{}, args()), 0.0);
  // Undefined tensors (parameters without a gradient) are skipped.
  std::vector<Tensor> with_undefined = g.ts;
  with_undefined.push_back(Tensor());
  EXPECT_EQ(ops.grad_norm(with_undefined, args()), norm);
  // Expert gradients without an expert group: their squares are added to the others'.
  const std::vector<Tensor> first(g.ts.begin(), g.ts.begin() + 3);
  const std::vector<Tensor> rest(g.ts.begin() + 3, g.ts.end());
  mg::ops::GradNormArgs split = args();
  split.expert_grads = rest;
  EXPECT_TRUE(mg::test::all_close({ops.grad_norm(first, split)}, {g.norm}, norm_tol()));
}

TEST_P(GradNormTest, ClipScalesWhenNormExceedsMaxNorm) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  Grads g = make_grads(2);
  const double max_norm = g.norm / 3.0;
  const double returned = ops.clip_grad_norm(g.ts, g.ts, max_norm, args());
  EXPECT_TRUE(mg::test::all_close({returned}, {g.norm}, norm_tol()));  // the pre-clip norm
  const double coeff = max_norm / (g.norm + 1e-6);  // Megatron's clip_grad_norm_fp32
  for (std::size_t i = 0; i < g.ts.size(); ++i) {
    std::vector<double> expected = g.rounded[i];
    for (auto& v : expected) v *= coeff;
    EXPECT_TRUE(mg::test::all_close(to_doubles(g.ts[i]), expected, tolerance(g.dtypes[i])))
        << "grad " << i << " (" << dtype_name(g.dtypes[i]) << ")";
  }
  EXPECT_NEAR(ops.grad_norm(g.ts, args()), max_norm, max_norm * 1e-2);  // bf16 rounding dominates
}

// The norm counts grads_for_norm only (another rank counts the rest); every grad is scaled.
TEST_P(GradNormTest, ClipCountsGradsForNormAndScalesAll) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  Grads g = make_grads(5);
  const std::vector<Tensor> counted(g.ts.begin(), g.ts.begin() + 2);
  double sum_sq = 0.0;
  for (std::size_t i = 0; i < 2; ++i)
    for (double v : g.rounded[i]) sum_sq += v * v;
  const double counted_norm = std::sqrt(sum_sq);
  const double max_norm = counted_norm / 2.0;
  const double returned = ops.clip_grad_norm(g.ts, counted, max_norm, args());
  EXPECT_TRUE(mg::test::all_close({returned}, {counted_norm}, norm_tol()));
  const double coeff = max_norm / (counted_norm + 1e-6);
  for (std::size_t i = 0; i < g.ts.size(); ++i) {
    std::vector<double> expected = g.rounded[i];
    for (auto& v : expected) v *= coeff;
    EXPECT_TRUE(mg::test::all_close(to_doubles(g.ts[i]), expected, tolerance(g.dtypes[i])))
        << "grad " << i << " (" << dtype_name(g.dtypes[i]) << ")";
  }
}

TEST_P(GradNormTest, ClipLeavesGradsAloneBelowMaxNorm) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  Grads g = make_grads(3);
  const double returned = ops.clip_grad_norm(g.ts, g.ts, 2.0 * g.norm, args());
  EXPECT_TRUE(mg::test::all_close({returned}, {g.norm}, norm_tol()));
  for (std::size_t i = 0; i < g.ts.size(); ++i)
    EXPECT_EQ(to_doubles(g.ts[i]), g.rounded[i]) << "grad " << i;  // untouched, bit for bit
}

TEST_P(GradNormTest, ClipRejectsNonPositiveMaxNorm) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  Grads g = make_grads(4);
  EXPECT_THROW(ops.clip_grad_norm(g.ts, g.ts, 0.0, args()), mg::Error);
  EXPECT_THROW(ops.clip_grad_norm(g.ts, g.ts, -1.0, args()), mg::Error);
  std::vector<Tensor> none;
  EXPECT_EQ(ops.clip_grad_norm(none, none, 1.0, args()), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Functions, GradNormTest,
                         ::testing::Combine(::testing::ValuesIn(mg::test::op_test_platforms()),
                                            ::testing::ValuesIn(mg::test::kKernelDTypes)),
                         [](const auto& info) {
                           return mg::test::param_name(std::get<0>(info.param),
                                                       std::get<1>(info.param));
                         });

}  // namespace
