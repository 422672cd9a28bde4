// CPU LayerNorm and RMSNorm over the last dim (x viewed as [N, H]), forward and backward, and
// their fusions with the residual path of a pre-norm transformer layer:
//   bias_dropout_add_norm_fwd: sum = residual + dropout(x + bias), stored in x's dtype, then
//                              y = norm(sum) (the attention-BDA + pre_mlp_layernorm pair)
//   norm_bwd_add:              dx = norm_bwd(dy) + dresidual (the norm's dx + the residual grad)
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
//
// The fused ops are defined as the unfused sequences, bit for bit, for every dtype:
//   bias_dropout_add_norm_fwd == bias_dropout_add_fwd (sum) + layernorm_fwd / rmsnorm_fwd (sum):
//     the sum row is rounded to the storage dtype first and the statistics are computed from the
//     rounded values, by the same non-inlined row code (dropout_util.h's bias_dropout_add_range,
//     layernorm_row / rmsnorm_row here); dropout element i is the flat index of x, as dropout_fwd.
//   norm_bwd_add == layernorm_bwd / rmsnorm_bwd + axpy(dx, dresidual, 1):
//     dx = store(to_f32(store(norm dx)) + to_f32(dresidual)), i.e. the norm's dx is rounded to
//     the storage dtype BEFORE the residual gradient is added (a second rounding for bf16/f16;
//     none for f32/f64). The CUDA kernels (norm.cu) implement the same definition.
// Not here: fp8 outputs; the MLP-BDA + next layer's input norm fusion.
#include <cmath>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cpu/dropout_util.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

using ops::NormArgs;
using ops::NormKind;

// The applied weight: gamma, or 1 + gamma for zero_centered_gamma.
template <typename Acc>
std::vector<Acc> applied_weight(const Tensor& gamma, const NormArgs& args, const char* op) {
  std::vector<Acc> w = to_acc_vector<Acc>(gamma, op);
  if (args.zero_centered_gamma)
    for (auto& v : w) v += Acc(1);
  return w;
}

// ---- row kernels -------------------------------------------------------------------------------
// One row each, shared by the unfused ops and the fused ones. Not inlined: every caller runs the
// same machine code (same rounding, same FMA contraction), which is what makes the fused ops
// bit-identical to the unfused sequences.

// yr [H], *mean, *rstd <- xr [H]; w the applied weight, b the bias (null: none).
template <typename T, typename Acc>
[[gnu::noinline]] void layernorm_row(T* yr, Acc* mean, Acc* rstd, const T* xr, const Acc* w,
                                     const Acc* b, int64_t h, Acc eps) {
  const Acc inv_h = Acc(1) / static_cast<Acc>(h);
  Acc s = 0;
  for (int64_t j = 0; j < h; ++j) s += to_f32(xr[j]);
  const Acc mu = s * inv_h;
  Acc ss = 0;
  for (int64_t j = 0; j < h; ++j) {
    const Acc d = to_f32(xr[j]) - mu;
    ss += d * d;
  }
  const Acc rs = Acc(1) / std::sqrt(ss * inv_h + eps);
  *mean = mu;
  *rstd = rs;
  for (int64_t j = 0; j < h; ++j) {
    const Acc v = (to_f32(xr[j]) - mu) * rs * w[j];
    yr[j] = store<T>(b ? v + b[j] : v);
  }
}

// yr [H], *rstd <- xr [H]; w the applied weight.
template <typename T, typename Acc>
[[gnu::noinline]] void rmsnorm_row(T* yr, Acc* rstd, const T* xr, const Acc* w, int64_t h,
                                   Acc eps) {
  const Acc inv_h = Acc(1) / static_cast<Acc>(h);
  Acc ss = 0;
  for (int64_t j = 0; j < h; ++j) {
    const Acc v = to_f32(xr[j]);
    ss += v * v;
  }
  const Acc rs = Acc(1) / std::sqrt(ss * inv_h + eps);
  *rstd = rs;
  for (int64_t j = 0; j < h; ++j) yr[j] = store<T>(to_f32(xr[j]) * rs * w[j]);
}

