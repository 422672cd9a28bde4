// Conformance tests of dropout_fwd/bwd and bias_dropout_add_fwd/bwd on every platform and kernel
// dtype, against naive f64 references built from the mask contract (DropoutArgs: element i keeps
// iff mg::random::dropout_keep(seed, offset + i, p), kept values scaled by 1/(1-p)). Also: the
// mask is the same in forward and backward, reproducible from (seed, offset), sliceable by offset,
// keeps ~1-p; finite-difference gradients in f64 on the cpu platform.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "megatron/core/random/philox.h"
#include "tests/unit/test_util.h"

namespace {

using mg::DType;
using mg::Shape;
using mg::Tensor;
using mg::ops::DropoutArgs;
using mg::test::make_tensor;
using mg::test::random_values;
using mg::test::to_doubles;
using mg::test::Tol;
using mg::test::tolerance;

// ---- naive references
// ----------------------------------------------------------------------------

bool ref_keep(const DropoutArgs& a, std::size_t i) {
  return mg::random::dropout_keep(a.seed, a.offset + i, a.p);
}

std::vector<double> ref_dropout(const std::vector<double>& x, const DropoutArgs& a) {
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    y[i] = ref_keep(a, i) ? x[i] / (1.0 - double(a.p)) : 0.0;
  return y;
}

// y[n, f] = residual[n, f] + dropout(x[n, f] + bias[f]); bias may be empty.
std::vector<double> ref_bias_dropout_add(const std::vector<double>& x,
                                         const std::vector<double>& bias,
                                         const std::vector<double>& residual, int64_t f,
                                         const DropoutArgs& a) {
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i] + (bias.empty() ? 0.0 : bias[i % f]);
    y[i] = residual[i] + (ref_keep(a, i) ? v / (1.0 - double(a.p)) : 0.0);
  }
  return y;
}

// dbias[f] = sum_n mask * dy[n, f] / (1 - p)
std::vector<double> ref_dbias(const std::vector<double>& dy, int64_t f, const DropoutArgs& a) {
  std::vector<double> db(static_cast<std::size_t>(f), 0.0);
  for (std::size_t i = 0; i < dy.size(); ++i)
    if (ref_keep(a, i)) db[i % f] += dy[i] / (1.0 - double(a.p));
  return db;
}

int64_t last_dim(const Shape& s) {
  return s.back();
}

// ---- parameterised conformance
// -------------------------------------------------------------------

class DropoutTest : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  std::string platform() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
};

// Odd shapes: a single element, primes, rows not a multiple of 4 (Philox block width).
const std::vector<Shape> kShapes = {{1}, {7}, {13, 31}, {3, 5, 17}};

TEST_P(DropoutTest, ForwardMatchesReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  uint64_t seed = 1;
  for (const Shape& shape : kShapes)
    for (float p : {0.1f, 0.5f, 0.85f})
      for (uint64_t offset : {0ull, 3ull, (1ull << 33) + 1}) {
        const auto n = static_cast<std::size_t>(mg::shape_numel(shape));
        auto x = make_tensor(random_values(n, ++seed), shape, dtype(), dev);
        const DropoutArgs args{p, 1234 + seed, offset};
        Tensor y = Tensor::empty(shape, dtype(), dev);
        ops.dropout_fwd(y, x.t, args);
        const auto got = to_doubles(y);
        const auto expected = ref_dropout(x.rounded, args);
        EXPECT_TRUE(mg::test::all_close(got, expected, tolerance(dtype())))
            << mg::shape_str(shape) << " p " << p << " offset " << offset;
        for (std::size_t i = 0; i < n; ++i)  // the mask itself is exact
          ASSERT_EQ(got[i] != 0.0, expected[i] != 0.0) << "element " << i;
      }
}

TEST_P(DropoutTest, BackwardMatchesReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  uint64_t seed = 100;
  for (const Shape& shape : kShapes)
    for (float p : {0.2f, 0.6f}) {
      const auto n = static_cast<std::size_t>(mg::shape_numel(shape));
      auto dy = make_tensor(random_values(n, ++seed), shape, dtype(), dev);
      const DropoutArgs args{p, seed, 5};
      Tensor dx = Tensor::empty(shape, dtype(), dev);
      ops.dropout_bwd(dx, dy.t, args);
      EXPECT_TRUE(
          mg::test::all_close(to_doubles(dx), ref_dropout(dy.rounded, args), tolerance(dtype())))
          << mg::shape_str(shape) << " p " << p;
    }
}

