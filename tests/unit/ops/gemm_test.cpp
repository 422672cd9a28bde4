// Conformance tests of gemm, bias_add, bias_grad, axpy and fill against naive f64 references, on
// every platform and kernel dtype, plus f64 finite-difference checks of the backward rules and the
// argument validation of the CPU kernels.
#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <tuple>

#include "tests/unit/test_util.h"

namespace mg {
namespace {

using ops::GemmArgs;
using test::all_close;
using test::make_tensor;
using test::random_values;
using test::to_doubles;
using test::tolerance;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Central differences with h = 1e-6 on O(1) values: truncation ~1e-12, rounding ~1e-10.
constexpr test::Tol kFdTol{1e-7, 1e-6};

using Param = test::PlatformDType;

// Naive reference: C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C0[b] (C0 ignored when beta == 0).
std::vector<double> ref_gemm(const std::vector<double>& a, const std::vector<double>& b,
                             const std::vector<double>& c0, int64_t batch, int64_t m, int64_t n,
                             int64_t k, const GemmArgs& g) {
  std::vector<double> c(static_cast<std::size_t>(batch * m * n));
  for (int64_t bi = 0; bi < batch; ++bi)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double av = g.trans_a ? a[bi * m * k + p * m + i] : a[bi * m * k + i * k + p];
          const double bv = g.trans_b ? b[bi * k * n + j * k + p] : b[bi * k * n + p * n + j];
          s += av * bv;
        }
        const int64_t o = bi * m * n + i * n + j;
        c[o] = g.alpha * s + (g.beta != 0 ? g.beta * c0[o] : 0.0);
      }
  return c;
}

class GemmTest : public ::testing::TestWithParam<Param> {
 protected:
  // Runs C = alpha op(A) op(B) + beta C with A, B in the parameter dtype and C in c_dtype, C
  // starting from c0 (NaN allowed), and compares with the reference.
  void check(int64_t batch, int64_t m, int64_t n, int64_t k, const GemmArgs& g, DType c_dtype,
             const std::vector<double>& c0_values, uint64_t seed) {
    const auto& [platform, dtype] = GetParam();
    const Device dev = test::device_for(platform);
    const auto& ops = test::ops_on(platform);
    auto shape = [&](int64_t r, int64_t c) { return batch > 0 ? Shape{batch, r, c} : Shape{r, c}; };
    const int64_t nb = batch > 0 ? batch : 1;
    auto a = make_tensor(random_values(nb * m * k, seed), g.trans_a ? shape(k, m) : shape(m, k),
                         dtype, dev);
    auto b = make_tensor(random_values(nb * k * n, seed + 1), g.trans_b ? shape(n, k) : shape(k, n),
                         dtype, dev);
    auto c = make_tensor(c0_values, shape(m, n), c_dtype, dev);
    ops.gemm(c.t, a.t, b.t, g);
    const auto expect = ref_gemm(a.rounded, b.rounded, c.rounded, nb, m, n, k, g);
    EXPECT_TRUE(all_close(to_doubles(c.t), expect, tolerance(c_dtype)))
        << "batch " << batch << " m " << m << " n " << n << " k " << k << " trans_a " << g.trans_a
        << " trans_b " << g.trans_b << " alpha " << g.alpha << " beta " << g.beta << " C "
        << dtype_name(c_dtype);
  }
};

TEST_P(GemmTest, EveryTransposeCombination) {
  MG_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  const DType dtype = std::get<1>(GetParam());
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      GemmArgs g;
      g.trans_a = ta;
      g.trans_b = tb;
      g.alpha = 0.75f;
      g.beta = 0.5f;
      check(0, 7, 13, 31, g, dtype, random_values(7 * 13, 7), 11);
    }
}

TEST_P(GemmTest, BatchedEveryTransposeCombination) {
  MG_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  const DType dtype = std::get<1>(GetParam());
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      GemmArgs g;
      g.trans_a = ta;
      g.trans_b = tb;
      check(3, 5, 11, 17, g, dtype, std::vector<double>(3 * 5 * 11, kNaN), 21);
    }
}

