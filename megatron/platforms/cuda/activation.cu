// CUDA element-wise activations: GELU (exact erf and tanh forms), SwiGLU, squared ReLU.
//
// Gradient rule: parameter gradients accumulate (+=: there are none here); activation gradients
// are written (=: dx).
//
//   gelu none  y = 0.5 x (1 + erf(x / sqrt 2));  y' = Phi(x) + x phi(x)
//   gelu tanh  t = tanh(sqrt(2/pi) (x + 0.044715 x^3)), y = 0.5 x (1 + t);
//              y' = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
//   swiglu     x [N, 2F] = [gate | up], y [N, F] = silu(gate) * up;
//              d gate = dy * up * s (1 + a (1 - s)), d up = dy * silu(a), s = sigmoid(a)
//   sq. relu   y = max(x, 0)^2;  y' = 2 max(x, 0)
// Math in f32 (f64 for f64), the same formulas as megatron/platforms/cpu/activation.cpp. Unary ops
// accept any shapes with equal element counts; dx may alias dy (each element is read, then written
// by the same thread). swiglu in bf16 / f16 with F % 8 == 0 takes vector kernels (eight columns
// per thread, 16-byte accesses, the same per-element expressions, so the same bits). Not here:
// fused bias + activation, vector kernels for the unary activations (not yet).
#include <initializer_list>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/platforms/cuda/swiglu_math.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

using ops::GeluApprox;

enum class Act : int { gelu_none, gelu_tanh, squared_relu };

template <typename C>
__device__ __forceinline__ C act_fwd(Act act, C x) {
  const C kSqrt2OverPi = C(0.7978845608028654), kInvSqrt2 = C(0.7071067811865476);
  const C kCubic = C(0.044715);
  switch (act) {
    case Act::gelu_tanh:
      return C(0.5) * x * (C(1) + tanh_c(kSqrt2OverPi * (x + kCubic * x * x * x)));
    case Act::gelu_none:
      return C(0.5) * x * (C(1) + erf_c(x * kInvSqrt2));
    case Act::squared_relu: {
      const C r = x > C(0) ? x : C(0);
      return r * r;
    }
  }
  return C(0);
}

template <typename C>
__device__ __forceinline__ C act_grad(Act act, C x) {
  const C kSqrt2OverPi = C(0.7978845608028654), kInvSqrt2 = C(0.7071067811865476);
  const C kInvSqrt2Pi = C(0.3989422804014327), kCubic = C(0.044715);
  switch (act) {
    case Act::gelu_tanh: {
      const C t = tanh_c(kSqrt2OverPi * (x + kCubic * x * x * x));
      return C(0.5) * (C(1) + t) +
             C(0.5) * x * (C(1) - t * t) * kSqrt2OverPi * (C(1) + C(3) * kCubic * x * x);
    }
    case Act::gelu_none: {
      const C cdf = C(0.5) * (C(1) + erf_c(x * kInvSqrt2));
      const C pdf = kInvSqrt2Pi * exp_c(C(-0.5) * x * x);
      return cdf + x * pdf;
    }
    case Act::squared_relu:
      return x > C(0) ? C(2) * x : C(0);
  }
  return C(0);
}

template <typename C>
__global__ void act_fwd_kernel(void* y, const void* x, DType t, Act act, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride())
    store<C>(y, t, i, act_fwd(act, load<C>(x, t, i)));
}

template <typename C>
__global__ void act_bwd_kernel(void* dx, const void* dy, const void* x, DType t, Act act,
                               int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride())
    store<C>(dx, t, i, load<C>(dy, t, i) * act_grad(act, load<C>(x, t, i)));
}

// y [R, F] = silu(x[:, :F]) * x[:, F:], x [R, 2F]
template <typename C>
__global__ void swiglu_fwd_kernel(void* y, const void* x, DType t, int64_t rows, int64_t f) {
  const int64_t n = rows * f;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const int64_t r = i / f, j = i - r * f;
    const C a = load<C>(x, t, r * 2 * f + j), u = load<C>(x, t, r * 2 * f + f + j);
    store<C>(y, t, i, swiglu_value(a, u));
  }
}

