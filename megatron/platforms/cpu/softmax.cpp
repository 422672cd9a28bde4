// CPU softmax over the last dim of scale * x (the unfused "scaled softmax" of Megatron's
// FusedScaleMaskSoftmax, without a mask: masking is the caller's -inf).
//
// Gradient rule: no parameters; the activation gradient dx is written (=), never accumulated.
// Invariants: math in f32 for f32/bf16/f16 storage, f64 for f64; y, dx, dy share x's dtype and
// shape; every row is stabilised by its maximum, and a row whose entries are all -inf (fully
// masked) gives y = 0 instead of NaN. y may alias x and dx may alias dy (each row is read before
// it is written). Not done here: masks, dropout, the fused attention path (attention.cpp).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

// x or y [N, F] (any leading shape, rank >= 1), a kernel float on the host.
// y [N, F] = softmax(scale * x [N, F]) over F.
template <typename T>
void softmax_fwd_impl(Tensor& y, const Tensor& x, float scale) {
  using C = compute_t<T>;
  const int64_t f = x.size(-1);
  const int64_t n = f == 0 ? 0 : x.numel() / f;
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  const C s = static_cast<C>(scale);
#pragma omp parallel
  {
    std::vector<C> e(static_cast<std::size_t>(f));  // one row of exp(), so y may alias x
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const T* xr = xp + r * f;
      T* yr = yp + r * f;
      C m = -std::numeric_limits<C>::infinity();
      for (int64_t j = 0; j < f; ++j) {
        e[j] = s * load<C>(xr[j]);
        m = std::max(m, e[j]);
      }
      if (m == -std::numeric_limits<C>::infinity()) {  // fully masked row: no probability mass
        for (int64_t j = 0; j < f; ++j) yr[j] = store<T>(C(0));
        continue;
      }
      C sum = 0;
      for (int64_t j = 0; j < f; ++j) {
        e[j] = std::exp(e[j] - m);
        sum += e[j];
      }
      const C inv = C(1) / sum;
      for (int64_t j = 0; j < f; ++j) yr[j] = store<T>(e[j] * inv);
    }
  }
}

// dx = scale * y * (dy - sum(dy * y)) row by row.
template <typename T>
void softmax_bwd_impl(Tensor& dx, const Tensor& dy, const Tensor& y, float scale) {
  using C = compute_t<T>;
  const int64_t f = y.size(-1);
  const int64_t n = f == 0 ? 0 : y.numel() / f;
  const T* dyp = dy.data<T>();
  const T* yp = y.data<T>();
  T* dxp = dx.data<T>();
  const C s = static_cast<C>(scale);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const T* dyr = dyp + r * f;
    const T* yr = yp + r * f;
    T* dxr = dxp + r * f;
    C dot = 0;
    for (int64_t j = 0; j < f; ++j) dot += load<C>(dyr[j]) * load<C>(yr[j]);
    for (int64_t j = 0; j < f; ++j) {
      const C yj = load<C>(yr[j]);
      dxr[j] = store<T>(s * yj * (load<C>(dyr[j]) - dot));
    }
  }
}

void softmax_fwd(Tensor& y, const Tensor& x, float scale) {
  const char* op = "softmax_fwd";
  ops::validate_softmax_fwd(kOnHost, op, y, x, scale);
  dispatch_float(x.dtype(), op,
                 [&]<typename T>(std::type_identity<T>) { softmax_fwd_impl<T>(y, x, scale); });
}

void softmax_bwd(Tensor& dx, const Tensor& dy, const Tensor& y, float scale) {
  const char* op = "softmax_bwd";
  ops::validate_softmax_bwd(kOnHost, op, dx, dy, y, scale);
  dispatch_float(y.dtype(), op,
                 [&]<typename T>(std::type_identity<T>) { softmax_bwd_impl<T>(dx, dy, y, scale); });
}

}  // namespace

void register_softmax_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::softmax_fwd>("cpu", &softmax_fwd, "cpu:omp");
  r.register_op<ops::OpId::softmax_bwd>("cpu", &softmax_bwd, "cpu:omp");
}

}  // namespace mg::platforms::cpu