// dxr [H] =, part [H] (dgamma) and part[H..2H) (dbeta, when has_b) += <- dyr, xr [H], the row's
// mean (layernorm; ignored for rmsnorm) and rstd. dres (null: none) is then added to the stored
// dx: dx = store(to_f32(store(norm dx)) + dres), the rounding of layernorm_bwd + axpy. The add is a
// separate pass over the stored row so that it is never contracted into the norm's last multiply.
template <NormKind kKind, typename T, typename Acc>
[[gnu::noinline]] void norm_bwd_row(T* dxr, Acc* part, bool has_b, const T* dyr, const T* dres,
                                    const T* xr, Acc mu, Acc rs, const Acc* w, int64_t h) {
  const Acc inv_h = Acc(1) / static_cast<Acc>(h);
  if constexpr (kKind == NormKind::layernorm) {
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
  } else {
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
  if (dres)
    for (int64_t j = 0; j < h; ++j) dxr[j] = store<T>(to_f32(dxr[j]) + to_f32(dres[j]));
}

// ---- the ops ------------------------------------------------------------------------------------

// y [N, H] = norm(x [N, H]); mean [N] (layernorm), rstd [N]. With `bda`, x is first written as
// sum = residual + dropout(bda_x + bias) (bias_dropout_add_range, row by row) and y = norm(sum).
struct BdaInputs {
  Tensor* sum;  // the norm's input x, written here first
  const Tensor* x;
  const Tensor* bias;
  const Tensor* residual;
  const ops::DropoutArgs* dropout;
};

void norm_fwd(const char* op, NormKind kind, Tensor& y, Tensor* mean, Tensor& rstd, const Tensor& x,
              const Tensor& gamma, const Tensor& beta, const NormArgs& args, const BdaInputs* bda,
              int64_t rows, int64_t h) {
  dispatch_float(x.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    using Acc = compute_t<T>;
    const std::vector<Acc> w = applied_weight<Acc>(gamma, args, op);
    const std::vector<Acc> b = beta.defined() ? to_acc_vector<Acc>(beta, op) : std::vector<Acc>();
    const Acc* bp = beta.defined() ? b.data() : nullptr;
    // Fused: x is the sum output, each row written just before it is normalised.
    T* xw = bda ? bda->sum->data<T>() : nullptr;
    const T* xp = x.data<T>();
    const T* bx = bda ? bda->x->data<T>() : nullptr;
    const T* bb = bda && bda->bias->defined() ? bda->bias->data<T>() : nullptr;
    const T* br = bda ? bda->residual->data<T>() : nullptr;
    T* yp = y.data<T>();
    Acc* mp = mean ? mean->data<Acc>() : nullptr;
    Acc* rp = rstd.data<Acc>();
    const Acc eps = args.eps;
#pragma omp parallel for schedule(static) if (x.numel() >= kParallelMinElements)
    for (int64_t r = 0; r < rows; ++r) {
      if (bda) bias_dropout_add_range(xw, bx, bb, br, h, *bda->dropout, r * h, (r + 1) * h);
      if (kind == NormKind::layernorm)
        layernorm_row(yp + r * h, mp + r, rp + r, xp + r * h, w.data(), bp, h, eps);
      else
        rmsnorm_row(yp + r * h, rp + r, xp + r * h, w.data(), h, eps);
    }
  });
}

// dx [N, H] = norm_bwd(dy) (+ dres), dgamma [H] +=, dbeta [H] += (optional).
void norm_bwd(const char* op, NormKind kind, Tensor& dx, Tensor& dgamma, Tensor* dbeta,
              const Tensor& dy, const Tensor* dres, const Tensor& x, const Tensor* mean,
              const Tensor& rstd, const Tensor& gamma, const NormArgs& args, int64_t rows,
              int64_t h) {
  dispatch_float(x.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    using Acc = compute_t<T>;
    const std::vector<Acc> w = applied_weight<Acc>(gamma, args, op);
    const bool has_b = dbeta != nullptr;
    const T* xp = x.data<T>();
    const T* dyp = dy.data<T>();
    const T* drp = dres ? dres->data<T>() : nullptr;
    T* dxp = dx.data<T>();
    const Acc* mp = mean ? mean->data<Acc>() : nullptr;
    const Acc* rp = rstd.data<Acc>();
    // partial layout: [dgamma (H) | dbeta (H, when wanted)]
    std::vector<Acc> sums;
    chunked_row_reduce<Acc>(rows, has_b ? 2 * h : h, sums, [&](int64_t r0, int64_t r1, Acc* part) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t o = r * h;
        const T* dr = drp ? drp + o : nullptr;
        if (kind == NormKind::layernorm)
          norm_bwd_row<NormKind::layernorm>(dxp + o, part, has_b, dyp + o, dr, xp + o, mp[r], rp[r],
                                            w.data(), h);
        else
          norm_bwd_row<NormKind::rmsnorm>(dxp + o, part, false, dyp + o, dr, xp + o, Acc(0), rp[r],
                                          w.data(), h);
      }
    });
    std::vector<Acc> dg(sums.begin(), sums.begin() + h);
    accumulate_into(dgamma, dg, op);
    if (has_b) {
      std::vector<Acc> db(sums.begin() + h, sums.end());
      accumulate_into(*dbeta, db, op);
    }
  });
}

// y [N, H], mean [N], rstd [N] <- x [N, H], gamma [H], beta [H] (optional)
void layernorm_fwd(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& gamma,
                   const Tensor& beta, const NormArgs& args) {
  const ops::NormDims nd =
      ops::validate_layernorm_fwd(kOnHost, y, mean, rstd, x, gamma, beta, args);
  norm_fwd("layernorm_fwd", NormKind::layernorm, y, &mean, rstd, x, gamma, beta, args, nullptr,
           nd.rows, nd.h);
}