// The same for bf16 / f16 with F % 8 == 0: eight columns per thread, 16-byte accesses (the scalar
// kernels ran at 700-890 GB/s on an H200: 21 ms of a 168 ms llama-1b step).
__global__ void swiglu_fwd_vec_kernel(void* y, const void* x, bool bf16, int64_t rows, int64_t f) {
  const int64_t f8 = f / 8, n = rows * f8;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const int64_t r = i / f8, j = (i - r * f8) * 8;
    float a[8], u[8], o[8];
    load8_half(x, r * 2 * f + j, bf16, a);
    load8_half(x, r * 2 * f + f + j, bf16, u);
#pragma unroll
    for (int k = 0; k < 8; ++k) o[k] = swiglu_value(a[k], u[k]);
    store8_half(y, r * f + j, bf16, o);
  }
}

__global__ void swiglu_bwd_vec_kernel(void* dx, const void* dy, const void* x, bool bf16,
                                      int64_t rows, int64_t f) {
  const int64_t f8 = f / 8, n = rows * f8;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const int64_t r = i / f8, j = (i - r * f8) * 8;
    const int64_t g = r * 2 * f + j;
    float a[8], u[8], d[8], dg[8], du[8];
    load8_half(x, g, bf16, a);
    load8_half(x, g + f, bf16, u);
    load8_half(dy, r * f + j, bf16, d);
#pragma unroll
    for (int k = 0; k < 8; ++k) swiglu_grads(d[k], a[k], u[k], dg[k], du[k]);
    store8_half(dx, g, bf16, dg);
    store8_half(dx, g + f, bf16, du);
  }
}

// Whether the swiglu tensors take the vector kernels.
bool swiglu_vec(int64_t f, DType t, std::initializer_list<const void*> ptrs) {
  if (f % 8 != 0 || (t != DType::bf16 && t != DType::f16)) return false;
  for (const void* p : ptrs)
    if (!aligned_for_8_halves(p)) return false;
  return true;
}

// dx [R, 2F] = [dy * up * silu'(gate) | dy * silu(gate)]
template <typename C>
__global__ void swiglu_bwd_kernel(void* dx, const void* dy, const void* x, DType t, int64_t rows,
                                  int64_t f) {
  const int64_t n = rows * f;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const int64_t r = i / f, j = i - r * f;
    const int64_t g = r * 2 * f + j;
    const C a = load<C>(x, t, g), u = load<C>(x, t, g + f), d = load<C>(dy, t, i);
    C dgate, dup;
    swiglu_grads(d, a, u, dgate, dup);
    store<C>(dx, t, g, dgate);
    store<C>(dx, t, g + f, dup);
  }
}

