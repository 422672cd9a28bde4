// Conformance of softmax_fwd / softmax_bwd (softmax over the last dim of scale * x) against a naive
// f64 reference, on every test platform and kernel dtype, plus a finite-difference check of the
// backward in f64 on the cpu platform. The reference is plain loops, independent of the kernel.
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "tests/unit/test_util.h"

namespace mg {
namespace {

using test::make_tensor;
using test::to_doubles;

// y[r, j] = exp(scale x[r, j] - m) / sum_k exp(scale x[r, k] - m); an all -inf row gives 0.
std::vector<double> ref_softmax(const std::vector<double>& x, int64_t f, double scale) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r < x.size() / f; ++r) {
    double m = -INFINITY;
    for (int64_t j = 0; j < f; ++j) m = std::max(m, scale * x[r * f + j]);
    if (m == -INFINITY) continue;
    double sum = 0;
    for (int64_t j = 0; j < f; ++j) sum += std::exp(scale * x[r * f + j] - m);
    for (int64_t j = 0; j < f; ++j) y[r * f + j] = std::exp(scale * x[r * f + j] - m) / sum;
  }
  return y;
}

// dx[r, j] = scale * y[r, j] * (dy[r, j] - sum_k dy[r, k] y[r, k]).
std::vector<double> ref_softmax_bwd(const std::vector<double>& dy, const std::vector<double>& y,
                                    int64_t f, double scale) {
  std::vector<double> dx(y.size());
  for (std::size_t r = 0; r < y.size() / f; ++r) {
    double dot = 0;
    for (int64_t j = 0; j < f; ++j) dot += dy[r * f + j] * y[r * f + j];
    for (int64_t j = 0; j < f; ++j) dx[r * f + j] = scale * y[r * f + j] * (dy[r * f + j] - dot);
  }
  return dx;
}

class SoftmaxOp : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  const std::string& platform() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
};

struct Case {
  Shape shape;
  float scale;
};
const Case kCases[] = {{{1, 1}, 1.0f},      {{7, 13}, 1.0f},  {{3, 5, 31}, 0.7f},
                       {{2, 1, 130}, 2.5f}, {{13, 8}, -1.3f}, {{5}, 0.125f}};

TEST_P(SoftmaxOp, ForwardMatchesReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    const int64_t n = shape_numel(c.shape);
    auto x = make_tensor(test::random_values(n, seed++, 0.1, 3.0), c.shape, dtype(), dev);
    Tensor y = Tensor::empty(c.shape, dtype(), dev);
    ops.softmax_fwd(y, x.t, c.scale);
    EXPECT_TRUE(test::all_close(to_doubles(y), ref_softmax(x.rounded, c.shape.back(), c.scale),
                                test::tolerance(dtype())))
        << "shape " << shape_str(c.shape) << " scale " << c.scale;
  }
}

TEST_P(SoftmaxOp, BackwardMatchesReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  uint64_t seed = 100;
  for (const Case& c : kCases) {
    const int64_t n = shape_numel(c.shape), f = c.shape.back();
    const auto x = test::random_values(n, seed++, 0.1, 2.0);
    // y as the forward would give it, rounded to dtype: the reference then uses the same y.
    auto y = make_tensor(ref_softmax(x, f, c.scale), c.shape, dtype(), dev);
    auto dy = make_tensor(test::random_values(n, seed++), c.shape, dtype(), dev);
    Tensor dx = Tensor::empty(c.shape, dtype(), dev);
    ops.softmax_bwd(dx, dy.t, y.t, c.scale);
    EXPECT_TRUE(test::all_close(to_doubles(dx), ref_softmax_bwd(dy.rounded, y.rounded, f, c.scale),
                                test::tolerance(dtype())))
        << "shape " << shape_str(c.shape) << " scale " << c.scale;
  }
}