TEST_P(DropoutTest, MaskSameInForwardAndBackward) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  const Shape shape{37, 29};
  const auto n = static_cast<std::size_t>(mg::shape_numel(shape));
  auto x = make_tensor(random_values(n, 1), shape, dtype(), dev);
  auto dy = make_tensor(random_values(n, 2), shape, dtype(), dev);
  const DropoutArgs args{0.3f, 42, 17};
  Tensor y = Tensor::empty(shape, dtype(), dev), dx = Tensor::empty(shape, dtype(), dev);
  ops.dropout_fwd(y, x.t, args);
  ops.dropout_bwd(dx, dy.t, args);
  const auto yv = to_doubles(y), dxv = to_doubles(dx);
  int dropped = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(yv[i] == 0.0, dxv[i] == 0.0) << "element " << i;
    dropped += yv[i] == 0.0;
  }
  EXPECT_GT(dropped, 0);
  // The fused op uses the same stream: its dx equals dropout_bwd's.
  Tensor dx2 = Tensor::empty(shape, dtype(), dev), none;
  ops.bias_dropout_add_bwd(dx2, none, dy.t, args);
  EXPECT_EQ(to_doubles(dx2), dxv);
}

TEST_P(DropoutTest, SameSeedAndOffsetSameMaskOtherOffsetsDiffer) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  const Shape shape{257};
  auto x = make_tensor(random_values(257, 3), shape, dtype(), dev);
  auto run = [&](uint64_t seed, uint64_t offset) {
    Tensor y = Tensor::empty(shape, dtype(), dev);
    ops.dropout_fwd(y, x.t, DropoutArgs{0.5f, seed, offset});
    return to_doubles(y);
  };
  const auto a = run(9, 100);
  EXPECT_EQ(run(9, 100), a);
  for (auto [seed, offset] :
       {std::pair{9ull, 101ull}, std::pair{9ull, 104ull}, std::pair{10ull, 100ull}}) {
    const auto b = run(seed, offset);
    int differ = 0;
    for (std::size_t i = 0; i < a.size(); ++i) differ += (a[i] == 0.0) != (b[i] == 0.0);
    EXPECT_GT(differ, 50) << "seed " << seed << " offset " << offset;  // ~128 expected
  }
}

TEST_P(DropoutTest, KeepRateIsOneMinusP) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  constexpr int64_t kN = 1 << 16;
  Tensor x = Tensor::from_vector(std::vector<float>(kN, 1.0f), {kN}, dtype()).to(dev);
  for (float p : {0.1f, 0.5f, 0.9f}) {
    Tensor y = Tensor::empty({kN}, dtype(), dev);
    ops.dropout_fwd(y, x, DropoutArgs{p, 2024, 0});
    int64_t kept = 0;
    for (double v : to_doubles(y)) kept += v != 0.0;
    EXPECT_NEAR(double(kept) / kN, 1.0 - p, 5 * std::sqrt(p * (1 - p) / kN)) << "p " << p;
  }
}

TEST_P(DropoutTest, SecondHalfWithShiftedOffsetEqualsSliceOfFullRun) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  const int64_t rows = 22, f = 13, half = rows / 2;
  auto x = make_tensor(random_values(rows * f, 4), {rows, f}, dtype(), dev);
  auto b = make_tensor(random_values(f, 5), {f}, dtype(), dev);
  auto r = make_tensor(random_values(rows * f, 6), {rows, f}, dtype(), dev);
  const DropoutArgs args{0.4f, 77, 9};
  const DropoutArgs shifted{args.p, args.seed, args.offset + uint64_t(half * f)};

  Tensor y = Tensor::empty({rows, f}, dtype(), dev);
  ops.dropout_fwd(y, x.t, args);
  Tensor y2 = Tensor::empty({half, f}, dtype(), dev);
  ops.dropout_fwd(y2, x.t.slice(half, half), shifted);
  EXPECT_EQ(to_doubles(y2), to_doubles(y.slice(half, half)));

  Tensor z = Tensor::empty({rows, f}, dtype(), dev);
  ops.bias_dropout_add_fwd(z, x.t, b.t, r.t, args);
  Tensor z2 = Tensor::empty({half, f}, dtype(), dev);
  ops.bias_dropout_add_fwd(z2, x.t.slice(half, half), b.t, r.t.slice(half, half), shifted);
  EXPECT_EQ(to_doubles(z2), to_doubles(z.slice(half, half)));
}