void launch_fwd(Tensor& y, const Tensor& x, Act act) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  with_compute(x.dtype(), [&](auto tag) {
    using C = decltype(tag);
    act_fwd_kernel<C><<<grid_for(n), kThreads, 0, current_stream(dev)>>>(y.raw_data(), x.raw_data(),
                                                                         x.dtype(), act, n);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void launch_bwd(Tensor& dx, const Tensor& dy, const Tensor& x, Act act) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  with_compute(x.dtype(), [&](auto tag) {
    using C = decltype(tag);
    act_bwd_kernel<C><<<grid_for(n), kThreads, 0, current_stream(dev)>>>(
        dx.raw_data(), dy.raw_data(), x.raw_data(), x.dtype(), act, n);
  });
  MG_CUDA_CHECK_LAUNCH();
}

Act gelu_act(GeluApprox approx) {
  return approx == GeluApprox::tanh ? Act::gelu_tanh : Act::gelu_none;
}

// y [*] = gelu(x [*])
void gelu_fwd(Tensor& y, const Tensor& x, GeluApprox approx) {
  ops::validate_unary(OnCudaDevice{}, "gelu_fwd", "y", y, "x", x);
  launch_fwd(y, x, gelu_act(approx));
}

// dx [*] = dy [*] * gelu'(x [*])
void gelu_bwd(Tensor& dx, const Tensor& dy, const Tensor& x, GeluApprox approx) {
  ops::validate_unary(OnCudaDevice{}, "gelu_bwd", "dx", dx, "x", x);
  ops::validate_unary(OnCudaDevice{}, "gelu_bwd", "dy", dy, "x", x);
  launch_bwd(dx, dy, x, gelu_act(approx));
}

// y [*] = max(x, 0)^2
void squared_relu_fwd(Tensor& y, const Tensor& x) {
  ops::validate_unary(OnCudaDevice{}, "squared_relu_fwd", "y", y, "x", x);
  launch_fwd(y, x, Act::squared_relu);
}

// dx [*] = dy * 2 max(x, 0)
void squared_relu_bwd(Tensor& dx, const Tensor& dy, const Tensor& x) {
  ops::validate_unary(OnCudaDevice{}, "squared_relu_bwd", "dx", dx, "x", x);
  ops::validate_unary(OnCudaDevice{}, "squared_relu_bwd", "dy", dy, "x", x);
  launch_bwd(dx, dy, x, Act::squared_relu);
}

// y [N, F] = silu(x[:, :F]) * x[:, F:]
void swiglu_fwd(Tensor& y, const Tensor& x) {
  const char* op = "swiglu_fwd";
  const int64_t f = ops::validate_swiglu(OnCudaDevice{}, op, "y", y, x);
  if (f == 0 || x.numel() == 0) return;
  const int64_t rows = x.numel() / (2 * f);
  MG_CHECK(!overlaps(y, x), op << ": y must not overlap x (their layouts differ)");
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  if (swiglu_vec(f, x.dtype(), {y.raw_data(), x.raw_data()})) {
    swiglu_fwd_vec_kernel<<<grid_for(rows * f / 8), kThreads, 0, current_stream(dev)>>>(
        y.raw_data(), x.raw_data(), x.dtype() == DType::bf16, rows, f);
    MG_CUDA_CHECK_LAUNCH();
    return;
  }
  with_compute(x.dtype(), [&](auto tag) {
    using C = decltype(tag);
    swiglu_fwd_kernel<C><<<grid_for(rows * f), kThreads, 0, current_stream(dev)>>>(
        y.raw_data(), x.raw_data(), x.dtype(), rows, f);
  });
  MG_CUDA_CHECK_LAUNCH();
}

// dx [N, 2F] = [dy * up * silu'(gate) | dy * silu(gate)]
void swiglu_bwd(Tensor& dx, const Tensor& dy, const Tensor& x) {
  const char* op = "swiglu_bwd";
  const int64_t f = ops::validate_swiglu_bwd(OnCudaDevice{}, dx, dy, x);
  MG_CHECK(!overlaps(dx, x) || dx.raw_data() == x.raw_data(),
           op << ": dx may alias x only exactly (element-wise in place)");
  if (f == 0 || x.numel() == 0) return;
  const int64_t rows = x.numel() / (2 * f);
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  if (swiglu_vec(f, x.dtype(), {dx.raw_data(), dy.raw_data(), x.raw_data()})) {
    swiglu_bwd_vec_kernel<<<grid_for(rows * f / 8), kThreads, 0, current_stream(dev)>>>(
        dx.raw_data(), dy.raw_data(), x.raw_data(), x.dtype() == DType::bf16, rows, f);
    MG_CUDA_CHECK_LAUNCH();
    return;
  }
  with_compute(x.dtype(), [&](auto tag) {
    using C = decltype(tag);
    swiglu_bwd_kernel<C><<<grid_for(rows * f), kThreads, 0, current_stream(dev)>>>(
        dx.raw_data(), dy.raw_data(), x.raw_data(), x.dtype(), rows, f);
  });
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

void register_activation_kernels(plugin::Registry& r) {
  using ops::OpId;
  r.register_op<OpId::gelu_fwd>(kPlatformName, &gelu_fwd, "cuda:kernel");
  r.register_op<OpId::gelu_bwd>(kPlatformName, &gelu_bwd, "cuda:kernel");
  r.register_op<OpId::swiglu_fwd>(kPlatformName, &swiglu_fwd, "cuda:kernel");
  r.register_op<OpId::swiglu_bwd>(kPlatformName, &swiglu_bwd, "cuda:kernel");
  r.register_op<OpId::squared_relu_fwd>(kPlatformName, &squared_relu_fwd, "cuda:kernel");
  r.register_op<OpId::squared_relu_bwd>(kPlatformName, &squared_relu_bwd, "cuda:kernel");
}

}  // namespace mg::platforms::cuda
