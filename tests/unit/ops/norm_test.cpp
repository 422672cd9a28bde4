// Conformance tests of LayerNorm and RMSNorm (forward and backward) against naive f64 references
// on every platform and kernel dtype, with and without beta, with zero-centred gamma on and off,
// f64 finite-difference checks of both backwards, and argument validation.
// The backward references use the explicit Jacobian of the normalisation (O(H^2) per row), not
// the two-term formula the kernels use.
#include <cmath>
#include <limits>
#include <tuple>

#include "tests/unit/test_util.h"

namespace mg {
namespace {

using ops::NormArgs;
using test::all_close;
using test::make_tensor;
using test::random_values;
using test::to_doubles;
using test::tolerance;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr test::Tol kFdTol{1e-7, 1e-6};

using Param = test::PlatformDType;

DType stat_dtype(DType x) {
  return x == DType::f64 ? DType::f64 : DType::f32;
}

// x shapes [.., H]: H = 1, primes, a power of two; 100 rows cross several reduction chunks.
const std::vector<Shape> kShapes = {{5, 1}, {3, 7}, {3, 2, 13}, {2, 64}, {100, 31}};

int64_t rows_of(const Shape& s) {
  return shape_numel(s) / s.back();
}

std::vector<double> applied(const std::vector<double>& gamma, bool zc) {
  std::vector<double> w(gamma);
  if (zc)
    for (auto& v : w) v += 1.0;
  return w;
}

struct RefNorm {
  std::vector<double> y, mean, rstd;
};

// rms = false: LayerNorm (beta may be empty); rms = true: RMSNorm (no mean, no beta).
RefNorm ref_norm_fwd(const std::vector<double>& x, const std::vector<double>& gamma,
                     const std::vector<double>& beta, int64_t rows, int64_t h, double eps, bool zc,
                     bool rms) {
  const auto w = applied(gamma, zc);
  RefNorm r;
  r.y.resize(x.size());
  for (int64_t n = 0; n < rows; ++n) {
    const double* xr = x.data() + n * h;
    double mu = 0;
    if (!rms) {
      for (int64_t j = 0; j < h; ++j) mu += xr[j];
      mu /= h;
    }
    double var = 0;
    for (int64_t j = 0; j < h; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    var /= h;
    const double rs = 1.0 / std::sqrt(var + eps);
    r.mean.push_back(mu);
    r.rstd.push_back(rs);
    for (int64_t j = 0; j < h; ++j)
      r.y[n * h + j] = (xr[j] - mu) * rs * w[j] + (beta.empty() ? 0.0 : beta[j]);
  }
  return r;
}

struct RefGrad {
  std::vector<double> dx, dgamma, dbeta;
};

// dx via the Jacobian d xhat_j / d x_i = rstd (delta_ij - [!rms] / H - xhat_i xhat_j / H);
// dgamma = dgamma0 + sum dy * xhat, dbeta = dbeta0 + sum dy.
RefGrad ref_norm_bwd(const std::vector<double>& dy, const std::vector<double>& x,
                     const std::vector<double>& mean, const std::vector<double>& rstd,
                     const std::vector<double>& gamma, std::vector<double> dgamma0,
                     std::vector<double> dbeta0, int64_t rows, int64_t h, bool zc, bool rms) {
  const auto w = applied(gamma, zc);
  RefGrad g;
  g.dx.assign(x.size(), 0.0);
  g.dgamma = std::move(dgamma0);
  g.dbeta = std::move(dbeta0);
  for (int64_t n = 0; n < rows; ++n) {
    const double mu = rms ? 0.0 : mean[n], rs = rstd[n];
    std::vector<double> xh(h);
    for (int64_t j = 0; j < h; ++j) xh[j] = (x[n * h + j] - mu) * rs;
    for (int64_t i = 0; i < h; ++i) {
      double s = 0;
      for (int64_t j = 0; j < h; ++j) {
        const double jac = rs * ((i == j ? 1.0 : 0.0) - (rms ? 0.0 : 1.0 / h) - xh[i] * xh[j] / h);
        s += dy[n * h + j] * w[j] * jac;
      }
      g.dx[n * h + i] = s;
    }
    for (int64_t j = 0; j < h; ++j) {
      g.dgamma[j] += dy[n * h + j] * xh[j];
      if (!g.dbeta.empty()) g.dbeta[j] += dy[n * h + j];
    }
  }
  return g;
}

class NormTest : public ::testing::TestWithParam<Param> {};

TEST_P(NormTest, LayerNormForward) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  for (const Shape& shape : kShapes) {
    const int64_t h = shape.back(), rows = rows_of(shape), n = rows * h;
    for (bool with_beta : {true, false}) {
      for (bool zc : {false, true}) {
        NormArgs args;
        args.zero_centered_gamma = zc;
        auto x = make_tensor(random_values(n, 1 + h, 0.1, 2.0), shape, dtype, dev);
        auto gamma = make_tensor(random_values(h, 2 + h), {h}, dtype, dev);
        auto beta = make_tensor(random_values(h, 3 + h), {h}, dtype, dev);
        auto y = make_tensor(std::vector<double>(n, kNaN), shape, dtype, dev);
        Tensor mean = Tensor::empty({rows}, stat_dtype(dtype), dev);
        Tensor rstd = Tensor::empty({rows}, stat_dtype(dtype), dev);
        ops.layernorm_fwd(y.t, mean, rstd, x.t, gamma.t, with_beta ? beta.t : Tensor(), args);
        const auto ref =
            ref_norm_fwd(x.rounded, gamma.rounded, with_beta ? beta.rounded : std::vector<double>(),
                         rows, h, args.eps, zc, false);
        const std::string ctx =
            shape_str(shape) + (with_beta ? " beta" : " no beta") + (zc ? " zero-centred" : "");
        EXPECT_TRUE(all_close(to_doubles(y.t), ref.y, tolerance(dtype))) << ctx;
        EXPECT_TRUE(all_close(to_doubles(mean), ref.mean, tolerance(stat_dtype(dtype)))) << ctx;
        EXPECT_TRUE(all_close(to_doubles(rstd), ref.rstd, tolerance(stat_dtype(dtype)))) << ctx;
      }
    }
  }
}

TEST_P(NormTest, LayerNormBackward) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  for (const Shape& shape : kShapes) {
    const int64_t h = shape.back(), rows = rows_of(shape), n = rows * h;
    for (bool with_beta : {true, false}) {
      for (bool zc : {false, true}) {
        // dgamma/dbeta in the param dtype, and f32 grads of narrow params.
        for (DType gdt : {dtype, DType::f32}) {
          NormArgs args;
          args.zero_centered_gamma = zc;
          auto x = make_tensor(random_values(n, 11 + h, 0.1, 2.0), shape, dtype, dev);
          auto dy = make_tensor(random_values(n, 12 + h), shape, dtype, dev);
          auto gamma = make_tensor(random_values(h, 13 + h), {h}, dtype, dev);
          // Statistics of x, as forward saves them (f32 for narrow x).
          const auto fwd = ref_norm_fwd(x.rounded, gamma.rounded, {}, rows, h, args.eps, zc, false);
          auto mean = make_tensor(fwd.mean, {rows}, stat_dtype(dtype), dev);
          auto rstd = make_tensor(fwd.rstd, {rows}, stat_dtype(dtype), dev);
          auto dx = make_tensor(std::vector<double>(n, kNaN), shape, dtype, dev);
          auto dgamma = make_tensor(random_values(h, 14 + h), {h}, gdt, dev);
          auto dbeta = make_tensor(random_values(h, 15 + h), {h}, gdt, dev);
          Tensor dbeta_arg = with_beta ? dbeta.t : Tensor();
          ops.layernorm_bwd(dx.t, dgamma.t, dbeta_arg, dy.t, x.t, mean.t, rstd.t, gamma.t, args);
          const auto ref = ref_norm_bwd(
              dy.rounded, x.rounded, mean.rounded, rstd.rounded, gamma.rounded, dgamma.rounded,
              with_beta ? dbeta.rounded : std::vector<double>(), rows, h, zc, false);
          const std::string ctx = shape_str(shape) + (with_beta ? " beta" : " no beta") +
                                  (zc ? " zero-centred" : "") + " grads " +
                                  std::string(dtype_name(gdt));
          EXPECT_TRUE(all_close(to_doubles(dx.t), ref.dx, tolerance(dtype))) << ctx;
          EXPECT_TRUE(all_close(to_doubles(dgamma.t), ref.dgamma, tolerance(gdt))) << ctx;
          if (with_beta) {
            EXPECT_TRUE(all_close(to_doubles(dbeta.t), ref.dbeta, tolerance(gdt))) << ctx;
          } else {
            // Without beta, dbeta is not an argument: the buffer we kept must be untouched.
            EXPECT_EQ(to_doubles(dbeta.t), dbeta.rounded) << ctx;
          }
        }
      }
    }
  }
}

TEST_P(NormTest, RmsNormForward) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  for (const Shape& shape : kShapes) {
    const int64_t h = shape.back(), rows = rows_of(shape), n = rows * h;
    for (bool zc : {false, true}) {
      NormArgs args;
      args.zero_centered_gamma = zc;
      args.eps = 1e-6f;
      auto x = make_tensor(random_values(n, 21 + h, 0.1, 2.0), shape, dtype, dev);
      auto gamma = make_tensor(random_values(h, 22 + h), {h}, dtype, dev);
      auto y = make_tensor(std::vector<double>(n, kNaN), shape, dtype, dev);
      Tensor rstd = Tensor::empty({rows}, stat_dtype(dtype), dev);
      ops.rmsnorm_fwd(y.t, rstd, x.t, gamma.t, args);
      const auto ref = ref_norm_fwd(x.rounded, gamma.rounded, {}, rows, h, args.eps, zc, true);
      const std::string ctx = shape_str(shape) + (zc ? " zero-centred" : "");
      EXPECT_TRUE(all_close(to_doubles(y.t), ref.y, tolerance(dtype))) << ctx;
      EXPECT_TRUE(all_close(to_doubles(rstd), ref.rstd, tolerance(stat_dtype(dtype)))) << ctx;
    }
  }
}

