// Conformance tests of GELU (erf and tanh forms), SwiGLU and squared ReLU, forward and backward,
// against naive f64 references on every platform and kernel dtype, plus f64 finite-difference
// checks of every backward and argument validation.
#include <cmath>
#include <functional>
#include <limits>
#include <tuple>

#include "tests/unit/test_util.h"

namespace mg {
namespace {

using ops::GeluApprox;
using test::all_close;
using test::make_tensor;
using test::random_values;
using test::to_doubles;
using test::tolerance;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr test::Tol kFdTol{1e-7, 1e-6};
constexpr double kPi = 3.14159265358979323846;

using Param = test::PlatformDType;

// Element-wise shapes: 1, primes, a 3-D [S, B, F], and one large enough for the threaded path.
const std::vector<Shape> kShapes = {{1}, {7}, {5, 13}, {3, 2, 31}, {40000}};

// The definitions (torch.nn.functional.gelu with approximate='none' / 'tanh').
double ref_gelu(double x, GeluApprox a) {
  if (a == GeluApprox::tanh)
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / kPi) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
// d/dx by the product and chain rules on the definitions above.
double ref_gelu_grad(double x, GeluApprox a) {
  if (a == GeluApprox::tanh) {
    const double u = std::sqrt(2 / kPi) * (x + 0.044715 * x * x * x);
    const double du = std::sqrt(2 / kPi) * (1 + 3 * 0.044715 * x * x);
    const double sech2 = 1 / (std::cosh(u) * std::cosh(u));
    return 0.5 * (1 + std::tanh(u)) + 0.5 * x * sech2 * du;
  }
  const double phi = std::exp(-x * x / 2) / std::sqrt(2 * kPi);
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * phi;
}
double ref_sigmoid(double x) {
  return 1 / (1 + std::exp(-x));
}

const char* approx_name(GeluApprox a) {
  return a == GeluApprox::tanh ? "tanh" : "none";
}

class ActivationTest : public ::testing::TestWithParam<Param> {
 protected:
  // Runs an element-wise forward (y = f(x)) and backward (dx = dy * f'(x)) against references.
  void check_elementwise(const std::string& what,
                         const std::function<void(Tensor&, const Tensor&)>& fwd,
                         const std::function<void(Tensor&, const Tensor&, const Tensor&)>& bwd,
                         const std::function<double(double)>& f,
                         const std::function<double(double)>& df, uint64_t seed) {
    const auto& [platform, dtype] = GetParam();
    const Device dev = test::device_for(platform);
    for (const Shape& shape : kShapes) {
      const int64_t n = shape_numel(shape);
      // |x| in [0.1, 4]: both tails and the curved middle.
      auto x = make_tensor(random_values(n, seed + n, 0.1, 4.0), shape, dtype, dev);
      auto dy = make_tensor(random_values(n, seed + n + 1), shape, dtype, dev);
      auto y = make_tensor(std::vector<double>(n, kNaN), shape, dtype, dev);
      auto dx = make_tensor(std::vector<double>(n, kNaN), shape, dtype, dev);
      fwd(y.t, x.t);
      bwd(dx.t, dy.t, x.t);
      std::vector<double> ey(n), edx(n);
      for (int64_t i = 0; i < n; ++i) {
        ey[i] = f(x.rounded[i]);
        edx[i] = dy.rounded[i] * df(x.rounded[i]);
      }
      EXPECT_TRUE(all_close(to_doubles(y.t), ey, tolerance(dtype)))
          << what << " fwd " << shape_str(shape);
      EXPECT_TRUE(all_close(to_doubles(dx.t), edx, tolerance(dtype)))
          << what << " bwd " << shape_str(shape);
    }
  }
};

TEST_P(ActivationTest, Gelu) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const auto& ops = test::ops_on(platform);
  for (GeluApprox a : {GeluApprox::none, GeluApprox::tanh}) {
    check_elementwise(
        std::string("gelu ") + approx_name(a),
        [&](Tensor& y, const Tensor& x) { ops.gelu_fwd(y, x, a); },
        [&](Tensor& dx, const Tensor& dy, const Tensor& x) { ops.gelu_bwd(dx, dy, x, a); },
        [a](double x) { return ref_gelu(x, a); }, [a](double x) { return ref_gelu_grad(x, a); },
        100 + static_cast<int>(a));
  }
}

TEST_P(ActivationTest, SquaredRelu) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const auto& ops = test::ops_on(platform);
  check_elementwise(
      "squared_relu", [&](Tensor& y, const Tensor& x) { ops.squared_relu_fwd(y, x); },
      [&](Tensor& dx, const Tensor& dy, const Tensor& x) { ops.squared_relu_bwd(dx, dy, x); },
      [](double x) { return x > 0 ? x * x : 0.0; }, [](double x) { return x > 0 ? 2 * x : 0.0; },
      200);
}