// Large enough (>= 2^20 multiply-adds) for the CPU kernel to split one product over threads:
// along M when M >= N, along N otherwise; and batches of >= one product per thread.
TEST_P(GemmTest, ThreadSplitShapes) {
  MG_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  const DType dtype = std::get<1>(GetParam());
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      GemmArgs g;
      g.trans_a = ta;
      g.trans_b = tb;
      g.beta = ta ? 1.0f : 0.0f;
      check(0, 131, 97, 89, g, dtype, random_values(131 * 97, 81), 82);   // split M
      check(0, 67, 181, 101, g, dtype, random_values(67 * 181, 83), 84);  // split N
    }
  const int64_t batch = std::max<int64_t>(2, std::thread::hardware_concurrency());
  GemmArgs g;
  g.trans_b = true;
  check(batch, 64, 65, 66, g, dtype, std::vector<double>(batch * 64 * 65, kNaN), 85);
}

TEST_P(GemmTest, BetaZeroIgnoresNaNInC) {
  MG_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  const DType dtype = std::get<1>(GetParam());
  // Sizes on both sides of BLAS small-matrix paths.
  for (int64_t s : {1, 2, 7, 33, 70}) {
    GemmArgs g;
    g.alpha = 1.25f;
    check(0, s, s + 1, s + 2, g, dtype, std::vector<double>(s * (s + 1), kNaN), 31 + s);
    check(0, s, s + 1, s + 2, g, DType::f32, std::vector<double>(s * (s + 1), kNaN), 41 + s);
  }
}

TEST_P(GemmTest, BetaOneAccumulates) {
  MG_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  const DType dtype = std::get<1>(GetParam());
  GemmArgs g;
  g.trans_a = true;  // the weight-gradient form dW += X^T dY
  g.beta = 1.0f;
  check(0, 13, 7, 29, g, dtype, random_values(13 * 7, 51), 52);
  check(2, 13, 7, 29, g, dtype, random_values(2 * 13 * 7, 53), 54);
}

TEST_P(GemmTest, NarrowInputsIntoF32C) {
  MG_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  GemmArgs g;
  check(0, 9, 15, 37, g, DType::f32, std::vector<double>(9 * 15, kNaN), 61);
  g.trans_b = true;
  g.beta = 1.0f;  // bf16 grads accumulated into an f32 main_grad
  check(0, 9, 15, 37, g, DType::f32, random_values(9 * 15, 62), 63);
  check(4, 3, 5, 8, g, DType::f32, random_values(4 * 3 * 5, 64), 65);
}

TEST_P(GemmTest, DegenerateSizes) {
  MG_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  const DType dtype = std::get<1>(GetParam());
  GemmArgs g;
  check(0, 1, 1, 1, g, dtype, {kNaN}, 71);
  check(0, 1, 19, 3, g, dtype, std::vector<double>(19, kNaN), 72);
  check(0, 5, 3, 0, g, dtype, std::vector<double>(15, kNaN), 73);  // K = 0, beta = 0: zeros
  g.beta = 1.0f;
  check(0, 5, 3, 0, g, dtype, random_values(15, 74), 75);  // K = 0, beta = 1: C unchanged
  g.alpha = 0.0f;
  g.beta = -2.0f;
  check(0, 4, 6, 3, g, dtype, random_values(24, 76), 77);
}

MG_INSTANTIATE_OP_TEST(GemmTest);

// ---- bias_add, bias_grad, axpy, fill ------------------------------------------------------------

class ElementwiseLinalgTest : public ::testing::TestWithParam<Param> {};

TEST_P(ElementwiseLinalgTest, BiasAdd) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  for (auto [rows, f] : {std::pair<int64_t, int64_t>{13, 7}, {5, 1}, {1, 31}, {300, 129}}) {
    for (DType bias_dtype : {dtype, DType::f32}) {
      auto y = make_tensor(random_values(rows * f, 100 + f), {rows, f}, dtype, dev);
      auto bias = make_tensor(random_values(f, 200 + f), {f}, bias_dtype, dev);
      ops.bias_add(y.t, bias.t);
      std::vector<double> expect(y.rounded);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < f; ++j) expect[r * f + j] += bias.rounded[j];
      EXPECT_TRUE(all_close(to_doubles(y.t), expect, tolerance(dtype)))
          << rows << "x" << f << " bias " << dtype_name(bias_dtype);
    }
  }
}

TEST_P(ElementwiseLinalgTest, BiasGradAccumulates) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  // 1000 rows cross several reduction chunks; dy [S, B, F] checks the flattening.
  for (auto [rows, f] : {std::pair<int64_t, int64_t>{13, 7}, {1, 1}, {1000, 3}, {31, 130}}) {
    for (DType db_dtype : {dtype, DType::f32}) {
      auto dy = make_tensor(random_values(rows * f, 300 + rows), {rows, 1, f}, dtype, dev);
      auto dbias = make_tensor(random_values(f, 400 + f), {f}, db_dtype, dev);
      ops.bias_grad(dbias.t, dy.t);
      std::vector<double> expect(dbias.rounded);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < f; ++j) expect[j] += dy.rounded[r * f + j];
      EXPECT_TRUE(all_close(to_doubles(dbias.t), expect, tolerance(db_dtype)))
          << rows << "x" << f << " dbias " << dtype_name(db_dtype);
    }
  }
}