TEST_P(NormTest, RmsNormBackward) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  for (const Shape& shape : kShapes) {
    const int64_t h = shape.back(), rows = rows_of(shape), n = rows * h;
    for (bool zc : {false, true}) {
      for (DType gdt : {dtype, DType::f32}) {
        NormArgs args;
        args.zero_centered_gamma = zc;
        auto x = make_tensor(random_values(n, 31 + h, 0.1, 2.0), shape, dtype, dev);
        auto dy = make_tensor(random_values(n, 32 + h), shape, dtype, dev);
        auto gamma = make_tensor(random_values(h, 33 + h), {h}, dtype, dev);
        const auto fwd = ref_norm_fwd(x.rounded, gamma.rounded, {}, rows, h, args.eps, zc, true);
        auto rstd = make_tensor(fwd.rstd, {rows}, stat_dtype(dtype), dev);
        auto dx = make_tensor(std::vector<double>(n, kNaN), shape, dtype, dev);
        auto dgamma = make_tensor(random_values(h, 34 + h), {h}, gdt, dev);
        ops.rmsnorm_bwd(dx.t, dgamma.t, dy.t, x.t, rstd.t, gamma.t, args);
        const auto ref = ref_norm_bwd(dy.rounded, x.rounded, {}, rstd.rounded, gamma.rounded,
                                      dgamma.rounded, {}, rows, h, zc, true);
        const std::string ctx = shape_str(shape) + (zc ? " zero-centred" : "") + " grads " +
                                std::string(dtype_name(gdt));
        EXPECT_TRUE(all_close(to_doubles(dx.t), ref.dx, tolerance(dtype))) << ctx;
        EXPECT_TRUE(all_close(to_doubles(dgamma.t), ref.dgamma, tolerance(gdt))) << ctx;
      }
    }
  }
}