TEST_P(ActivationTest, Swiglu) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  // x [.., 2F] = [gate | up]; F % 8 == 0 also (CUDA's vector kernels for bf16 / f16)
  for (const Shape& half :
       std::vector<Shape>{{1, 1}, {5, 7}, {3, 2, 13}, {200, 101}, {4, 64}, {3, 2, 136}}) {
    const int64_t f = half.back(), rows = shape_numel(half) / f, n = rows * f;
    Shape full = half;
    full.back() = 2 * f;
    auto x = make_tensor(random_values(2 * n, 300 + f, 0.1, 4.0), full, dtype, dev);
    auto dy = make_tensor(random_values(n, 301 + f), half, dtype, dev);
    auto y = make_tensor(std::vector<double>(n, kNaN), half, dtype, dev);
    auto dx = make_tensor(std::vector<double>(2 * n, kNaN), full, dtype, dev);
    ops.swiglu_fwd(y.t, x.t);
    ops.swiglu_bwd(dx.t, dy.t, x.t);
    std::vector<double> ey(n), edx(2 * n);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < f; ++j) {
        const double a = x.rounded[r * 2 * f + j], u = x.rounded[r * 2 * f + f + j];
        const double d = dy.rounded[r * f + j];
        const double silu = a * ref_sigmoid(a);
        // d silu / da = sigmoid(a) + a * sigmoid(a) * (1 - sigmoid(a))
        const double dsilu = ref_sigmoid(a) + a * ref_sigmoid(a) * (1 - ref_sigmoid(a));
        ey[r * f + j] = silu * u;
        edx[r * 2 * f + j] = d * u * dsilu;
        edx[r * 2 * f + f + j] = d * silu;
      }
    EXPECT_TRUE(all_close(to_doubles(y.t), ey, tolerance(dtype))) << "fwd " << shape_str(full);
    EXPECT_TRUE(all_close(to_doubles(dx.t), edx, tolerance(dtype))) << "bwd " << shape_str(full);
  }
}

MG_INSTANTIATE_OP_TEST(ActivationTest);

// ---- f64 finite-difference checks (cpu) ---------------------------------------------------------

// For y = fwd(x) with x of `shape` and y of `out_shape`: loss = sum(y * w); dx from bwd(dy = w).
void check_fd(const Shape& shape, const Shape& out_shape,
              const std::function<void(Tensor&, const Tensor&)>& fwd,
              const std::function<void(Tensor&, const Tensor&, const Tensor&)>& bwd, uint64_t seed,
              const std::string& what) {
  const DType f64 = DType::f64;
  const auto x0 = random_values(shape_numel(shape), seed, 0.1, 3.0);
  const auto wv = random_values(shape_numel(out_shape), seed + 1);
  auto loss = [&](const std::vector<double>& xv) {
    Tensor y = Tensor::empty(out_shape, f64);
    fwd(y, Tensor::from_vector(xv, shape, f64));
    const auto v = to_doubles(y);
    double s = 0;
    for (std::size_t i = 0; i < v.size(); ++i) s += v[i] * wv[i];
    return s;
  };
  Tensor dx = Tensor::empty(shape, f64);
  bwd(dx, Tensor::from_vector(wv, out_shape, f64), Tensor::from_vector(x0, shape, f64));
  EXPECT_TRUE(all_close(to_doubles(dx), test::numerical_gradient(loss, x0), kFdTol)) << what;
}

TEST(ActivationGradient, EveryBackwardMatchesFiniteDifferences) {
  const auto& ops = test::ops_on("cpu");
  for (GeluApprox a : {GeluApprox::none, GeluApprox::tanh})
    check_fd(
        {4, 7}, {4, 7}, [&](Tensor& y, const Tensor& x) { ops.gelu_fwd(y, x, a); },
        [&](Tensor& dx, const Tensor& dy, const Tensor& x) { ops.gelu_bwd(dx, dy, x, a); }, 11,
        std::string("gelu ") + approx_name(a));
  check_fd(
      {4, 7}, {4, 7}, [&](Tensor& y, const Tensor& x) { ops.squared_relu_fwd(y, x); },
      [&](Tensor& dx, const Tensor& dy, const Tensor& x) { ops.squared_relu_bwd(dx, dy, x); }, 12,
      "squared_relu");
  check_fd(
      {3, 10}, {3, 5}, [&](Tensor& y, const Tensor& x) { ops.swiglu_fwd(y, x); },
      [&](Tensor& dx, const Tensor& dy, const Tensor& x) { ops.swiglu_bwd(dx, dy, x); }, 13,
      "swiglu");
}

// ---- validation (cpu kernels)
// ---------------------------------------------------------------------

TEST(ActivationValidation, RejectsMismatchedArguments) {
  const auto& ops = test::ops_on("cpu");
  const DType f32 = DType::f32;
  Tensor x = Tensor::zeros({4, 6}, f32);
  Tensor y_small = Tensor::zeros({4, 5}, f32);
  EXPECT_THROW(ops.gelu_fwd(y_small, x, GeluApprox::none), Error);
  Tensor y_bf16 = Tensor::zeros({4, 6}, DType::bf16);
  EXPECT_THROW(ops.squared_relu_fwd(y_bf16, x), Error);
  Tensor dx = Tensor::zeros({4, 6}, f32);
  EXPECT_THROW(ops.gelu_bwd(dx, y_small, x, GeluApprox::tanh), Error);
  Tensor half = Tensor::zeros({4, 3}, f32);
  Tensor odd = Tensor::zeros({4, 5}, f32);
  Tensor half_odd = Tensor::zeros({4, 2}, f32);
  EXPECT_THROW(ops.swiglu_fwd(half_odd, odd), Error);  // odd last dim
  EXPECT_THROW(ops.swiglu_fwd(x, x), Error);           // y not halved
  Tensor dx_bad = Tensor::zeros({4, 3}, f32);
  EXPECT_THROW(ops.swiglu_bwd(dx_bad, half, x), Error);  // dx must have x's shape
  Tensor xi = Tensor::zeros({4, 6}, DType::i32);
  Tensor yi = Tensor::zeros({4, 6}, DType::i32);
  EXPECT_THROW(ops.gelu_fwd(yi, xi, GeluApprox::none), Error);
}

}  // namespace
}  // namespace mg