TEST_P(DropoutTest, ZeroProbabilityIsIdentity) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  const Shape shape{5, 7};
  auto x = make_tensor(random_values(35, 7), shape, dtype(), dev);
  Tensor y = Tensor::empty(shape, dtype(), dev), dx = Tensor::empty(shape, dtype(), dev);
  ops.dropout_fwd(y, x.t, DropoutArgs{0.0f, 1, 0});
  EXPECT_EQ(to_doubles(y), x.rounded);
  ops.dropout_bwd(dx, x.t, DropoutArgs{0.0f, 1, 0});
  EXPECT_EQ(to_doubles(dx), x.rounded);
}

TEST_P(DropoutTest, BiasDropoutAddForwardMatchesReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  uint64_t seed = 200;
  for (const Shape& shape : kShapes)
    for (float p : {0.0f, 0.1f, 0.5f})
      for (bool with_bias : {true, false}) {
        const auto n = static_cast<std::size_t>(mg::shape_numel(shape));
        const int64_t f = last_dim(shape);
        auto x = make_tensor(random_values(n, ++seed), shape, dtype(), dev);
        auto r = make_tensor(random_values(n, ++seed), shape, dtype(), dev);
        auto b = make_tensor(random_values(f, ++seed), {f}, dtype(), dev);
        const DropoutArgs args{p, seed, 11};
        Tensor y = Tensor::empty(shape, dtype(), dev), none;
        ops.bias_dropout_add_fwd(y, x.t, with_bias ? b.t : none, r.t, args);
        const auto expected = ref_bias_dropout_add(
            x.rounded, with_bias ? b.rounded : std::vector<double>{}, r.rounded, f, args);
        EXPECT_TRUE(mg::test::all_close(to_doubles(y), expected, tolerance(dtype())))
            << mg::shape_str(shape) << " p " << p << " bias " << with_bias;
      }
}

TEST_P(DropoutTest, BiasDropoutAddBackwardMatchesReference) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  uint64_t seed = 300;
  for (const Shape& shape : kShapes)
    for (float p : {0.0f, 0.3f}) {
      const auto n = static_cast<std::size_t>(mg::shape_numel(shape));
      const int64_t f = last_dim(shape);
      auto dy = make_tensor(random_values(n, ++seed), shape, dtype(), dev);
      auto db0 = make_tensor(random_values(f, ++seed), {f}, dtype(), dev);
      const DropoutArgs args{p, seed, 2};
      Tensor dx = Tensor::empty(shape, dtype(), dev);
      Tensor dbias = db0.t.clone();
      ops.bias_dropout_add_bwd(dx, dbias, dy.t, args);
      EXPECT_TRUE(
          mg::test::all_close(to_doubles(dx), ref_dropout(dy.rounded, args), tolerance(dtype())))
          << mg::shape_str(shape) << " p " << p;
      auto expected_db = ref_dbias(dy.rounded, f, args);
      for (int64_t j = 0; j < f; ++j) expected_db[j] += db0.rounded[j];  // accumulates (+=)
      EXPECT_TRUE(mg::test::all_close(to_doubles(dbias), expected_db, tolerance(dtype())))
          << mg::shape_str(shape) << " p " << p;
    }
}

// Megatron keeps f32 main grads for bf16/f16 weights: dbias may have another dtype than dx (f32
// here, for every dx dtype).
TEST_P(DropoutTest, BiasGradIntoF32MainGrad) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  const Shape shape{41, 19};
  auto dy = make_tensor(random_values(41 * 19, 8), shape, dtype(), dev);
  auto db0 = make_tensor(random_values(19, 9), {19}, DType::f32, dev);
  const DropoutArgs args{0.25f, 5, 0};
  Tensor dx = Tensor::empty(shape, dtype(), dev), dbias = db0.t.clone();
  ops.bias_dropout_add_bwd(dx, dbias, dy.t, args);
  auto expected = ref_dbias(dy.rounded, 19, args);
  for (int j = 0; j < 19; ++j) expected[j] += db0.rounded[j];
  EXPECT_TRUE(mg::test::all_close(to_doubles(dbias), expected, tolerance(DType::f32)));
}