MG_INSTANTIATE_OP_TEST(NormTest);

// ---- f64 finite-difference checks (cpu) ---------------------------------------------------------

double weighted_sum(const Tensor& y, const std::vector<double>& w) {
  const auto v = to_doubles(y);
  double s = 0;
  for (std::size_t i = 0; i < v.size(); ++i) s += v[i] * w[i];
  return s;
}

std::vector<double> plus(std::vector<double> a, const std::vector<double>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

TEST(NormGradient, LayerNormMatchesFiniteDifferences) {
  const auto& ops = test::ops_on("cpu");
  const int64_t rows = 3, h = 7;
  const DType f64 = DType::f64;
  for (bool zc : {false, true}) {
    NormArgs args;
    args.zero_centered_gamma = zc;
    const auto x0 = random_values(rows * h, 41, 0.1, 2.0), g0 = random_values(h, 42),
               b0 = random_values(h, 43), wv = random_values(rows * h, 44);
    Tensor mean = Tensor::empty({rows}, f64), rstd = Tensor::empty({rows}, f64);
    auto loss = [&](const std::vector<double>& xv, const std::vector<double>& gv,
                    const std::vector<double>& bv) {
      Tensor y = Tensor::empty({rows, h}, f64);
      ops.layernorm_fwd(y, mean, rstd, Tensor::from_vector(xv, {rows, h}, f64),
                        Tensor::from_vector(gv, {h}, f64), Tensor::from_vector(bv, {h}, f64), args);
      return weighted_sum(y, wv);
    };
    loss(x0, g0, b0);  // leaves mean/rstd of x0
    Tensor dx = Tensor::empty({rows, h}, f64);
    const auto dg0 = random_values(h, 45), db0 = random_values(h, 46);
    Tensor dgamma = Tensor::from_vector(dg0, {h}, f64), dbeta = Tensor::from_vector(db0, {h}, f64);
    ops.layernorm_bwd(dx, dgamma, dbeta, Tensor::from_vector(wv, {rows, h}, f64),
                      Tensor::from_vector(x0, {rows, h}, f64), mean, rstd,
                      Tensor::from_vector(g0, {h}, f64), args);
    using V = std::vector<double>;
    EXPECT_TRUE(all_close(to_doubles(dx),
                          test::numerical_gradient([&](const V& v) { return loss(v, g0, b0); }, x0),
                          kFdTol))
        << "zc " << zc;
    EXPECT_TRUE(all_close(
        to_doubles(dgamma),
        plus(test::numerical_gradient([&](const V& v) { return loss(x0, v, b0); }, g0), dg0),
        kFdTol))
        << "zc " << zc;
    EXPECT_TRUE(all_close(
        to_doubles(dbeta),
        plus(test::numerical_gradient([&](const V& v) { return loss(x0, g0, v); }, b0), db0),
        kFdTol))
        << "zc " << zc;
  }
}

TEST(NormGradient, RmsNormMatchesFiniteDifferences) {
  const auto& ops = test::ops_on("cpu");
  const int64_t rows = 3, h = 7;
  const DType f64 = DType::f64;
  for (bool zc : {false, true}) {
    NormArgs args;
    args.zero_centered_gamma = zc;
    const auto x0 = random_values(rows * h, 51, 0.1, 2.0), g0 = random_values(h, 52),
               wv = random_values(rows * h, 53);
    Tensor rstd = Tensor::empty({rows}, f64);
    auto loss = [&](const std::vector<double>& xv, const std::vector<double>& gv) {
      Tensor y = Tensor::empty({rows, h}, f64);
      ops.rmsnorm_fwd(y, rstd, Tensor::from_vector(xv, {rows, h}, f64),
                      Tensor::from_vector(gv, {h}, f64), args);
      return weighted_sum(y, wv);
    };
    loss(x0, g0);
    Tensor dx = Tensor::empty({rows, h}, f64);
    const auto dg0 = random_values(h, 54);
    Tensor dgamma = Tensor::from_vector(dg0, {h}, f64);
    ops.rmsnorm_bwd(dx, dgamma, Tensor::from_vector(wv, {rows, h}, f64),
                    Tensor::from_vector(x0, {rows, h}, f64), rstd,
                    Tensor::from_vector(g0, {h}, f64), args);
    using V = std::vector<double>;
    EXPECT_TRUE(all_close(to_doubles(dx),
                          test::numerical_gradient([&](const V& v) { return loss(v, g0); }, x0),
                          kFdTol))
        << "zc " << zc;
    EXPECT_TRUE(all_close(
        to_doubles(dgamma),
        plus(test::numerical_gradient([&](const V& v) { return loss(x0, v); }, g0), dg0), kFdTol))
        << "zc " << zc;
  }
}

// ---- validation (cpu kernels)
// ---------------------------------------------------------------------

TEST(NormValidation, RejectsMismatchedArguments) {
  const auto& ops = test::ops_on("cpu");
  const DType f32 = DType::f32;
  Tensor x = Tensor::zeros({4, 8}, f32), y = Tensor::zeros({4, 8}, f32);
  Tensor mean = Tensor::zeros({4}, f32), rstd = Tensor::zeros({4}, f32);
  Tensor gamma = Tensor::zeros({8}, f32), beta = Tensor::zeros({8}, f32);
  try {
    ops.layernorm_fwd(y, mean, rstd, x, Tensor::zeros({7}, f32), beta, NormArgs{});
    ADD_FAILURE() << "gamma [7] accepted for H = 8";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("gamma [7] does not match x's last dim 8"), std::string::npos)
        << e.message();
  }
  Tensor beta_bad = Tensor::zeros({9}, f32);
  EXPECT_THROW(ops.layernorm_fwd(y, mean, rstd, x, gamma, beta_bad, NormArgs{}), Error);
  Tensor mean_bf16 = Tensor::zeros({4}, DType::bf16);
  EXPECT_THROW(ops.layernorm_fwd(y, mean_bf16, rstd, x, gamma, beta, NormArgs{}), Error);
  Tensor rstd_short = Tensor::zeros({3}, f32);
  EXPECT_THROW(ops.rmsnorm_fwd(y, rstd_short, x, gamma, NormArgs{}), Error);
  Tensor y_bf16 = Tensor::zeros({4, 8}, DType::bf16);
  EXPECT_THROW(ops.rmsnorm_fwd(y_bf16, rstd, x, gamma, NormArgs{}), Error);
  Tensor dx = Tensor::zeros({4, 8}, f32), dgamma = Tensor::zeros({8}, f32);
  Tensor dy_bad = Tensor::zeros({4, 7}, f32), no_dbeta;
  EXPECT_THROW(ops.layernorm_bwd(dx, dgamma, no_dbeta, dy_bad, x, mean, rstd, gamma, NormArgs{}),
               Error);
  Tensor dgamma_bad = Tensor::zeros({4}, f32);
  EXPECT_THROW(ops.rmsnorm_bwd(dx, dgamma_bad, y, x, rstd, gamma, NormArgs{}), Error);
}

}  // namespace
}  // namespace mg
