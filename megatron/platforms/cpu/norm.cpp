// CPU LayerNorm and RMSNorm over the last dim (x viewed as [N, H]), forward and backward.
//
// Gradient rule: parameter gradients accumulate (+=: dgamma, dbeta); activation gradients are
// written (=: dx).
//
// Forward saves per-row statistics in the compute type (f32, f64 for f64 x): LayerNorm mean and
// rstd = 1/sqrt(var + eps) with the biased (1/H) variance, computed in two passes for stability;
// RMSNorm rstd = 1/sqrt(mean(x^2) + eps). The applied weight is gamma, or (1 + gamma) with
// zero_centered_gamma. Backward, with xhat = normalised x and g = dy * weight:
//   LayerNorm dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   RMSNorm   dx = rstd * (g - xhat * mean(g * xhat))
//   dgamma += sum_n dy * xhat;  dbeta += sum_n dy.
// dgamma/dbeta sum over rows in fixed chunks (chunked_row_reduce), so they are bit-identical for
// any thread count; they may have another float dtype than x (f32 grads of bf16 params).
// Not here: fused residual add, dropout, or fp8 outputs.
#include <cmath>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

using ops::NormArgs;

DType stat_dtype(DType x) {
  return x == DType::f64 ? DType::f64 : DType::f32;
}

// x [N, H] (any leading shape); returns H.
int64_t check_x(const char* op, const Tensor& x) {
  check_float_host(op, "x", x);
  MG_CHECK(x.dim() >= 1 && x.size(-1) >= 1,
           op << ": x " << shape_str(x.shape()) << " needs a non-empty last dim to normalise");
  return x.size(-1);
}

// An activation-shaped tensor (y, dx, dy): x's dtype and element count, same last dim.
void check_like_x(const char* op, const char* name, const Tensor& t, const Tensor& x) {
  check_float_host(op, name, t);
  check_same_dtype(op, name, t, "x", x);
  MG_CHECK(t.numel() == x.numel() && t.dim() >= 1 && t.size(-1) == x.size(-1),
           op << ": " << name << " " << shape_str(t.shape()) << " does not match x "
              << shape_str(x.shape()));
}

// A parameter or its gradient: [H], any float dtype.
void check_param(const char* op, const char* name, const Tensor& t, int64_t h) {
  check_float_host(op, name, t);
  MG_CHECK(t.dim() == 1 && t.size(0) == h, op << ": " << name << " " << shape_str(t.shape())
                                              << " does not match x's last dim " << h);
}

// mean / rstd [N] in f32 (f64 for f64 x).
void check_stat(const char* op, const char* name, const Tensor& t, const Tensor& x, int64_t rows) {
  check_host(op, name, t);
  MG_CHECK(t.dtype() == stat_dtype(x.dtype()),
           op << ": " << name << " has dtype " << dtype_name(t.dtype()) << ", expected "
              << dtype_name(stat_dtype(x.dtype())) << " for x of " << dtype_name(x.dtype()));
  MG_CHECK(t.numel() == rows, op << ": " << name << " " << shape_str(t.shape()) << " has "
                                 << t.numel() << " elements, expected one per row of x "
                                 << shape_str(x.shape()) << " (" << rows << ")");
}

// The applied weight: gamma, or 1 + gamma for zero_centered_gamma.
template <typename Acc>
std::vector<Acc> applied_weight(const Tensor& gamma, const NormArgs& args, const char* op) {
  std::vector<Acc> w = to_acc_vector<Acc>(gamma, op);
  if (args.zero_centered_gamma)
    for (auto& v : w) v += Acc(1);
  return w;
}

