// CUDA softmax over the last dim of scale * x (Megatron's unfused scaled softmax, without a mask:
// masking is the caller's -inf).
//
// Gradient rule: no parameters; the activation gradient dx is written (=), never accumulated.
// Invariants: one thread block per row; math in f32 for f32/bf16/f16 storage, f64 for f64; every
// row is stabilised by its maximum, and a row of all -inf (fully masked) gives y = 0, not NaN.
// y may alias x and dx may alias dy: the reductions finish (block barrier) before the write pass,
// which reads and writes each element in the same thread. Same formulas as
// megatron/platforms/cpu/softmax.cpp. Not here: masks, dropout, rows kept in registers or shared
// memory (x is read three times; not yet optimised).
#include <cmath>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

// y [R, F] = softmax(scale * x [R, F]) over F
template <typename C>
__global__ void softmax_fwd_kernel(void* y, const void* x, DType t, C scale, int64_t rows,
                                   int64_t f) {
  const int64_t r = block_row();
  if (r >= rows) return;  // uniform across the block
  const int64_t base = r * f;
  C m = neg_inf<C>();
  for (int64_t j = threadIdx.x; j < f; j += blockDim.x) {
    const C v = scale * load<C>(x, t, base + j);
    m = v > m ? v : m;
  }
  m = block_max(m);
  if (m == neg_inf<C>()) {  // fully masked row: no probability mass
    for (int64_t j = threadIdx.x; j < f; j += blockDim.x) store<C>(y, t, base + j, C(0));
    return;
  }
  C s = 0;
  for (int64_t j = threadIdx.x; j < f; j += blockDim.x)
    s += exp_c(scale * load<C>(x, t, base + j) - m);
  s = block_sum(s);
  const C inv = C(1) / s;
  for (int64_t j = threadIdx.x; j < f; j += blockDim.x)
    store<C>(y, t, base + j, exp_c(scale * load<C>(x, t, base + j) - m) * inv);
}

// dx [R, F] = scale * y * (dy - sum_f(dy * y))
template <typename C>
__global__ void softmax_bwd_kernel(void* dx, const void* dy, const void* y, DType t, C scale,
                                   int64_t rows, int64_t f) {
  const int64_t r = block_row();
  if (r >= rows) return;
  const int64_t base = r * f;
  C dot = 0;
  for (int64_t j = threadIdx.x; j < f; j += blockDim.x)
    dot += load<C>(dy, t, base + j) * load<C>(y, t, base + j);
  dot = block_sum(dot);
  for (int64_t j = threadIdx.x; j < f; j += blockDim.x) {
    const C yj = load<C>(y, t, base + j);
    store<C>(dx, t, base + j, scale * yj * (load<C>(dy, t, base + j) - dot));
  }
}

void softmax_fwd(Tensor& y, const Tensor& x, float scale) {
  constexpr const char* op = "softmax_fwd";
  ops::validate_softmax_fwd(OnCudaDevice{}, op, y, x, scale);
  const int64_t f = x.size(-1);
  const int64_t rows = f == 0 ? 0 : x.numel() / f;
  if (rows == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  with_compute(x.dtype(), [&](auto tag) {
    using C = decltype(tag);
    softmax_fwd_kernel<C><<<grid_rows(rows), kThreads, 0, current_stream(dev)>>>(
        y.raw_data(), x.raw_data(), x.dtype(), static_cast<C>(scale), rows, f);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void softmax_bwd(Tensor& dx, const Tensor& dy, const Tensor& y, float scale) {
  constexpr const char* op = "softmax_bwd";
  ops::validate_softmax_bwd(OnCudaDevice{}, op, dx, dy, y, scale);
  const int64_t f = y.size(-1);
  const int64_t rows = f == 0 ? 0 : y.numel() / f;
  if (rows == 0) return;
  const int dev = y.device().index;
  DeviceGuard guard(dev);
  with_compute(y.dtype(), [&](auto tag) {
    using C = decltype(tag);
    softmax_bwd_kernel<C><<<grid_rows(rows), kThreads, 0, current_stream(dev)>>>(
        dx.raw_data(), dy.raw_data(), y.raw_data(), y.dtype(), static_cast<C>(scale), rows, f);
  });
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

void register_softmax_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::softmax_fwd>(kPlatformName, &softmax_fwd, "cuda:kernel");
  r.register_op<ops::OpId::softmax_bwd>(kPlatformName, &softmax_bwd, "cuda:kernel");
}

}  // namespace mg::platforms::cuda