TEST_P(DropoutTest, RejectsBadArguments) {
  MG_SKIP_IF_UNAVAILABLE(platform());
  const auto& ops = mg::test::ops_on(platform());
  const auto dev = mg::test::device_for(platform());
  Tensor x = Tensor::zeros({4, 6}, dtype(), dev), y = Tensor::zeros({4, 6}, dtype(), dev);
  for (float p : {-0.1f, 1.0f, 1.5f}) {
    EXPECT_THROW(ops.dropout_fwd(y, x, DropoutArgs{p, 0, 0}), mg::Error) << "p " << p;
    EXPECT_THROW(ops.dropout_bwd(y, x, DropoutArgs{p, 0, 0}), mg::Error) << "p " << p;
  }
  Tensor wrong = Tensor::zeros({4, 5}, dtype(), dev), none;
  try {
    ops.dropout_fwd(wrong, x, DropoutArgs{0.1f, 0, 0});
    ADD_FAILURE() << "no error for mismatched shapes";
  } catch (const mg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 5]"), std::string::npos) << e.what();
  }
  Tensor bad_bias = Tensor::zeros({5}, dtype(), dev);
  try {
    ops.bias_dropout_add_fwd(y, x, bad_bias, x, DropoutArgs{0.1f, 0, 0});
    ADD_FAILURE() << "no error for a bias of the wrong size";
  } catch (const mg::Error& e) {
    EXPECT_NE(std::string(e.what()).find("[5]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops.bias_dropout_add_fwd(y, x, none, wrong, DropoutArgs{0.1f, 0, 0}), mg::Error);
  EXPECT_THROW(ops.bias_dropout_add_bwd(y, bad_bias, x, DropoutArgs{0.1f, 0, 0}), mg::Error);
  const DType other = dtype() == DType::f32 ? DType::f64 : DType::f32;
  Tensor y_other = Tensor::zeros({4, 6}, other, dev);
  EXPECT_THROW(ops.dropout_fwd(y_other, x, DropoutArgs{0.1f, 0, 0}), mg::Error);
}

MG_INSTANTIATE_OP_TEST(DropoutTest);

// ---- finite-difference gradients (f64, cpu)
// ------------------------------------------------------

TEST(DropoutGradCheck, DropoutBackwardIsTheGradient) {
  const auto& ops = mg::test::ops_on("cpu");
  const Shape shape{6, 7};
  const auto x0 = random_values(42, 10);
  const auto w = random_values(42, 11);  // loss = sum(y * w), so dy = w
  const DropoutArgs args{0.3f, 8, 3};
  auto loss = [&](const std::vector<double>& xv) {
    Tensor y = Tensor::empty(shape, DType::f64);
    ops.dropout_fwd(y, Tensor::from_vector(xv, shape), args);
    const auto yv = to_doubles(y);
    double s = 0;
    for (std::size_t i = 0; i < yv.size(); ++i) s += yv[i] * w[i];
    return s;
  };
  Tensor dx = Tensor::empty(shape, DType::f64);
  ops.dropout_bwd(dx, Tensor::from_vector(w, shape), args);
  EXPECT_TRUE(
      mg::test::all_close(to_doubles(dx), mg::test::numerical_gradient(loss, x0), {1e-7, 1e-6}));
}

TEST(DropoutGradCheck, BiasDropoutAddBackwardIsTheGradient) {
  const auto& ops = mg::test::ops_on("cpu");
  const int64_t rows = 5, f = 7;
  const Shape shape{rows, f};
  const auto x0 = random_values(35, 12), b0 = random_values(7, 13), r0 = random_values(35, 14);
  const auto w = random_values(35, 15);
  const DropoutArgs args{0.4f, 21, 6};
  auto loss_of = [&](const std::vector<double>& xv, const std::vector<double>& bv,
                     const std::vector<double>& rv) {
    Tensor y = Tensor::empty(shape, DType::f64);
    ops.bias_dropout_add_fwd(y, Tensor::from_vector(xv, shape), Tensor::from_vector(bv, {f}),
                             Tensor::from_vector(rv, shape), args);
    const auto yv = to_doubles(y);
    double s = 0;
    for (std::size_t i = 0; i < yv.size(); ++i) s += yv[i] * w[i];
    return s;
  };
  Tensor dx = Tensor::empty(shape, DType::f64), dbias = Tensor::zeros({f}, DType::f64);
  const Tensor dy = Tensor::from_vector(w, shape);
  ops.bias_dropout_add_bwd(dx, dbias, dy, args);
  const Tol tol{1e-7, 1e-6};
  EXPECT_TRUE(mg::test::all_close(
      to_doubles(dx),
      mg::test::numerical_gradient([&](const auto& v) { return loss_of(v, b0, r0); }, x0), tol));
  EXPECT_TRUE(mg::test::all_close(
      to_doubles(dbias),
      mg::test::numerical_gradient([&](const auto& v) { return loss_of(x0, v, r0); }, b0), tol));
  // d(residual) is dy itself (the op list's contract; nothing computes it).
  EXPECT_TRUE(mg::test::all_close(
      w, mg::test::numerical_gradient([&](const auto& v) { return loss_of(x0, b0, v); }, r0), tol));
}

}  // namespace