// dx [N, H] =, dgamma [H] +=, dbeta [H] += (optional) <- dy, x [N, H], mean, rstd [N], gamma [H]
void layernorm_bwd(Tensor& dx, Tensor& dgamma, Tensor& dbeta, const Tensor& dy, const Tensor& x,
                   const Tensor& mean, const Tensor& rstd, const Tensor& gamma,
                   const NormArgs& args) {
  const ops::NormDims nd =
      ops::validate_layernorm_bwd(kOnHost, dx, dgamma, dbeta, dy, x, mean, rstd, gamma);
  norm_bwd("layernorm_bwd", NormKind::layernorm, dx, dgamma, dbeta.defined() ? &dbeta : nullptr, dy,
           nullptr, x, &mean, rstd, gamma, args, nd.rows, nd.h);
}

// y [N, H], rstd [N] <- x [N, H], gamma [H]
void rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& gamma,
                 const NormArgs& args) {
  const ops::NormDims nd = ops::validate_rmsnorm_fwd(kOnHost, y, rstd, x, gamma, args);
  norm_fwd("rmsnorm_fwd", NormKind::rmsnorm, y, nullptr, rstd, x, gamma, Tensor(), args, nullptr,
           nd.rows, nd.h);
}

// dx [N, H] =, dgamma [H] += <- dy, x [N, H], rstd [N], gamma [H]
void rmsnorm_bwd(Tensor& dx, Tensor& dgamma, const Tensor& dy, const Tensor& x, const Tensor& rstd,
                 const Tensor& gamma, const NormArgs& args) {
  const ops::NormDims nd = ops::validate_rmsnorm_bwd(kOnHost, dx, dgamma, dy, x, rstd, gamma);
  norm_bwd("rmsnorm_bwd", NormKind::rmsnorm, dx, dgamma, nullptr, dy, nullptr, x, nullptr, rstd,
           gamma, args, nd.rows, nd.h);
}

// y [N, H], sum [N, H], mean [N] (layernorm), rstd [N] <- x [N, H], bias [H] (optional),
// residual [N, H], gamma [H], beta [H] (optional, layernorm)
void bias_dropout_add_norm_fwd(Tensor& y, Tensor& sum, Tensor& mean, Tensor& rstd, const Tensor& x,
                               const Tensor& bias, const Tensor& residual, const Tensor& gamma,
                               const Tensor& beta, const ops::DropoutArgs& dropout,
                               const NormArgs& args, NormKind kind) {
  const ops::NormDims nd = ops::validate_bias_dropout_add_norm_fwd(
      kOnHost, y, sum, mean, rstd, x, bias, residual, gamma, beta, dropout, args, kind);
  const BdaInputs bda{&sum, &x, &bias, &residual, &dropout};
  norm_fwd("bias_dropout_add_norm_fwd", kind, y, kind == NormKind::layernorm ? &mean : nullptr,
           rstd, sum, gamma, beta, args, &bda, nd.rows, nd.h);
}

// dx [N, H] = norm_bwd(dy) + dresidual (optional), dgamma [H] +=, dbeta [H] += (optional)
void norm_bwd_add(Tensor& dx, Tensor& dgamma, Tensor& dbeta, const Tensor& dy,
                  const Tensor& dresidual, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                  const Tensor& gamma, const NormArgs& args, NormKind kind) {
  const ops::NormDims nd = ops::validate_norm_bwd_add(kOnHost, dx, dgamma, dbeta, dy, dresidual, x,
                                                      mean, rstd, gamma, kind);
  const bool ln = kind == NormKind::layernorm;
  norm_bwd("norm_bwd_add", kind, dx, dgamma, ln && dbeta.defined() ? &dbeta : nullptr, dy,
           dresidual.defined() ? &dresidual : nullptr, x, ln ? &mean : nullptr, rstd, gamma, args,
           nd.rows, nd.h);
}

}  // namespace

void register_norm_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::layernorm_fwd>("cpu", &layernorm_fwd, "cpu:omp");
  r.register_op<ops::OpId::layernorm_bwd>("cpu", &layernorm_bwd, "cpu:omp");
  r.register_op<ops::OpId::rmsnorm_fwd>("cpu", &rmsnorm_fwd, "cpu:omp");
  r.register_op<ops::OpId::rmsnorm_bwd>("cpu", &rmsnorm_bwd, "cpu:omp");
  r.register_op<ops::OpId::bias_dropout_add_norm_fwd>("cpu", &bias_dropout_add_norm_fwd, "cpu:omp");
  r.register_op<ops::OpId::norm_bwd_add>("cpu", &norm_bwd_add, "cpu:omp");
}

}  // namespace mg::platforms::cpu
