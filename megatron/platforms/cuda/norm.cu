// CUDA LayerNorm and RMSNorm over the last dim (x viewed as [N, H]), forward and backward.
//
// Gradient rule: parameter gradients accumulate (+=: dgamma, dbeta); activation gradients are
// written (=: dx).
//
// One thread block per row. Forward saves per-row statistics in the compute type (f32, f64 for
// f64 x): LayerNorm mean and rstd = 1/sqrt(var + eps) with the biased (1/H) variance in two passes;
// RMSNorm rstd = 1/sqrt(mean(x^2) + eps). The applied weight is gamma, or (1 + gamma) with
// zero_centered_gamma. Backward, with xhat = normalised x and g = dy * weight:
//   LayerNorm dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   RMSNorm   dx = rstd * (g - xhat * mean(g * xhat))
//   dgamma += sum_n dy * xhat;  dbeta += sum_n dy   (f64 column sums in a fixed order)
// The same formulas and checks as megatron/platforms/cpu/norm.cpp. gamma/beta and their grads may
// have another float dtype than x (f32 grads of bf16 params). dx may alias dy: the column sums
// run before the dx kernel, and each dx element is written by the thread that read it last.
// Not here: fused residual add, dropout, fp8 outputs, rows cached in shared memory (speed issue).
#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/platforms/cuda/reduce.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

using ops::NormArgs;

struct Param {
  const void* p;
  DType t;
  bool plus_one;  // zero_centered_gamma
  template <typename C>
  __device__ __forceinline__ C at(int64_t j) const {
    const C w = load<C>(p, t, j);
    return plus_one ? w + C(1) : w;
  }
};

// y [R, H], mean [R], rstd [R] <- x [R, H]; mean == nullptr: RMSNorm (no centring, no beta).
template <typename C>
__global__ void norm_fwd_kernel(void* y, void* mean, void* rstd, DType st, const void* x, DType t,
                                Param gamma, Param beta, C eps, int64_t rows, int64_t h) {
  const int64_t r = block_row();
  if (r >= rows) return;
  const int64_t base = r * h;
  const C inv_h = C(1) / static_cast<C>(h);
  C mu = C(0);
  if (mean) {
    C s = 0;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) s += load<C>(x, t, base + j);
    mu = block_sum(s) * inv_h;
  }
  C ss = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const C d = load<C>(x, t, base + j) - mu;
    ss += d * d;
  }
  ss = block_sum(ss);
  const C rs = C(1) / sqrt_c(ss * inv_h + eps);
  if (threadIdx.x == 0) {
    if (mean) store<C>(mean, st, r, mu);
    store<C>(rstd, st, r, rs);
  }
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    C v = (load<C>(x, t, base + j) - mu) * rs * gamma.at<C>(j);
    if (beta.p) v += beta.at<C>(j);
    store<C>(y, t, base + j, v);
  }
}

// dx [R, H] <- dy, x [R, H], mean/rstd [R] (mean == nullptr: RMSNorm), gamma [H]
template <typename C>
__global__ void norm_bwd_kernel(void* dx, const void* dy, const void* x, DType t, const void* mean,
                                const void* rstd, DType st, Param gamma, int64_t rows, int64_t h) {
  const int64_t r = block_row();
  if (r >= rows) return;
  const int64_t base = r * h;
  const C inv_h = C(1) / static_cast<C>(h);
  const C mu = mean ? load<C>(mean, st, r) : C(0);
  const C rs = load<C>(rstd, st, r);
  C sum_g = 0, sum_gx = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const C xh = (load<C>(x, t, base + j) - mu) * rs;
    const C g = load<C>(dy, t, base + j) * gamma.at<C>(j);
    sum_g += g;
    sum_gx += g * xh;
  }
  const C mg = mean ? block_sum(sum_g) * inv_h : C(0);
  const C mgx = block_sum(sum_gx) * inv_h;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const C xh = (load<C>(x, t, base + j) - mu) * rs;
    const C g = load<C>(dy, t, base + j) * gamma.at<C>(j);
    store<C>(dx, t, base + j, rs * (g - mg - xh * mgx));
  }
}

// dgamma term dy * xhat (with_xhat) or the dbeta term dy, in C, widened.
template <typename C>
struct NormParamTerm {
  const void* dy;
  const void* x;
  DType t;
  const void* mean;  // null for RMSNorm
  const void* rstd;
  DType st;
  int64_t h;
  bool with_xhat;
  __device__ double operator()(int64_t r, int64_t j) const {
    const int64_t i = r * h + j;
    const C d = load<C>(dy, t, i);
    if (!with_xhat) return static_cast<double>(d);
    const C mu = mean ? load<C>(mean, st, r) : C(0);
    const C xh = (load<C>(x, t, i) - mu) * load<C>(rstd, st, r);
    return static_cast<double>(d * xh);
  }
};

Param param_of(const Tensor& t, bool plus_one) {
  return t.defined() ? Param{t.raw_data(), t.dtype(), plus_one} : Param{nullptr, DType::f32, false};
}