// y [N, H], mean [N], rstd [N] <- x [N, H], gamma [H], beta [H] (optional)
void layernorm_fwd(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& gamma,
                   const Tensor& beta, const NormArgs& args) {
  const char* op = "layernorm_fwd";
  const int64_t h = check_x(op, x);
  const int64_t rows = x.numel() / h;
  check_like_x(op, "y", y, x);
  check_param(op, "gamma", gamma, h);
  if (beta.defined()) check_param(op, "beta", beta, h);
  check_stat(op, "mean", mean, x, rows);
  check_stat(op, "rstd", rstd, x, rows);
  MG_CHECK(args.eps >= 0.0f, op << ": eps " << args.eps << " is negative");
  dispatch_float(x.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    using Acc = compute_t<T>;
    const std::vector<Acc> w = applied_weight<Acc>(gamma, args, op);
    const std::vector<Acc> b = beta.defined() ? to_acc_vector<Acc>(beta, op) : std::vector<Acc>();
    const bool has_b = beta.defined();
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    Acc* mp = mean.data<Acc>();
    Acc* rp = rstd.data<Acc>();
    const Acc inv_h = Acc(1) / static_cast<Acc>(h);
    const Acc eps = args.eps;
#pragma omp parallel for schedule(static) if (x.numel() >= kParallelMinElements)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = xp + r * h;
      T* yr = yp + r * h;
      Acc s = 0;
      for (int64_t j = 0; j < h; ++j) s += to_f32(xr[j]);
      const Acc mu = s * inv_h;
      Acc ss = 0;
      for (int64_t j = 0; j < h; ++j) {
        const Acc d = to_f32(xr[j]) - mu;
        ss += d * d;
      }
      const Acc rs = Acc(1) / std::sqrt(ss * inv_h + eps);
      mp[r] = mu;
      rp[r] = rs;
      for (int64_t j = 0; j < h; ++j) {
        const Acc v = (to_f32(xr[j]) - mu) * rs * w[j];
        yr[j] = store<T>(has_b ? v + b[j] : v);
      }
    }
  });
}

// dx [N, H] =, dgamma [H] +=, dbeta [H] += (optional) <- dy, x [N, H], mean, rstd [N], gamma [H]
void layernorm_bwd(Tensor& dx, Tensor& dgamma, Tensor& dbeta, const Tensor& dy, const Tensor& x,
                   const Tensor& mean, const Tensor& rstd, const Tensor& gamma,
                   const NormArgs& args) {
  const char* op = "layernorm_bwd";
  const int64_t h = check_x(op, x);
  const int64_t rows = x.numel() / h;
  check_like_x(op, "dx", dx, x);
  check_like_x(op, "dy", dy, x);
  check_param(op, "gamma", gamma, h);
  check_param(op, "dgamma", dgamma, h);
  if (dbeta.defined()) check_param(op, "dbeta", dbeta, h);
  check_stat(op, "mean", mean, x, rows);
  check_stat(op, "rstd", rstd, x, rows);
  dispatch_float(x.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    using Acc = compute_t<T>;
    const std::vector<Acc> w = applied_weight<Acc>(gamma, args, op);
    const bool has_b = dbeta.defined();
    const T* xp = x.data<T>();
    const T* dyp = dy.data<T>();
    T* dxp = dx.data<T>();
    const Acc* mp = mean.data<Acc>();
    const Acc* rp = rstd.data<Acc>();
    const Acc inv_h = Acc(1) / static_cast<Acc>(h);
    // partial layout: [dgamma (H) | dbeta (H, when wanted)]
    std::vector<Acc> sums;
    chunked_row_reduce<Acc>(rows, has_b ? 2 * h : h, sums, [&](int64_t r0, int64_t r1, Acc* part) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = xp + r * h;
        const T* dyr = dyp + r * h;
        T* dxr = dxp + r * h;
        const Acc mu = mp[r], rs = rp[r];
        Acc sum_g = 0, sum_gx = 0;
        for (int64_t j = 0; j < h; ++j) {
          const Acc xh = (to_f32(xr[j]) - mu) * rs;
          const Acc d = to_f32(dyr[j]);
          const Acc g = d * w[j];
          sum_g += g;
          sum_gx += g * xh;
          part[j] += d * xh;
          if (has_b) part[h + j] += d;
        }
        const Acc mg = sum_g * inv_h, mgx = sum_gx * inv_h;
        for (int64_t j = 0; j < h; ++j) {
          const Acc xh = (to_f32(xr[j]) - mu) * rs;
          const Acc g = to_f32(dyr[j]) * w[j];
          dxr[j] = store<T>(rs * (g - mg - xh * mgx));
        }
      }
    });
    std::vector<Acc> dg(sums.begin(), sums.begin() + h);
    accumulate_into(dgamma, dg, op);
    if (has_b) {
      std::vector<Acc> db(sums.begin() + h, sums.end());
      accumulate_into(dbeta, db, op);
    }
  });
}