TEST_P(SoftmaxOp, InPlaceEqualsOutOfPlace) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  const Shape shape{5, 17};
  auto x = make_tensor(test::random_values(85, 7, 0.1, 2.0), shape, dtype(), dev);
  Tensor y = Tensor::empty(shape, dtype(), dev);
  ops.softmax_fwd(y, x.t, 0.9f);
  Tensor xy = x.t.clone();
  ops.softmax_fwd(xy, xy, 0.9f);
  EXPECT_EQ(to_doubles(xy), to_doubles(y));

  auto dy = make_tensor(test::random_values(85, 8), shape, dtype(), dev);
  Tensor dx = Tensor::empty(shape, dtype(), dev);
  ops.softmax_bwd(dx, dy.t, y, 0.9f);
  Tensor dydx = dy.t.clone();
  ops.softmax_bwd(dydx, dydx, y, 0.9f);
  EXPECT_EQ(to_doubles(dydx), to_doubles(dx));
}

TEST_P(SoftmaxOp, MaskedEntriesGetZeroAndFullyMaskedRowsAreZeroNotNaN) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v = test::random_values(3 * 7, 9);
  for (int j = 0; j < 7; ++j) v[7 + j] = -inf;  // row 1 fully masked
  v[2] = -inf;                                  // row 0 partially masked
  v[14 + 6] = -inf;
  auto x = make_tensor(v, {3, 7}, dtype(), dev);
  Tensor y = Tensor::empty({3, 7}, dtype(), dev);
  ops.softmax_fwd(y, x.t, 1.0f);
  const auto got = to_doubles(y);
  for (double g : got) EXPECT_FALSE(std::isnan(g));
  EXPECT_TRUE(test::all_close(got, ref_softmax(x.rounded, 7, 1.0), test::tolerance(dtype())));
  EXPECT_EQ(got[2], 0.0);
  for (int j = 0; j < 7; ++j) EXPECT_EQ(got[7 + j], 0.0);
}

TEST_P(SoftmaxOp, RejectsMismatchedArguments) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = test::ops_on(platform());
  const Device dev = test::device_for(platform());
  Tensor x = Tensor::zeros({4, 6}, dtype(), dev);
  Tensor bad_shape = Tensor::empty({4, 5}, dtype(), dev);
  EXPECT_THROW(ops.softmax_fwd(bad_shape, x, 1.0f), Error);
  const DType other = dtype() == DType::f32 ? DType::f64 : DType::f32;
  Tensor bad_dtype = Tensor::empty({4, 6}, other, dev);
  EXPECT_THROW(ops.softmax_fwd(bad_dtype, x, 1.0f), Error);
  Tensor dx = Tensor::empty({4, 6}, dtype(), dev);
  EXPECT_THROW(ops.softmax_bwd(dx, bad_shape, x, 1.0f), Error);
  Tensor xi = Tensor::zeros({4, 6}, DType::i32, dev);
  Tensor yi = Tensor::empty({4, 6}, DType::i32, dev);
  EXPECT_THROW(ops.softmax_fwd(yi, xi, 1.0f), Error);
}

MG_INSTANTIATE_OP_TEST(SoftmaxOp);

// d/dx sum(softmax(scale x) * w) by central differences equals softmax_bwd(dy = w).
TEST(SoftmaxGradient, FiniteDifferencesF64) {
  const auto& ops = test::ops_on("cpu");
  const Shape shape{3, 11};
  const float scale = 0.8f;
  const auto x0 = test::random_values(33, 21, 0.1, 2.0);
  const auto w = test::random_values(33, 22);
  auto run = [&](const std::vector<double>& xv) {
    Tensor x = Tensor::from_vector(xv, shape, DType::f64);
    Tensor y = Tensor::empty(shape, DType::f64);
    ops.softmax_fwd(y, x, scale);
    const auto yv = y.to_vector<double>();
    double l = 0;
    for (std::size_t i = 0; i < yv.size(); ++i) l += yv[i] * w[i];
    return l;
  };
  Tensor x = Tensor::from_vector(x0, shape, DType::f64);
  Tensor y = Tensor::empty(shape, DType::f64);
  ops.softmax_fwd(y, x, scale);
  Tensor dy = Tensor::from_vector(w, shape, DType::f64);
  Tensor dx = Tensor::empty(shape, DType::f64);
  ops.softmax_bwd(dx, dy, y, scale);
  EXPECT_TRUE(
      test::all_close(dx.to_vector<double>(), test::numerical_gradient(run, x0), {1e-8, 1e-6}));
}

}  // namespace
}  // namespace mg
