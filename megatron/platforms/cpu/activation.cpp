// CPU element-wise activations: GELU (exact erf and tanh forms), SwiGLU, squared ReLU.
//
// Gradient rule: parameter gradients accumulate (+=: there are none here); activation gradients
// are written (=: dx).
//
//   gelu none  y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2));  y' = Phi(x) + x * phi(x)
//   gelu tanh  u = sqrt(2/pi) (x + 0.044715 x^3), y = 0.5 x (1 + tanh u);
//              y' = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
//   swiglu     x [N, 2F] = [gate | up] along the last dim (Megatron's torch.chunk(x, 2, -1)),
//              y [N, F] = silu(gate) * up, silu(a) = a * sigmoid(a);
//              d gate = dy * up * s (1 + a (1 - s)), d up = dy * silu(a), s = sigmoid(a)
//   sq. relu   y = max(x, 0)^2;  y' = 2 max(x, 0)
// f32 tanh GELU runs on vec_math.h lanes as y = x sigmoid(2u) (= 0.5 x (1 + tanh u)) and
// y' = s + 2 x s (1 - s) du/dx, s = sigmoid(2u), with the polynomial e^x (no tanhf/expm1f calls).
// Math in f32 (f64 for f64). Element-wise ops accept any shapes with equal element counts (dx may
// alias dy: every element is read before it is written).
// Not here: fused bias add (the bias_add op plus these), GEGLU, or other activations.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/platforms/cpu/vec_math.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

using ops::GeluApprox;

template <typename A>
struct GeluConst {
  static constexpr A kSqrt2OverPi = A(0.7978845608028654);  // sqrt(2/pi)
  static constexpr A kInvSqrt2 = A(0.7071067811865476);     // 1/sqrt(2)
  static constexpr A kInvSqrt2Pi = A(0.3989422804014327);   // 1/sqrt(2 pi)
  static constexpr A kCubic = A(0.044715);
};

template <typename A>
inline A gelu(A x, GeluApprox approx) {
  using C = GeluConst<A>;
  if (approx == GeluApprox::tanh)
    return A(0.5) * x * (A(1) + std::tanh(C::kSqrt2OverPi * (x + C::kCubic * x * x * x)));
  return A(0.5) * x * (A(1) + std::erf(x * C::kInvSqrt2));
}

template <typename A>
inline A gelu_grad(A x, GeluApprox approx) {
  using C = GeluConst<A>;
  if (approx == GeluApprox::tanh) {
    const A t = std::tanh(C::kSqrt2OverPi * (x + C::kCubic * x * x * x));
    return A(0.5) * (A(1) + t) +
           A(0.5) * x * (A(1) - t * t) * C::kSqrt2OverPi * (A(1) + A(3) * C::kCubic * x * x);
  }
  const A cdf = A(0.5) * (A(1) + std::erf(x * C::kInvSqrt2));
  const A pdf = C::kInvSqrt2Pi * std::exp(A(-0.5) * x * x);
  return cdf + x * pdf;
}

template <typename A>
inline A sigmoid(A x) {
  return A(1) / (A(1) + std::exp(-x));
}

// Applies f(x) -> y element-wise in the compute type of x's dtype.
template <typename F>
void map_unary(const char* op, Tensor& y, const Tensor& x, F&& f) {
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) yp[i] = store<T>(f(to_f32(xp[i])));
  });
}

// Applies dx = dy * f'(x) element-wise.
template <typename F>
void map_grad(const char* op, Tensor& dx, const Tensor& dy, const Tensor& x, F&& df) {
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    const T* xp = x.data<T>();
    const T* dyp = dy.data<T>();
    T* dxp = dx.data<T>();
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (int64_t i = 0; i < n; ++i) dxp[i] = store<T>(to_f32(dyp[i]) * df(to_f32(xp[i])));
  });
}

// f32 tanh GELU on vec_math.h lanes: 0.5 (1 + tanh u) = sigmoid(2u), so y = x sigmoid(2u) and
// y' = s + 2 x s (1 - s) du/dx with s = sigmoid(2u) (the same functions as the scalar forms above,
// without tanhf's cost). Lane-wise, so results do not depend on the thread count.
inline vec::FV gelu_tanh_sigmoid_v(vec::FV x) {
  using C = GeluConst<float>;
  const vec::FV u = C::kSqrt2OverPi * (x + C::kCubic * x * x * x);
  return 1.0f / (1.0f + vec::exp_v(-2.0f * u));
}

// out[i] = f(x[i], g[i]) (g = 0 when null) over n f32 elements, kLanes at a time.
template <typename F>
void map_f32_v(float* out, const float* x, const float* g, int64_t n, F&& f) {
  using namespace vec;
  const int64_t blocks = (n + kLanes - 1) / kLanes;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i = b * kLanes, m = std::min<int64_t>(kLanes, n - i);
    if (m == kLanes) {
      store_v(out + i, f(load_v(x + i), g ? load_v(g + i) : FV{}));
    } else {
      store_partial_v(out + i, f(partial_v(x + i, m, 0.0f), g ? partial_v(g + i, m, 0.0f) : FV{}),
                      m);
    }
  }
}

