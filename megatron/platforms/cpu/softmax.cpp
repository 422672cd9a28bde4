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
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

// Calls f(T{}) with T the storage type of a floating dtype the kernels support.
template <typename F>
void dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f64:
      f(double{});
      break;
    case DType::f32:
      f(float{});
      break;
    case DType::bf16:
      f(bf16_t{});
      break;
    case DType::f16:
      f(f16_t{});
      break;
    default:
      MG_THROW(op << ": unsupported dtype " << dtype_name(dt) << " (expected f64, f32, bf16, f16)");
  }
}

void check_like(const char* op, const char* name, const Tensor& t, const char* ref_name,
                const Tensor& ref) {
  MG_CHECK(t.defined(), op << ": " << name << " is undefined");
  MG_CHECK(t.is_host(), op << ": " << name << " is on " << t.device() << ", expected cpu");
  MG_CHECK(t.dtype() == ref.dtype(), op << ": " << name << " has dtype " << dtype_name(t.dtype())
                                        << " but " << ref_name << " has "
                                        << dtype_name(ref.dtype()));
  MG_CHECK(t.shape() == ref.shape(), op << ": " << name << " " << shape_str(t.shape())
                                        << " does not match " << ref_name << " "
                                        << shape_str(ref.shape()));
}

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
        e[j] = s * static_cast<C>(to_f32(xr[j]));
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
    for (int64_t j = 0; j < f; ++j)
      dot += static_cast<C>(to_f32(dyr[j])) * static_cast<C>(to_f32(yr[j]));
    for (int64_t j = 0; j < f; ++j) {
      const C yj = static_cast<C>(to_f32(yr[j]));
      dxr[j] = store<T>(s * yj * (static_cast<C>(to_f32(dyr[j])) - dot));
    }
  }
}

void softmax_fwd(Tensor& y, const Tensor& x, float scale) {
  MG_CHECK(x.defined() && x.dim() >= 1, "softmax_fwd: x must be a defined tensor of rank >= 1");
  check_like("softmax_fwd", "x", x, "x", x);
  check_like("softmax_fwd", "y", y, "x", x);
  MG_CHECK(std::isfinite(scale), "softmax_fwd: scale " << scale << " is not finite");
  dispatch_float(x.dtype(), "softmax_fwd",
                 [&](auto tag) { softmax_fwd_impl<decltype(tag)>(y, x, scale); });
}

void softmax_bwd(Tensor& dx, const Tensor& dy, const Tensor& y, float scale) {
  MG_CHECK(y.defined() && y.dim() >= 1, "softmax_bwd: y must be a defined tensor of rank >= 1");
  check_like("softmax_bwd", "y", y, "y", y);
  check_like("softmax_bwd", "dy", dy, "y", y);
  check_like("softmax_bwd", "dx", dx, "y", y);
  MG_CHECK(std::isfinite(scale), "softmax_bwd: scale " << scale << " is not finite");
  dispatch_float(y.dtype(), "softmax_bwd",
                 [&](auto tag) { softmax_bwd_impl<decltype(tag)>(dx, dy, y, scale); });
}

}  // namespace

void register_softmax_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::softmax_fwd>("cpu", &softmax_fwd, "cpu:omp");
  r.register_op<ops::OpId::softmax_bwd>("cpu", &softmax_bwd, "cpu:omp");
}

}  // namespace mg::platforms::cpu
