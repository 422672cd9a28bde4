// The fused residual-path norm ops (norm.cpp): bias_dropout_add_norm_fwd and norm_bwd_add.
//   - on the CPU they are BIT-identical to the unfused sequences they replace
//     (bias_dropout_add_fwd + layernorm_fwd / rmsnorm_fwd; layernorm_bwd / rmsnorm_bwd + axpy), for
//     every dtype, LayerNorm and RMSNorm, bias and beta on/off, zero-centred gamma, dropout on/off,
//     with poisoned (NaN) outputs;
//   - every platform agrees with a naive f64 reference (the unfused ops' conformance tests in
//     norm_test.cpp check those against the same kind of reference);
//   - their gradients (fused forward, then norm_bwd_add + bias_dropout_add_bwd) match central
//     finite differences in f64, through a fixed dropout mask;
//   - argument validation names the bad argument.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "megatron/core/random/philox.h"
#include "tests/unit/test_util.h"

namespace mg {
namespace {

using ops::DropoutArgs;
using ops::NormArgs;
using ops::NormKind;
using test::all_close;
using test::make_tensor;
using test::random_values;
using test::to_doubles;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

DType stat_dtype(DType x) {
  return x == DType::f64 ? DType::f64 : DType::f32;
}

// Odd shapes: H = 1, primes, rows crossing several reduction chunks, a row wider than a block.
const std::vector<Shape> kShapes = {{5, 1}, {3, 7}, {3, 2, 13}, {100, 31}, {3, 1031}};

const char* kind_name(NormKind k) {
  return k == NormKind::layernorm ? "layernorm" : "rmsnorm";
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

Tensor nan_tensor(const Shape& shape, DType dtype, Device dev = Device::cpu()) {
  return make_tensor(std::vector<double>(static_cast<std::size_t>(shape_numel(shape)), kNaN), shape,
                     dtype, dev)
      .t;
}

// One configuration of the fused forward.
struct Case {
  NormKind kind;
  bool with_bias, with_beta, zc;
  float p;
  std::string str(const Shape& s, DType t) const {
    return std::string(kind_name(kind)) + " " + shape_str(s) + " " + std::string(dtype_name(t)) +
           (with_bias ? " bias" : "") + (with_beta ? " beta" : "") + (zc ? " zero-centred" : "") +
           " p=" + std::to_string(p);
  }
};

std::vector<Case> all_cases() {
  std::vector<Case> cs;
  for (NormKind k : {NormKind::layernorm, NormKind::rmsnorm})
    for (bool bias : {true, false})
      for (bool beta : {true, false})
        for (bool zc : {false, true})
          for (float p : {0.0f, 0.3f}) {
            if (k == NormKind::rmsnorm && beta) continue;
            cs.push_back({k, bias, beta, zc, p});
          }
  return cs;
}

// ---- fused == unfused, bit for bit (cpu) --------------------------------------------------------

class FusedNormCpu : public ::testing::TestWithParam<DType> {};

TEST_P(FusedNormCpu, ForwardBitIdenticalToBiasDropoutAddThenNorm) {
  const DType dtype = GetParam();
  const auto& ops = test::ops_on("cpu");
  const Device cpu = Device::cpu();
  for (const Shape& shape : kShapes) {
    const int64_t h = shape.back(), n = shape_numel(shape), rows = n / h;
    for (const Case& c : all_cases()) {
      const std::string ctx = c.str(shape, dtype);
      NormArgs args;
      args.zero_centered_gamma = c.zc;
      args.eps = 1e-5f;
      const DropoutArgs d{c.p, 1234, 4096 + 3};  // an offset that is not a Philox block boundary
      auto x = make_tensor(random_values(n, 1 + h, 0.1, 2.0), shape, dtype, cpu);
      auto res = make_tensor(random_values(n, 2 + h, 0.1, 2.0), shape, dtype, cpu);
      auto bias = make_tensor(random_values(h, 3 + h), {h}, dtype, cpu);
      auto gamma = make_tensor(random_values(h, 4 + h), {h}, dtype, cpu);
      auto beta = make_tensor(random_values(h, 5 + h), {h}, dtype, cpu);
      const Tensor b = c.with_bias ? bias.t : Tensor();
      const Tensor bt = c.with_beta ? beta.t : Tensor();
      const bool ln = c.kind == NormKind::layernorm;
      // unfused
      Tensor sum_u = nan_tensor(shape, dtype), y_u = nan_tensor(shape, dtype);
      Tensor mean_u = nan_tensor({rows}, stat_dtype(dtype)),
             rstd_u = nan_tensor({rows}, stat_dtype(dtype));
      ops.bias_dropout_add_fwd(sum_u, x.t, b, res.t, d);
      if (ln)
        ops.layernorm_fwd(y_u, mean_u, rstd_u, sum_u, gamma.t, bt, args);
      else
        ops.rmsnorm_fwd(y_u, rstd_u, sum_u, gamma.t, args);
      // fused
      Tensor sum_f = nan_tensor(shape, dtype), y_f = nan_tensor(shape, dtype);
      Tensor mean_f = ln ? nan_tensor({rows}, stat_dtype(dtype)) : Tensor();
      Tensor rstd_f = nan_tensor({rows}, stat_dtype(dtype));
      ops.bias_dropout_add_norm_fwd(y_f, sum_f, mean_f, rstd_f, x.t, b, res.t, gamma.t, bt, d, args,
                                    c.kind);
      EXPECT_TRUE(same_bits(sum_f, sum_u)) << ctx << ": sum";
      EXPECT_TRUE(same_bits(y_f, y_u)) << ctx << ": y";
      EXPECT_TRUE(same_bits(rstd_f, rstd_u)) << ctx << ": rstd";
      if (ln) {
        EXPECT_TRUE(same_bits(mean_f, mean_u)) << ctx << ": mean";
      }
      // The outputs were really written (no NaN left from the poison).
      for (double v : to_doubles(y_f)) ASSERT_FALSE(std::isnan(v)) << ctx;
    }
  }
}

TEST_P(FusedNormCpu, BackwardBitIdenticalToNormBwdThenAxpy) {
  const DType dtype = GetParam();
  const auto& ops = test::ops_on("cpu");
  const Device cpu = Device::cpu();
  for (const Shape& shape : kShapes) {
    const int64_t h = shape.back(), n = shape_numel(shape), rows = n / h;
    for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
      const bool ln = kind == NormKind::layernorm;
      for (bool with_dbeta : {true, false}) {
        if (!ln && with_dbeta) continue;
        for (bool zc : {false, true}) {
          for (bool with_dres : {true, false}) {
            for (DType gdt : {dtype, DType::f32}) {
              const std::string ctx = std::string(kind_name(kind)) + " " + shape_str(shape) + " " +
                                      std::string(dtype_name(dtype)) +
                                      (with_dbeta ? " dbeta" : "") + (zc ? " zero-centred" : "") +
                                      (with_dres ? " dresidual" : "") + " grads " +
                                      std::string(dtype_name(gdt));
              NormArgs args;
              args.zero_centered_gamma = zc;
              auto x = make_tensor(random_values(n, 11 + h, 0.1, 2.0), shape, dtype, cpu);
              auto dy = make_tensor(random_values(n, 12 + h), shape, dtype, cpu);
              auto dres = make_tensor(random_values(n, 13 + h), shape, dtype, cpu);
              auto gamma = make_tensor(random_values(h, 14 + h), {h}, dtype, cpu);
              // The statistics as the forward saves them.
              Tensor y = Tensor::empty(shape, dtype);
              Tensor mean = ln ? Tensor::empty({rows}, stat_dtype(dtype)) : Tensor();
              Tensor rstd = Tensor::empty({rows}, stat_dtype(dtype));
              if (ln)
                ops.layernorm_fwd(y, mean, rstd, x.t, gamma.t, Tensor(), args);
              else
                ops.rmsnorm_fwd(y, rstd, x.t, gamma.t, args);
              const auto dg0 = random_values(h, 15 + h), db0 = random_values(h, 16 + h);
              // unfused
              Tensor dx_u = nan_tensor(shape, dtype);
              Tensor dg_u = make_tensor(dg0, {h}, gdt, cpu).t,
                     db_u = make_tensor(db0, {h}, gdt, cpu).t;
              Tensor db_arg_u = with_dbeta ? db_u : Tensor();
              if (ln)
                ops.layernorm_bwd(dx_u, dg_u, db_arg_u, dy.t, x.t, mean, rstd, gamma.t, args);
              else
                ops.rmsnorm_bwd(dx_u, dg_u, dy.t, x.t, rstd, gamma.t, args);
              if (with_dres) ops.axpy(dx_u, dres.t, 1.0f);
              // fused
              Tensor dx_f = nan_tensor(shape, dtype);
              Tensor dg_f = make_tensor(dg0, {h}, gdt, cpu).t,
                     db_f = make_tensor(db0, {h}, gdt, cpu).t;
              Tensor db_arg_f = with_dbeta ? db_f : Tensor();
              ops.norm_bwd_add(dx_f, dg_f, db_arg_f, dy.t, with_dres ? dres.t : Tensor(), x.t, mean,
                               rstd, gamma.t, args, kind);
              EXPECT_TRUE(same_bits(dx_f, dx_u)) << ctx << ": dx";
              EXPECT_TRUE(same_bits(dg_f, dg_u)) << ctx << ": dgamma";
              EXPECT_TRUE(same_bits(db_f, db_u)) << ctx << ": dbeta";
              for (double v : to_doubles(dx_f)) ASSERT_FALSE(std::isnan(v)) << ctx;
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, FusedNormCpu, ::testing::ValuesIn(test::kKernelDTypes),
                         [](const ::testing::TestParamInfo<DType>& i) {
                           return std::string(dtype_name(i.param));
                         });

// ---- every platform against a naive f64 reference -----------------------------------------------

// The reference forward in f64: sum = residual + dropout(x + bias) (unrounded), and the norm of
// `stored`, the op's own sum output (the op normalises the stored, rounded values; that the
// stored sum is the reference sum rounded is checked separately).
struct RefFwd {
  std::vector<double> sum, y, mean, rstd;
};
RefFwd ref_fwd(const std::vector<double>& x, const std::vector<double>& bias,
               const std::vector<double>& res, const std::vector<double>& stored,
               const std::vector<double>& gamma, const std::vector<double>& beta,
               const DropoutArgs& d, int64_t rows, int64_t h, double eps, bool zc, bool rms) {
  RefFwd r;
  r.sum.resize(x.size());
  const double scale = 1.0 / (1.0 - static_cast<double>(d.p));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const bool keep = d.p == 0.0f || random::dropout_keep(d.seed, d.offset + i, d.p);
    const double v = keep ? (x[i] + (bias.empty() ? 0.0 : bias[i % h])) * scale : 0.0;
    r.sum[i] = res[i] + v;
  }
  r.y.resize(x.size());
  for (int64_t n = 0; n < rows; ++n) {
    const double* xr = stored.data() + n * h;
    double mu = 0;
    if (!rms) {
      for (int64_t j = 0; j < h; ++j) mu += xr[j];
      mu /= h;
    }
    double var = 0;
    for (int64_t j = 0; j < h; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    const double rs = 1.0 / std::sqrt(var / h + eps);
    r.mean.push_back(mu);
    r.rstd.push_back(rs);
    for (int64_t j = 0; j < h; ++j)
      r.y[n * h + j] =
          (xr[j] - mu) * rs * (gamma[j] + (zc ? 1.0 : 0.0)) + (beta.empty() ? 0.0 : beta[j]);
  }
  return r;
}

class FusedNormOps : public ::testing::TestWithParam<test::PlatformDType> {};

TEST_P(FusedNormOps, ForwardMatchesReference) {
  const auto& [platform, dtype] = GetParam();
  MG_SKIP_IF_UNAVAILABLE(platform);
  const Device dev = test::device_for(platform);
  const auto& ops = test::ops_on(platform);
  for (const Shape& shape : kShapes) {
    const int64_t h = shape.back(), n = shape_numel(shape), rows = n / h;
    for (const Case& c : all_cases()) {
      const std::string ctx = c.str(shape, dtype);
      NormArgs args;
      args.zero_centered_gamma = c.zc;
      const DropoutArgs d{c.p, 99, 17};
      auto x = make_tensor(random_values(n, 21 + h, 0.1, 2.0), shape, dtype, dev);
      auto res = make_tensor(random_values(n, 22 + h, 0.1, 2.0), shape, dtype, dev);
      auto bias = make_tensor(random_values(h, 23 + h), {h}, dtype, dev);
      auto gamma = make_tensor(random_values(h, 24 + h), {h}, dtype, dev);
      auto beta = make_tensor(random_values(h, 25 + h), {h}, dtype, dev);
      const bool ln = c.kind == NormKind::layernorm;
      Tensor y = nan_tensor(shape, dtype, dev), sum = nan_tensor(shape, dtype, dev);
      Tensor mean = ln ? nan_tensor({rows}, stat_dtype(dtype), dev) : Tensor();
      Tensor rstd = nan_tensor({rows}, stat_dtype(dtype), dev);
      ops.bias_dropout_add_norm_fwd(y, sum, mean, rstd, x.t, c.with_bias ? bias.t : Tensor(), res.t,
                                    gamma.t, c.with_beta ? beta.t : Tensor(), d, args, c.kind);
      const auto ref = ref_fwd(x.rounded, c.with_bias ? bias.rounded : std::vector<double>(),
                               res.rounded, to_doubles(sum), gamma.rounded,
                               c.with_beta ? beta.rounded : std::vector<double>(), d, rows, h,
                               args.eps, c.zc, !ln);
      EXPECT_TRUE(all_close(to_doubles(sum), ref.sum, test::tolerance(dtype))) << ctx << ": sum";
      EXPECT_TRUE(all_close(to_doubles(y), ref.y, test::tolerance(dtype))) << ctx << ": y";
      EXPECT_TRUE(all_close(to_doubles(rstd), ref.rstd, test::tolerance(stat_dtype(dtype))))
          << ctx << ": rstd";
      if (ln) {
        EXPECT_TRUE(all_close(to_doubles(mean), ref.mean, test::tolerance(stat_dtype(dtype))))
            << ctx << ": mean";
      }
    }
  }
}

MG_INSTANTIATE_OP_TEST(FusedNormOps);

// ---- f64 gradients against finite differences (cpu) ---------------------------------------------

double weighted_sum(const Tensor& t, const std::vector<double>& w) {
  const auto v = to_doubles(t);
  double s = 0;
  for (std::size_t i = 0; i < v.size(); ++i) s += v[i] * w[i];
  return s;
}

TEST(FusedNormGradient, MatchesFiniteDifferences) {
  const auto& ops = test::ops_on("cpu");
  const int64_t rows = 3, h = 7, n = rows * h;
  const DType f64 = DType::f64;
  using V = std::vector<double>;
  for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
    for (bool zc : {false, true}) {
      const bool ln = kind == NormKind::layernorm;
      const std::string ctx = std::string(kind_name(kind)) + (zc ? " zero-centred" : "");
      NormArgs args;
      args.zero_centered_gamma = zc;
      const DropoutArgs d{0.25f, 7, 3};  // a fixed mask: the loss is smooth in every input
      const V x0 = random_values(n, 61), r0 = random_values(n, 62), bias0 = random_values(h, 63),
              g0 = random_values(h, 64), beta0 = random_values(h, 65);
      const V wy = random_values(n, 66), ws = random_values(n, 67);
      Tensor mean = ln ? Tensor::empty({rows}, f64) : Tensor(), rstd = Tensor::empty({rows}, f64);
      Tensor sum = Tensor::empty({rows, h}, f64);
      // loss = sum(wy * y) + sum(ws * sum): the sum output also feeds later work (the residual).
      auto loss = [&](const V& xv, const V& rv, const V& bv, const V& gv, const V& btv) {
        Tensor y = Tensor::empty({rows, h}, f64);
        ops.bias_dropout_add_norm_fwd(
            y, sum, mean, rstd, Tensor::from_vector(xv, {rows, h}, f64),
            Tensor::from_vector(bv, {h}, f64), Tensor::from_vector(rv, {rows, h}, f64),
            Tensor::from_vector(gv, {h}, f64), ln ? Tensor::from_vector(btv, {h}, f64) : Tensor(),
            d, args, kind);
        return weighted_sum(y, wy) + weighted_sum(sum, ws);
      };
      loss(x0, r0, bias0, g0, beta0);  // leaves sum, mean, rstd of the point
      // Backward: dsum = norm_bwd(wy) + ws; dx = dropout'(dsum), dbias = sum_n dx; dres = dsum.
      Tensor dsum = Tensor::empty({rows, h}, f64);
      Tensor dgamma = Tensor::zeros({h}, f64), dbeta = Tensor::zeros({h}, f64);
      Tensor dbeta_arg = ln ? dbeta : Tensor();
      ops.norm_bwd_add(dsum, dgamma, dbeta_arg, Tensor::from_vector(wy, {rows, h}, f64),
                       Tensor::from_vector(ws, {rows, h}, f64), sum, mean, rstd,
                       Tensor::from_vector(g0, {h}, f64), args, kind);
      Tensor dx = Tensor::empty({rows, h}, f64), dbias = Tensor::zeros({h}, f64);
      ops.bias_dropout_add_bwd(dx, dbias, dsum, d);
      const test::Tol tol{1e-7, 1e-6};
      EXPECT_TRUE(all_close(
          to_doubles(dx),
          test::numerical_gradient([&](const V& v) { return loss(v, r0, bias0, g0, beta0); }, x0),
          tol))
          << ctx << ": dx";
      EXPECT_TRUE(all_close(
          to_doubles(dsum),
          test::numerical_gradient([&](const V& v) { return loss(x0, v, bias0, g0, beta0); }, r0),
          tol))
          << ctx << ": dresidual";
      EXPECT_TRUE(all_close(
          to_doubles(dbias),
          test::numerical_gradient([&](const V& v) { return loss(x0, r0, v, g0, beta0); }, bias0),
          tol))
          << ctx << ": dbias";
      EXPECT_TRUE(all_close(
          to_doubles(dgamma),
          test::numerical_gradient([&](const V& v) { return loss(x0, r0, bias0, v, beta0); }, g0),
          tol))
          << ctx << ": dgamma";
      if (ln) {
        EXPECT_TRUE(all_close(
            to_doubles(dbeta),
            test::numerical_gradient([&](const V& v) { return loss(x0, r0, bias0, g0, v); }, beta0),
            tol))
            << ctx << ": dbeta";
      }
    }
  }
}

// ---- validation (cpu) ---------------------------------------------------------------------------

TEST(FusedNormValidation, NamesTheBadArgument) {
  const auto& ops = test::ops_on("cpu");
  const DType f32 = DType::f32;
  Tensor x = Tensor::zeros({4, 8}, f32), res = Tensor::zeros({4, 8}, f32);
  Tensor y = Tensor::zeros({4, 8}, f32), sum = Tensor::zeros({4, 8}, f32);
  Tensor mean = Tensor::zeros({4}, f32), rstd = Tensor::zeros({4}, f32);
  Tensor gamma = Tensor::zeros({8}, f32), beta = Tensor::zeros({8}, f32), none;
  const DropoutArgs d{};
  const NormArgs a{};
  auto fwd_error = [&](const Tensor& yy, const Tensor& ss, const Tensor& mm, const Tensor& bias,
                       const Tensor& rr, const Tensor& bt, DropoutArgs dd, NormKind k) {
    return test::error_message([&] {
      Tensor y2 = yy, s2 = ss, m2 = mm, r2 = rstd;
      ops.bias_dropout_add_norm_fwd(y2, s2, m2, r2, x, bias, rr, gamma, bt, dd, a, k);
    });
  };
  EXPECT_NE(fwd_error(y, sum, mean, none, res, beta, d, NormKind::rmsnorm)
                .find("must be undefined for rmsnorm (it has no mean)"),
            std::string::npos);
  EXPECT_NE(fwd_error(y, sum, none, none, res, beta, d, NormKind::rmsnorm).find("beta"),
            std::string::npos);
  EXPECT_NE(fwd_error(y, sum, mean, Tensor::zeros({7}, f32), res, beta, d, NormKind::layernorm)
                .find("bias [7] does not match x's last dim 8"),
            std::string::npos);
  EXPECT_NE(fwd_error(y, y, mean, none, res, beta, d, NormKind::layernorm).find("overlaps sum"),
            std::string::npos);
  EXPECT_NE(fwd_error(y, sum, mean, none, Tensor::zeros({4, 7}, f32), beta, d, NormKind::layernorm)
                .find("residual"),
            std::string::npos);
  EXPECT_NE(fwd_error(y, sum, mean, none, res, beta, DropoutArgs{1.0f, 0, 0}, NormKind::layernorm)
                .find("p must be in [0, 1), got 1"),
            std::string::npos);
  EXPECT_NE(fwd_error(y, sum, none, none, res, beta, d, NormKind::layernorm).find("mean"),
            std::string::npos);
  // backward
  Tensor dx = Tensor::zeros({4, 8}, f32), dg = Tensor::zeros({8}, f32),
         db = Tensor::zeros({8}, f32);
  EXPECT_NE(test::error_message([&] {
              ops.norm_bwd_add(dx, dg, db, y, Tensor::zeros({4, 8}, DType::bf16), x, mean, rstd,
                               gamma, a, NormKind::layernorm);
            }).find("dresidual"),
            std::string::npos);
  EXPECT_NE(test::error_message([&] {
              ops.norm_bwd_add(dx, dg, db, y, dx, x, mean, rstd, gamma, a, NormKind::layernorm);
            }).find("overlaps dresidual"),
            std::string::npos);
  EXPECT_NE(test::error_message([&] {
              ops.norm_bwd_add(dx, dg, db, y, res, x, none, rstd, gamma, a, NormKind::rmsnorm);
            }).find("dbeta"),
            std::string::npos);
  EXPECT_NE(test::error_message([&] {
              ops.norm_bwd_add(dx, dg, none, y, res, x, none, rstd, gamma, a, NormKind::layernorm);
            }).find("mean"),
            std::string::npos);
}

}  // namespace
}  // namespace mg