// y = gelu(x)
void gelu_fwd(Tensor& y, const Tensor& x, GeluApprox approx) {
  ops::validate_unary(kOnHost, "gelu_fwd", "y", y, "x", x);
  if (approx == GeluApprox::tanh && x.dtype() == DType::f32) {
    map_f32_v(y.data<float>(), x.data<float>(), nullptr, x.numel(),
              [](vec::FV v, vec::FV) { return v * gelu_tanh_sigmoid_v(v); });
    return;
  }
  map_unary("gelu_fwd", y, x, [approx](auto v) { return gelu(v, approx); });
}

// dx = dy * gelu'(x)
void gelu_bwd(Tensor& dx, const Tensor& dy, const Tensor& x, GeluApprox approx) {
  ops::validate_unary(kOnHost, "gelu_bwd", "dx", dx, "x", x);
  ops::validate_unary(kOnHost, "gelu_bwd", "dy", dy, "x", x);
  if (approx == GeluApprox::tanh && x.dtype() == DType::f32) {
    map_f32_v(dx.data<float>(), x.data<float>(), dy.data<float>(), x.numel(),
              [](vec::FV v, vec::FV g) {
                using C = GeluConst<float>;
                const vec::FV sg = gelu_tanh_sigmoid_v(v);
                const vec::FV du = C::kSqrt2OverPi * (1.0f + 3.0f * C::kCubic * v * v);
                return g * (sg + 2.0f * v * sg * (1.0f - sg) * du);
              });
    return;
  }
  map_grad("gelu_bwd", dx, dy, x, [approx](auto v) { return gelu_grad(v, approx); });
}

// y = max(x, 0)^2
void squared_relu_fwd(Tensor& y, const Tensor& x) {
  ops::validate_unary(kOnHost, "squared_relu_fwd", "y", y, "x", x);
  map_unary("squared_relu_fwd", y, x, [](auto v) {
    const decltype(v) r = v > 0 ? v : decltype(v)(0);
    return r * r;
  });
}

// dx = dy * 2 max(x, 0)
void squared_relu_bwd(Tensor& dx, const Tensor& dy, const Tensor& x) {
  ops::validate_unary(kOnHost, "squared_relu_bwd", "dx", dx, "x", x);
  ops::validate_unary(kOnHost, "squared_relu_bwd", "dy", dy, "x", x);
  map_grad("squared_relu_bwd", dx, dy, x,
           [](auto v) { return v > 0 ? decltype(v)(2) * v : decltype(v)(0); });
}

// y [N, F] = silu(x[:, :F]) * x[:, F:]
void swiglu_fwd(Tensor& y, const Tensor& x) {
  const char* op = "swiglu_fwd";
  const int64_t f = ops::validate_swiglu(kOnHost, op, "y", y, x);
  if (f == 0) return;
  const int64_t rows = x.numel() / (2 * f);
  dispatch_float(x.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    using Acc = compute_t<T>;
    const T* xp = x.data<T>();
    T* yp = y.data<T>();
#pragma omp parallel for schedule(static) if (y.numel() >= kParallelMinElements)
    for (int64_t r = 0; r < rows; ++r) {
      const T* gate = xp + r * 2 * f;
      const T* up = gate + f;
      T* yr = yp + r * f;
      for (int64_t j = 0; j < f; ++j) {
        const Acc a = to_f32(gate[j]);
        yr[j] = store<T>(a * sigmoid(a) * to_f32(up[j]));
      }
    }
  });
}

// dx [N, 2F] = [dy * up * silu'(gate) | dy * silu(gate)]
void swiglu_bwd(Tensor& dx, const Tensor& dy, const Tensor& x) {
  const char* op = "swiglu_bwd";
  const int64_t f = ops::validate_swiglu_bwd(kOnHost, dx, dy, x);
  if (f == 0) return;
  const int64_t rows = x.numel() / (2 * f);
  dispatch_float(x.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    using Acc = compute_t<T>;
    const T* xp = x.data<T>();
    const T* dyp = dy.data<T>();
    T* dxp = dx.data<T>();
#pragma omp parallel for schedule(static) if (x.numel() >= kParallelMinElements)
    for (int64_t r = 0; r < rows; ++r) {
      const T* gate = xp + r * 2 * f;
      const T* up = gate + f;
      const T* dyr = dyp + r * f;
      T* dgate = dxp + r * 2 * f;
      T* dup = dgate + f;
      for (int64_t j = 0; j < f; ++j) {
        const Acc a = to_f32(gate[j]), u = to_f32(up[j]), d = to_f32(dyr[j]);
        const Acc s = sigmoid(a);
        dgate[j] = store<T>(d * u * s * (Acc(1) + a * (Acc(1) - s)));
        dup[j] = store<T>(d * a * s);
      }
    }
  });
}

}  // namespace

void register_activation_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::gelu_fwd>("cpu", &gelu_fwd, "cpu:omp");
  r.register_op<ops::OpId::gelu_bwd>("cpu", &gelu_bwd, "cpu:omp");
  r.register_op<ops::OpId::swiglu_fwd>("cpu", &swiglu_fwd, "cpu:omp");
  r.register_op<ops::OpId::swiglu_bwd>("cpu", &swiglu_bwd, "cpu:omp");
  r.register_op<ops::OpId::squared_relu_fwd>("cpu", &squared_relu_fwd, "cpu:omp");
  r.register_op<ops::OpId::squared_relu_bwd>("cpu", &squared_relu_bwd, "cpu:omp");
}

}  // namespace mg::platforms::cpu