TEST_P(ElementwiseLinalgTest, AxpyMixedDtypes) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  for (int64_t n : {1, 13, 40000}) {  // 40000 takes the threaded path
    // y in dtype += x in dtype, and an f32 y (main_grad) += x in dtype
    for (DType y_dtype : {dtype, DType::f32}) {
      auto y = make_tensor(random_values(n, 500 + n), {n}, y_dtype, dev);
      auto x = make_tensor(random_values(n, 600 + n), {n}, dtype, dev);
      const float alpha = -0.375f;
      ops.axpy(y.t, x.t, alpha);
      std::vector<double> expect(y.rounded);
      for (int64_t i = 0; i < n; ++i) expect[i] += alpha * x.rounded[i];
      EXPECT_TRUE(all_close(to_doubles(y.t), expect, tolerance(y_dtype)))
          << "n " << n << " y " << dtype_name(y_dtype);
    }
  }
}

TEST_P(ElementwiseLinalgTest, Fill) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  for (double v : {1.0 / 3.0, -2.5, 0.0}) {
    auto x = make_tensor(random_values(37, 700), {37}, dtype, dev);
    ops.fill(x.t, v);
    const double expect = make_tensor({v}, {1}, dtype, Device::cpu()).rounded[0];
    EXPECT_TRUE(all_close(to_doubles(x.t), std::vector<double>(37, expect), {0, 0})) << v;
  }
}

MG_INSTANTIATE_OP_TEST(ElementwiseLinalgTest);

class FillOtherDtypesTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FillOtherDtypesTest, IntegersAndBytes) {
  const std::string& platform = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  for (DType dtype : {DType::i32, DType::i64, DType::u8}) {
    Tensor x = Tensor::zeros({5, 3}, dtype, dev);
    ops.fill(x, 7.0);
    EXPECT_EQ(to_doubles(x), std::vector<double>(15, 7.0)) << dtype_name(dtype);
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, FillOtherDtypesTest, ::testing::ValuesIn(test::op_test_platforms()),
                         [](const auto& info) { return info.param; });

// ---- f64 finite-difference checks of the backward rules (cpu) -----------------------------------

TEST(GemmGradient, BackwardGemmsMatchFiniteDifferences) {
  const auto& ops = test::ops_on("cpu");
  const int64_t m = 5, k = 7, n = 3;
  // Forward Y [M, N] = X [M, K] @ W^T (W [N, K], Megatron's Linear); loss = sum(Y * G).
  const auto x0 = random_values(m * k, 801), w0 = random_values(n * k, 802);
  const auto gv = random_values(m * n, 803);
  auto forward = [&](const std::vector<double>& xv, const std::vector<double>& wv) {
    Tensor x = Tensor::from_vector(xv, {m, k}, DType::f64);
    Tensor w = Tensor::from_vector(wv, {n, k}, DType::f64);
    Tensor y = Tensor::empty({m, n}, DType::f64);
    GemmArgs g;
    g.trans_b = true;
    ops.gemm(y, x, w, g);
    double loss = 0;
    const auto yv = to_doubles(y);
    for (std::size_t i = 0; i < yv.size(); ++i) loss += yv[i] * gv[i];
    return loss;
  };
  Tensor dy = Tensor::from_vector(gv, {m, n}, DType::f64);
  Tensor x = Tensor::from_vector(x0, {m, k}, DType::f64);
  Tensor w = Tensor::from_vector(w0, {n, k}, DType::f64);
  // dX = dY @ W (written), dW += dY^T @ X (accumulated onto a random start).
  Tensor dx = Tensor::from_vector(std::vector<double>(m * k, kNaN), {m, k}, DType::f64);
  ops.gemm(dx, dy, w, GemmArgs{});
  const auto dw0 = random_values(n * k, 804);
  Tensor dw = Tensor::from_vector(dw0, {n, k}, DType::f64);
  GemmArgs gw;
  gw.trans_a = true;
  gw.beta = 1.0f;
  ops.gemm(dw, dy, x, gw);
  const auto num_dx =
      test::numerical_gradient([&](const std::vector<double>& v) { return forward(v, w0); }, x0);
  auto num_dw =
      test::numerical_gradient([&](const std::vector<double>& v) { return forward(x0, v); }, w0);
  for (std::size_t i = 0; i < num_dw.size(); ++i) num_dw[i] += dw0[i];
  EXPECT_TRUE(all_close(to_doubles(dx), num_dx, kFdTol));
  EXPECT_TRUE(all_close(to_doubles(dw), num_dw, kFdTol));
}

TEST(GemmGradient, BiasAndAxpyBackwardMatchFiniteDifferences) {
  const auto& ops = test::ops_on("cpu");
  const int64_t rows = 6, f = 5;
  const auto y0 = random_values(rows * f, 811), b0 = random_values(f, 812);
  const auto gv = random_values(rows * f, 813);
  const float alpha = 0.625f;
  // loss = sum((y + bias + alpha * x) * G) over bias [F] and x [N, F]
  auto loss_of = [&](const std::vector<double>& bv, const std::vector<double>& xv) {
    Tensor y = Tensor::from_vector(y0, {rows, f}, DType::f64);
    ops.bias_add(y, Tensor::from_vector(bv, {f}, DType::f64));
    ops.axpy(y, Tensor::from_vector(xv, {rows, f}, DType::f64), alpha);
    const auto v = to_doubles(y);
    double loss = 0;
    for (std::size_t i = 0; i < v.size(); ++i) loss += v[i] * gv[i];
    return loss;
  };
  const auto x0 = random_values(rows * f, 814);
  Tensor dy = Tensor::from_vector(gv, {rows, f}, DType::f64);
  Tensor dbias = Tensor::zeros({f}, DType::f64);
  ops.bias_grad(dbias, dy);
  Tensor dx = Tensor::zeros({rows, f}, DType::f64);
  ops.axpy(dx, dy, alpha);  // d/dx of alpha * x is alpha * dy
  EXPECT_TRUE(all_close(
      to_doubles(dbias),
      test::numerical_gradient([&](const std::vector<double>& v) { return loss_of(v, x0); }, b0),
      kFdTol));
  EXPECT_TRUE(all_close(
      to_doubles(dx),
      test::numerical_gradient([&](const std::vector<double>& v) { return loss_of(b0, v); }, x0),
      kFdTol));
}

// ---- validation (cpu kernels)
// ---------------------------------------------------------------------

TEST(GemmValidation, RejectsBadShapesAndDtypes) {
  const auto& ops = test::ops_on("cpu");
  auto t = [](Shape s, DType d = DType::f32) { return Tensor::zeros(s, d); };
  Tensor c = t({3, 5});
  EXPECT_THROW(ops.gemm(c, t({3, 4}), t({6, 5}), GemmArgs{}), Error);               // inner dims
  EXPECT_THROW(ops.gemm(c, t({3, 4}), t({4, 5}, DType::bf16), GemmArgs{}), Error);  // A/B dtype
  Tensor c_bf16 = t({3, 5}, DType::bf16);
  EXPECT_THROW(ops.gemm(c_bf16, t({3, 4}), t({4, 5}), GemmArgs{}), Error);  // C bf16, A f32
  Tensor c_bad = t({5, 3});
  EXPECT_THROW(ops.gemm(c_bad, t({3, 4}), t({4, 5}), GemmArgs{}), Error);  // C shape
  EXPECT_THROW(ops.gemm(c, t({2, 3, 4}), t({4, 5}), GemmArgs{}), Error);   // ranks
  Tensor c3 = t({2, 3, 5});
  EXPECT_THROW(ops.gemm(c3, t({2, 3, 4}), t({3, 4, 5}), GemmArgs{}), Error);  // batch
  EXPECT_THROW(ops.gemm(c, t({3, 4}, DType::i32), t({4, 5}, DType::i32), GemmArgs{}), Error);
  Tensor ab = t({3, 5});
  EXPECT_THROW(ops.gemm(ab, ab, t({5, 5}), GemmArgs{}), Error);  // C aliases A
  try {
    ops.gemm(c, t({3, 4}), t({6, 5}), GemmArgs{});
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("[6, 5]"), std::string::npos) << e.message();
  }
  Tensor y = t({4, 7});
  EXPECT_THROW(ops.bias_add(y, t({6})), Error);
  Tensor db = t({6});
  EXPECT_THROW(ops.bias_grad(db, t({4, 7})), Error);
  EXPECT_THROW(ops.axpy(y, t({27}), 1.0f), Error);
}

}  // namespace
}  // namespace mg