// y [N, H], rstd [N] <- x [N, H], gamma [H]
void rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& gamma,
                 const NormArgs& args) {
  const char* op = "rmsnorm_fwd";
  const int64_t h = check_x(op, x);
  const int64_t rows = x.numel() / h;
  check_like_x(op, "y", y, x);
  check_param(op, "gamma", gamma, h);
  check_stat(op, "rstd", rstd, x, rows);
  MG_CHECK(args.eps >= 0.0f, op << ": eps " << args.eps << " is negative");
  dispatch_float(x.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    using Acc = compute_t<T>;
    const std::vector<Acc> w = applied_weight<Acc>(gamma, args, op);
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
    Acc* rp = rstd.data<Acc>();
    const Acc inv_h = Acc(1) / static_cast<Acc>(h);
    const Acc eps = args.eps;
#pragma omp parallel for schedule(static) if (x.numel() >= kParallelMinElements)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = xp + r * h;
      T* yr = yp + r * h;
      Acc ss = 0;
      for (int64_t j = 0; j < h; ++j) {
        const Acc v = to_f32(xr[j]);
        ss += v * v;
      }
      const Acc rs = Acc(1) / std::sqrt(ss * inv_h + eps);
      rp[r] = rs;
      for (int64_t j = 0; j < h; ++j) yr[j] = store<T>(to_f32(xr[j]) * rs * w[j]);
    }
  });
}

// dx [N, H] =, dgamma [H] += <- dy, x [N, H], rstd [N], gamma [H]
void rmsnorm_bwd(Tensor& dx, Tensor& dgamma, const Tensor& dy, const Tensor& x, const Tensor& rstd,
                 const Tensor& gamma, const NormArgs& args) {
  const char* op = "rmsnorm_bwd";
  const int64_t h = check_x(op, x);
  const int64_t rows = x.numel() / h;
  check_like_x(op, "dx", dx, x);
  check_like_x(op, "dy", dy, x);
  check_param(op, "gamma", gamma, h);
  check_param(op, "dgamma", dgamma, h);
  check_stat(op, "rstd", rstd, x, rows);
  dispatch_float(x.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    using Acc = compute_t<T>;
    const std::vector<Acc> w = applied_weight<Acc>(gamma, args, op);
    const T* xp = x.data<T>();
    const T* dyp = dy.data<T>();
    T* dxp = dx.data<T>();
    const Acc* rp = rstd.data<Acc>();
    const Acc inv_h = Acc(1) / static_cast<Acc>(h);
    std::vector<Acc> dg;
    chunked_row_reduce<Acc>(rows, h, dg, [&](int64_t r0, int64_t r1, Acc* part) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = xp + r * h;
        const T* dyr = dyp + r * h;
        T* dxr = dxp + r * h;
        const Acc rs = rp[r];
        Acc sum_gx = 0;
        for (int64_t j = 0; j < h; ++j) {
          const Acc xh = to_f32(xr[j]) * rs;
          const Acc d = to_f32(dyr[j]);
          sum_gx += d * w[j] * xh;
          part[j] += d * xh;
        }
        const Acc mgx = sum_gx * inv_h;
        for (int64_t j = 0; j < h; ++j) {
          const Acc xh = to_f32(xr[j]) * rs;
          dxr[j] = store<T>(rs * (to_f32(dyr[j]) * w[j] - xh * mgx));
        }
      }
    });
    accumulate_into(dgamma, dg, op);
  });
}

}  // namespace

void register_norm_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::layernorm_fwd>("cpu", &layernorm_fwd, "cpu:omp");
  r.register_op<ops::OpId::layernorm_bwd>("cpu", &layernorm_bwd, "cpu:omp");
  r.register_op<ops::OpId::rmsnorm_fwd>("cpu", &rmsnorm_fwd, "cpu:omp");
  r.register_op<ops::OpId::rmsnorm_bwd>("cpu", &rmsnorm_bwd, "cpu:omp");
}

}  // namespace mg::platforms::cpu
