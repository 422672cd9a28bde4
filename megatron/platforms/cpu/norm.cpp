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
  const ops::NormDims nd =
      ops::validate_layernorm_fwd(kOnHost, y, mean, rstd, x, gamma, beta, args);
  const int64_t rows = nd.rows, h = nd.h;
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
  const ops::NormDims nd =
      ops::validate_layernorm_bwd(kOnHost, dx, dgamma, dbeta, dy, x, mean, rstd, gamma);
  const int64_t rows = nd.rows, h = nd.h;
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
  const ops::NormDims nd = ops::validate_rmsnorm_fwd(kOnHost, y, rstd, x, gamma, args);
  const int64_t rows = nd.rows, h = nd.h;
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
  const ops::NormDims nd = ops::validate_rmsnorm_bwd(kOnHost, dx, dgamma, dy, x, rstd, gamma);
  const int64_t rows = nd.rows, h = nd.h;
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
