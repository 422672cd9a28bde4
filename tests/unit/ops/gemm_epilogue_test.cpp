// Conformance tests of gemm_epilogue (op_args.h GemmEpilogueArgs) on every platform and kernel
// dtype against an independent f64 reference: every epilogue, odd sizes, every transpose, C in A's
// dtype or f32, the aux contents (the pre-activation, rounded once to C's dtype), dbias
// accumulating (+=) into any float dtype; the fused MLP sequence (bias_gelu forward, dgelu_bgrad
// and bgrad backward) against the unfused ops (gemm, bias_add, gelu tanh, gelu_bwd, bias_grad) and
// against finite differences in f64; and the argument validation.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "tests/unit/test_util.h"

namespace mg {
namespace {

using ops::GemmArgs;
using ops::GemmEpilogue;
using ops::GemmEpilogueArgs;
using test::all_close;
using test::make_tensor;
using test::random_values;
using test::to_doubles;
using test::tolerance;

using Param = test::PlatformDType;

double gelu_ref(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
// d/dx of gelu_ref, written out independently of the kernels' factorisation.
double gelu_grad_ref(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  const double u = c * (x + 0.044715 * x * x * x);
  const double sech2 = 1.0 / (std::cosh(u) * std::cosh(u));
  return 0.5 * (1.0 + std::tanh(u)) + 0.5 * x * sech2 * c * (1.0 + 3.0 * 0.044715 * x * x);
}

// op(A) [M, K] element (i, p) from A stored row-major [M, K] or, transposed, [K, M].
double op_at(const std::vector<double>& a, bool trans, int64_t rows, int64_t cols, int64_t i,
             int64_t p) {
  return trans ? a[static_cast<std::size_t>(p * rows + i)]
               : a[static_cast<std::size_t>(i * cols + p)];
}

struct RefOut {
  std::vector<double> c, aux, dbias;
};

// Independent f64 reference of every epilogue (op_args.h): dbias0 is the starting dbias.
RefOut reference(const std::vector<double>& a, const std::vector<double>& b,
                 const std::vector<double>& bias, const std::vector<double>& aux_in,
                 const std::vector<double>& c0, const std::vector<double>& dbias0, int64_t m,
                 int64_t n, int64_t k, const GemmEpilogueArgs& g) {
  RefOut r;
  r.c.assign(static_cast<std::size_t>(m * n), 0.0);
  r.dbias = dbias0;
  std::vector<double> p(static_cast<std::size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t q = 0; q < k; ++q)
        s += op_at(a, g.trans_a, m, k, i, q) * op_at(b, g.trans_b, k, n, q, j);
      p[static_cast<std::size_t>(i * n + j)] = s;
    }
  switch (g.epilogue) {
    case GemmEpilogue::bias:
      for (int64_t i = 0; i < m * n; ++i) r.c[i] = p[i] + bias[i % n];
      break;
    case GemmEpilogue::bias_gelu:
      r.aux.resize(r.c.size());
      for (int64_t i = 0; i < m * n; ++i) {
        const double t = p[i] + (bias.empty() ? 0.0 : bias[i % n]);
        r.aux[i] = t;
        r.c[i] = gelu_ref(t);
      }
      break;
    case GemmEpilogue::dgelu_bgrad:
      for (int64_t i = 0; i < m * n; ++i) {
        r.c[i] = gelu_grad_ref(aux_in[i]) * p[i];
        if (!r.dbias.empty()) r.dbias[i % n] += r.c[i];
      }
      break;
    case GemmEpilogue::bgrad:
      for (int64_t i = 0; i < m * n; ++i) r.c[i] = p[i] + (g.beta != 0 ? c0[i] : 0.0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t q = 0; q < k; ++q) r.dbias[i] += op_at(a, g.trans_a, m, k, i, q);
      break;
  }
  return r;
}

test::Tol times(test::Tol t, double f) {
  return {t.atol * f, t.rtol * f};
}

class GemmEpilogueTest : public ::testing::TestWithParam<Param> {
 protected:
  // One call of gemm_epilogue on the parameter platform with A/B in the parameter dtype, C (and
  // aux) in c_dtype, dbias in dbias_dtype, against reference().
  void check(GemmEpilogue e, int64_t m, int64_t n, int64_t k, bool ta, bool tb, DType c_dtype,
             DType dbias_dtype, bool with_bias, bool with_dbias, float beta, uint64_t seed) {
    const auto& [platform, dtype] = GetParam();
    const Device dev = test::device_for(platform);
    const auto& ops = test::ops_on(platform);
    const GemmEpilogueArgs g{.trans_a = ta, .trans_b = tb, .epilogue = e, .beta = beta};
    auto a = make_tensor(random_values(static_cast<std::size_t>(m * k), seed),
                         ta ? Shape{k, m} : Shape{m, k}, dtype, dev);
    auto b = make_tensor(random_values(static_cast<std::size_t>(k * n), seed + 1),
                         tb ? Shape{n, k} : Shape{k, n}, dtype, dev);
    // C starts as NaN unless beta reads it: the written outputs must not read it.
    std::vector<double> c0v(static_cast<std::size_t>(m * n), std::nan(""));
    if (beta != 0) c0v = random_values(c0v.size(), seed + 2);
    auto c = make_tensor(c0v, {m, n}, c_dtype, dev);
    test::TestTensor bias, aux, dbias;
    if (with_bias)
      bias = make_tensor(random_values(static_cast<std::size_t>(n), seed + 3), {n}, dtype, dev);
    const bool aux_in = e == GemmEpilogue::dgelu_bgrad, aux_out = e == GemmEpilogue::bias_gelu;
    if (aux_in)  // pre-activations over GELU's curved range
      aux = make_tensor(random_values(static_cast<std::size_t>(m * n), seed + 4, 0.1, 3.0), {m, n},
                        c_dtype, dev);
    if (aux_out)
      aux = make_tensor(std::vector<double>(static_cast<std::size_t>(m * n), std::nan("")), {m, n},
                        c_dtype, dev);
    const int64_t dlen = e == GemmEpilogue::bgrad ? m : n;
    if (with_dbias)
      dbias = make_tensor(random_values(static_cast<std::size_t>(dlen), seed + 5), {dlen},
                          dbias_dtype, dev);
    ops.gemm_epilogue(c.t, aux.t, dbias.t, a.t, b.t, bias.t, g);
    const RefOut r = reference(a.rounded, b.rounded, bias.rounded, aux.rounded, c.rounded,
                               dbias.rounded, m, n, k, g);
    const std::string what = std::string(ops::gemm_epilogue_name(e)) + " m " + std::to_string(m) +
                             " n " + std::to_string(n) + " k " + std::to_string(k) + " trans_a " +
                             std::to_string(ta) + " trans_b " + std::to_string(tb) + " C " +
                             std::string(dtype_name(c_dtype)) + " beta " + std::to_string(beta);
    EXPECT_TRUE(all_close(to_doubles(c.t), r.c, tolerance(c_dtype))) << what;
    if (aux_out) {
      EXPECT_TRUE(all_close(to_doubles(aux.t), r.aux, tolerance(c_dtype))) << what;
    }
    if (with_dbias) {
      // Sums of up to 33 terms: 4x the looser of the dbias and input dtypes' tolerances.
      const test::Tol ta_ = tolerance(dbias_dtype), tb_ = tolerance(dtype);
      const test::Tol t = times({std::max(ta_.atol, tb_.atol), std::max(ta_.rtol, tb_.rtol)}, 4);
      EXPECT_TRUE(all_close(to_doubles(dbias.t), r.dbias, t)) << what << " (dbias)";
    }
  }
};

TEST_P(GemmEpilogueTest, EveryEpilogueTransposeAndOddSize) {
  MG_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  const DType dtype = std::get<1>(GetParam());
  const DType grad = dtype == DType::f64 ? DType::f64 : DType::f32;
  uint64_t seed = 100;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (DType c_dtype : {dtype, grad}) {
        if (dtype == DType::f64 && c_dtype != DType::f64) continue;
        check(GemmEpilogue::bias, 7, 13, 5, ta, tb, c_dtype, grad, true, false, 0, seed++);
        check(GemmEpilogue::bias_gelu, 9, 11, 6, ta, tb, c_dtype, grad, true, false, 0, seed++);
        check(GemmEpilogue::bias_gelu, 5, 3, 4, ta, tb, c_dtype, grad, false, false, 0, seed++);
        check(GemmEpilogue::dgelu_bgrad, 11, 7, 9, ta, tb, c_dtype, grad, false, true, 0, seed++);
        check(GemmEpilogue::dgelu_bgrad, 4, 6, 3, ta, tb, c_dtype, grad, false, false, 0, seed++);
        check(GemmEpilogue::bgrad, 13, 5, 33, ta, tb, c_dtype, grad, false, true, 0, seed++);
        check(GemmEpilogue::bgrad, 6, 9, 7, ta, tb, c_dtype, grad, false, true, 1, seed++);
      }
}

// Aligned, larger shapes: the ones a cuBLASLt epilogue runs (multiples of 8 and 16 bytes).
TEST_P(GemmEpilogueTest, AlignedShapes) {
  MG_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  const DType dtype = std::get<1>(GetParam());
  const DType grad = dtype == DType::f64 ? DType::f64 : DType::f32;
  check(GemmEpilogue::bias, 64, 96, 48, false, true, dtype, grad, true, false, 0, 1);
  check(GemmEpilogue::bias_gelu, 64, 96, 48, false, true, dtype, grad, true, false, 0, 2);
  check(GemmEpilogue::dgelu_bgrad, 64, 96, 48, false, false, dtype, grad, false, true, 0, 3);
  check(GemmEpilogue::bgrad, 96, 48, 64, true, false, grad, grad, false, true, 1, 4);
}

// dbias accumulates into its own dtype (a bf16 / f16 dbias, an f64 one).
TEST_P(GemmEpilogueTest, DbiasAccumulatesInAnyFloatDtype) {
  MG_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  const DType dtype = std::get<1>(GetParam());
  for (DType dd : test::kKernelDTypes) {
    check(GemmEpilogue::dgelu_bgrad, 8, 16, 8, false, false, dtype, dd, false, true, 0, 7);
    check(GemmEpilogue::bgrad, 16, 8, 8, true, false, dtype, dd, false, true, 0, 8);
  }
}

// K = 0: the product is zero; bias / GELU of the bias alone; bgrad adds nothing to dbias.
TEST_P(GemmEpilogueTest, EmptyInnerDim) {
  MG_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  const DType dtype = std::get<1>(GetParam());
  check(GemmEpilogue::bias, 3, 5, 0, false, false, dtype, DType::f32, true, false, 0, 9);
  check(GemmEpilogue::bias_gelu, 3, 5, 0, false, true, dtype, DType::f32, true, false, 0, 10);
  check(GemmEpilogue::bgrad, 3, 5, 0, true, false, dtype, DType::f32, false, true, 1, 11);
}

MG_INSTANTIATE_OP_TEST(GemmEpilogueTest);

// ---- the fused MLP sequence against the unfused ops --------------------------------------------

struct MlpGrads {
  std::vector<double> y, dx, dw1, db1, dw2;
};

// y [N, H] = gelu_tanh(x W1^T + b1) W2^T and its backward for dy, on ops in dtype: fused (the
// gemm_epilogue sequence MLP uses) or unfused (gemm, bias_add, gelu_fwd tanh, gelu_bwd,
// bias_grad); bgrad_on_wgrad picks the bgrad epilogue on the fc1 weight-gradient GEMM instead of
// dgelu_bgrad's dbias.
MlpGrads run_mlp(const ops::OpTable& o, DType dt, bool fused, bool bgrad_on_wgrad,
                 const std::vector<double>& x, const std::vector<double>& w1,
                 const std::vector<double>& b1, const std::vector<double>& w2,
                 const std::vector<double>& dy, int64_t n, int64_t h, int64_t f) {
  const DType gd = dt == DType::f64 ? DType::f64 : DType::f32;
  auto T = [&](const std::vector<double>& v, const Shape& s, DType d) {
    return Tensor::from_vector(v, s, DType::f64).to(d);
  };
  Tensor xt = T(x, {n, h}, dt), w1t = T(w1, {f, h}, dt), b1t = T(b1, {f}, dt),
         w2t = T(w2, {h, f}, dt), dyt = T(dy, {n, h}, dt);
  Tensor u = Tensor::empty({n, f}, dt), a = Tensor::empty({n, f}, dt);
  Tensor none, none2;
  if (fused) {
    o.gemm_epilogue(a, u, none, xt, w1t, b1t,
                    GemmEpilogueArgs{.trans_b = true, .epilogue = GemmEpilogue::bias_gelu});
  } else {
    o.gemm(u, xt, w1t, GemmArgs{.trans_b = true});
    o.bias_add(u, b1t);
    o.gelu_fwd(a, u, ops::GeluApprox::tanh);
  }
  Tensor y = Tensor::empty({n, h}, dt);
  o.gemm(y, a, w2t, GemmArgs{.trans_b = true});
  Tensor dw1 = Tensor::zeros({f, h}, gd), db1 = Tensor::zeros({f}, gd),
         dw2 = Tensor::zeros({h, f}, gd);
  o.gemm(dw2, dyt, a, GemmArgs{.trans_a = true, .beta = 1.0f});
  Tensor du = Tensor::empty({n, f}, dt);
  if (fused) {
    Tensor& db = bgrad_on_wgrad ? none2 : db1;
    o.gemm_epilogue(du, u, db, dyt, w2t, none,
                    GemmEpilogueArgs{.epilogue = GemmEpilogue::dgelu_bgrad});
  } else {
    Tensor da = Tensor::empty({n, f}, dt);
    o.gemm(da, dyt, w2t, GemmArgs{});
    o.gelu_bwd(du, da, u, ops::GeluApprox::tanh);
    o.bias_grad(db1, du);
  }
  if (fused && bgrad_on_wgrad)
    o.gemm_epilogue(dw1, none, db1, du, xt, none,
                    GemmEpilogueArgs{.trans_a = true, .epilogue = GemmEpilogue::bgrad, .beta = 1});
  else
    o.gemm(dw1, du, xt, GemmArgs{.trans_a = true, .beta = 1.0f});
  Tensor dx = Tensor::empty({n, h}, dt);
  o.gemm(dx, du, w1t, GemmArgs{});
  return {to_doubles(y), to_doubles(dx), to_doubles(dw1), to_doubles(db1), to_doubles(dw2)};
}

TEST(GemmEpilogueMlp, FusedEqualsUnfusedWithinRoundOff) {
  const int64_t n = 10, h = 6, f = 12;
  const auto x = random_values(n * h, 1), w1 = random_values(f * h, 2), b1 = random_values(f, 3),
             w2 = random_values(h * f, 4), dy = random_values(n * h, 5);
  const auto& o = test::ops_on("cpu");
  for (DType dt : {DType::f64, DType::f32}) {
    const test::Tol tol = times(tolerance(dt), 4);
    const MlpGrads ref = run_mlp(o, dt, false, false, x, w1, b1, w2, dy, n, h, f);
    for (bool on_wgrad : {false, true}) {
      const MlpGrads fz = run_mlp(o, dt, true, on_wgrad, x, w1, b1, w2, dy, n, h, f);
      EXPECT_TRUE(all_close(fz.y, ref.y, tol)) << dtype_name(dt);
      EXPECT_TRUE(all_close(fz.dx, ref.dx, tol)) << dtype_name(dt);
      EXPECT_TRUE(all_close(fz.dw1, ref.dw1, tol)) << dtype_name(dt);
      EXPECT_TRUE(all_close(fz.db1, ref.db1, tol)) << dtype_name(dt) << " bgrad " << on_wgrad;
      EXPECT_TRUE(all_close(fz.dw2, ref.dw2, tol)) << dtype_name(dt);
    }
  }
}

TEST(GemmEpilogueMlp, FusedBackwardMatchesFiniteDifferences) {
  const int64_t n = 5, h = 4, f = 6;
  const auto x = random_values(n * h, 11), w1 = random_values(f * h, 12), b1 = random_values(f, 13),
             w2 = random_values(h * f, 14), dy = random_values(n * h, 15);
  const auto& o = test::ops_on("cpu");
  const MlpGrads g = run_mlp(o, DType::f64, true, false, x, w1, b1, w2, dy, n, h, f);
  // J = sum(dy * y) as a function of one argument vector.
  auto objective = [&](const std::vector<double>& xs, const std::vector<double>& w1s,
                       const std::vector<double>& b1s) {
    const MlpGrads r = run_mlp(o, DType::f64, true, false, xs, w1s, b1s, w2, dy, n, h, f);
    return std::inner_product(r.y.begin(), r.y.end(), dy.begin(), 0.0);
  };
  const test::Tol fd{1e-7, 1e-6};
  EXPECT_TRUE(all_close(g.dx,
                        test::numerical_gradient(
                            [&](const std::vector<double>& v) { return objective(v, w1, b1); }, x),
                        fd));
  EXPECT_TRUE(all_close(g.dw1,
                        test::numerical_gradient(
                            [&](const std::vector<double>& v) { return objective(x, v, b1); }, w1),
                        fd));
  EXPECT_TRUE(all_close(g.db1,
                        test::numerical_gradient(
                            [&](const std::vector<double>& v) { return objective(x, w1, v); }, b1),
                        fd));
}

// ---- validation ---------------------------------------------------------------------------------

TEST(GemmEpilogueValidation, NamesTheBadArgument) {
  const auto& o = test::ops_on("cpu");
  Tensor a = Tensor::zeros({4, 3}, DType::f32), b = Tensor::zeros({3, 5}, DType::f32);
  Tensor c = Tensor::zeros({4, 5}, DType::f32), none;
  Tensor bias5 = Tensor::zeros({5}, DType::f32), bias4 = Tensor::zeros({4}, DType::f32);
  Tensor aux = Tensor::zeros({4, 5}, DType::f32), aux_bf = Tensor::zeros({4, 5}, DType::bf16);
  using E = GemmEpilogue;
  auto msg = [&](Tensor& cc, Tensor& ax, Tensor& db, const Tensor& bs, GemmEpilogueArgs g) {
    return test::error_message([&] { o.gemm_epilogue(cc, ax, db, a, b, bs, g); });
  };
  EXPECT_NE(msg(c, none, none, none, {.epilogue = E::bias}).find("needs a bias [5]"),
            std::string::npos);
  EXPECT_NE(msg(c, none, none, bias4, {.epilogue = E::bias}).find("bias [4]"), std::string::npos);
  EXPECT_NE(msg(c, none, none, bias5, {.epilogue = E::bias_gelu}).find("needs aux [4, 5]"),
            std::string::npos);
  EXPECT_NE(msg(c, aux_bf, none, bias5, {.epilogue = E::bias_gelu}).find("aux"), std::string::npos);
  EXPECT_NE(msg(c, none, none, none, {.epilogue = E::bgrad}).find("needs a dbias [4]"),
            std::string::npos);
  EXPECT_NE(msg(c, none, bias5, none, {.epilogue = E::bgrad}).find("expected [4]"),
            std::string::npos);
  EXPECT_NE(msg(c, none, none, bias5, {.epilogue = E::bias, .beta = 1}).find("beta 1"),
            std::string::npos);
  EXPECT_NE(msg(c, aux, none, bias5, {.epilogue = E::bias}).find("takes no aux"),
            std::string::npos);
  EXPECT_NE(msg(c, none, none, none, {.epilogue = static_cast<E>(9)}).find("unknown epilogue 9"),
            std::string::npos);
  Tensor a3 = Tensor::zeros({2, 4, 3}, DType::f32), b3 = Tensor::zeros({2, 3, 5}, DType::f32),
         c3 = Tensor::zeros({2, 4, 5}, DType::f32);
  EXPECT_NE(test::error_message([&] {
              o.gemm_epilogue(c3, none, none, a3, b3, bias5, {.epilogue = E::bias});
            }).find("rank 2"),
            std::string::npos);
}

}  // namespace
}  // namespace mg