void launch_fwd(Tensor& y, Tensor* mean, Tensor& rstd, const Tensor& x, const Tensor& gamma,
                const Tensor& beta, const NormArgs& args) {
  const int64_t h = x.size(-1), rows = x.numel() / h;
  if (rows == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  with_compute(x.dtype(), [&](auto tag) {
    using C = decltype(tag);
    norm_fwd_kernel<C><<<grid_rows(rows), kThreads, 0, current_stream(dev)>>>(
        y.raw_data(), mean ? mean->raw_data() : nullptr, rstd.raw_data(), rstd.dtype(),
        x.raw_data(), x.dtype(), param_of(gamma, args.zero_centered_gamma), param_of(beta, false),
        static_cast<C>(args.eps), rows, h);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void launch_bwd(Tensor& dx, Tensor& dgamma, Tensor* dbeta, const Tensor& dy, const Tensor& x,
                const Tensor* mean, const Tensor& rstd, const Tensor& gamma, const NormArgs& args) {
  const int64_t h = x.size(-1), rows = x.numel() / h;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  with_compute(x.dtype(), [&](auto tag) {
    using C = decltype(tag);
    const void* mp = mean ? mean->raw_data() : nullptr;
    // Parameter gradients first: dx may alias dy.
    column_sum_accumulate(dgamma.raw_data(), dgamma.dtype(), rows, h,
                          NormParamTerm<C>{dy.raw_data(), x.raw_data(), x.dtype(), mp,
                                           rstd.raw_data(), rstd.dtype(), h, true},
                          dev);
    if (dbeta)
      column_sum_accumulate(dbeta->raw_data(), dbeta->dtype(), rows, h,
                            NormParamTerm<C>{dy.raw_data(), x.raw_data(), x.dtype(), mp,
                                             rstd.raw_data(), rstd.dtype(), h, false},
                            dev);
    if (rows == 0) return;
    norm_bwd_kernel<C><<<grid_rows(rows), kThreads, 0, current_stream(dev)>>>(
        dx.raw_data(), dy.raw_data(), x.raw_data(), x.dtype(), mp, rstd.raw_data(), rstd.dtype(),
        param_of(gamma, args.zero_centered_gamma), rows, h);
    MG_CUDA_CHECK_LAUNCH();
  });
}

// y [N, H], mean [N], rstd [N] <- x [N, H], gamma [H], beta [H] (optional)
void layernorm_fwd(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& gamma,
                   const Tensor& beta, const NormArgs& args) {
  ops::validate_layernorm_fwd(OnCudaDevice{}, y, mean, rstd, x, gamma, beta, args);
  launch_fwd(y, &mean, rstd, x, gamma, beta, args);
}

// dx [N, H] =, dgamma [H] +=, dbeta [H] += (optional) <- dy, x [N, H], mean, rstd [N], gamma [H]
void layernorm_bwd(Tensor& dx, Tensor& dgamma, Tensor& dbeta, const Tensor& dy, const Tensor& x,
                   const Tensor& mean, const Tensor& rstd, const Tensor& gamma,
                   const NormArgs& args) {
  ops::validate_layernorm_bwd(OnCudaDevice{}, dx, dgamma, dbeta, dy, x, mean, rstd, gamma);
  launch_bwd(dx, dgamma, dbeta.defined() ? &dbeta : nullptr, dy, x, &mean, rstd, gamma, args);
}

// y [N, H], rstd [N] <- x [N, H], gamma [H]
void rmsnorm_fwd(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& gamma,
                 const NormArgs& args) {
  ops::validate_rmsnorm_fwd(OnCudaDevice{}, y, rstd, x, gamma, args);
  launch_fwd(y, nullptr, rstd, x, gamma, Tensor(), args);
}

// dx [N, H] =, dgamma [H] += <- dy, x [N, H], rstd [N], gamma [H]
void rmsnorm_bwd(Tensor& dx, Tensor& dgamma, const Tensor& dy, const Tensor& x, const Tensor& rstd,
                 const Tensor& gamma, const NormArgs& args) {
  ops::validate_rmsnorm_bwd(OnCudaDevice{}, dx, dgamma, dy, x, rstd, gamma);
  launch_bwd(dx, dgamma, nullptr, dy, x, nullptr, rstd, gamma, args);
}

}  // namespace

void register_norm_kernels(plugin::Registry& r) {
  using ops::OpId;
  r.register_op<OpId::layernorm_fwd>(kPlatformName, &layernorm_fwd, "cuda:kernel");
  r.register_op<OpId::layernorm_bwd>(kPlatformName, &layernorm_bwd, "cuda:kernel");
  r.register_op<OpId::rmsnorm_fwd>(kPlatformName, &rmsnorm_fwd, "cuda:kernel");
  r.register_op<OpId::rmsnorm_bwd>(kPlatformName, &rmsnorm_bwd, "cuda:kernel");
}

}  // namespace mg::platforms::cuda
