// CPU FP8 kernels, the exact emulation of the CUDA path (docs/fp8.md): fp8_cast_transpose and
// fp8_gemm.
//
// fp8_cast_transpose: v = f32(x) * scale rounded to f32, then the saturating round-to-nearest-even
// cast of dtype_math.h (CUDA's __NV_SATFINITE conversion; NaN stays NaN), into q and / or its
// transpose qt; amax = max(amax, max |f32(x)|), a NaN anywhere makes it NaN (the recipe then keeps
// the old scale). Per-thread maxima over fixed row blocks, combined in order: independent of the
// thread count (max is exact anyway).
// fp8_scale_update: fp8/fp8_math.h's slot update over the slots (the reference, also the CUDA
// kernel's per-thread code).
// fp8_gemm: the FP8 values widened to f32 (exact), c = s * (A @ B^T) + beta c with the product in
// f32 by OpenBLAS sgemm (products of FP8 values are exact in f32; only the sums round), s =
// a_scale_inv * b_scale_inv, each output rounded once to C's dtype; an FP8 C is the saturating
// cast of f32(v * out_scale) with v that f32 value, out_amax = max(out_amax, max |v|). Split over
// the OpenMP threads by row blocks of C, never along K.
// fp8_transpose: the bytes moved in 64 x 64 tiles.
// Gradient rule: fp8_gemm with beta = 1 accumulates (weight gradients); everything else writes.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "megatron/core/fp8/fp8_math.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor/dtype_math.h"
#include "megatron/platforms/cpu/fp8_codec.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

void fp8_cast_transpose(Tensor& q, Tensor& qt, Tensor& amax, const Tensor& x, const Tensor& scale) {
  const ops::GemmDims d = ops::validate_fp8_cast_transpose(kOnHost, q, qt, amax, x, scale);
  const int64_t rows = d.m, cols = d.n;
  const float s = *scale.data<float>();
  const DType qd = q.defined() ? q.dtype() : qt.defined() ? qt.dtype() : DType::fp8_e4m3;
  const bool e4m3 = qd == DType::fp8_e4m3;
  uint8_t* qp = q.defined() ? static_cast<uint8_t*>(q.raw_data()) : nullptr;
  uint8_t* qtp = qt.defined() ? static_cast<uint8_t*>(qt.raw_data()) : nullptr;
  constexpr int64_t kBlock = 64;  // rows per block: the blocks depend on the shape only
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
  std::vector<float> partial(static_cast<std::size_t>(std::max<int64_t>(blocks, 1)), 0.0f);
  dispatch_float(x.dtype(), "fp8_cast_transpose", [&]<typename T>(std::type_identity<T>) {
    const T* xp = x.data<T>();
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMinElements)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      float m = 0.0f;
      const int64_t r1 = std::min(rows, (blk + 1) * kBlock);
      for (int64_t r = blk * kBlock; r < r1; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const float v = load<float>(xp[r * cols + c]);
          m = nan_max(m, std::fabs(v));
          if (!qp && !qtp) continue;
          const uint8_t b = to_fp8(v * s, e4m3);
          if (qp) qp[r * cols + c] = b;
          if (qtp) qtp[c * rows + r] = b;
        }
      }
      partial[static_cast<std::size_t>(blk)] = m;
    }
  });
  float m = *amax.data<float>();
  for (float p : partial) m = nan_max(m, p);
  *amax.data<float>() = m;
}

std::vector<float> widen(const Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  const bool e4m3 = t.dtype() == DType::fp8_e4m3;
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = from_fp8(p[i], e4m3);
  return out;
}

void fp8_gemm(Tensor& c, const Tensor& a, const Tensor& b, const Tensor& a_scale_inv,
              const Tensor& b_scale_inv, const ops::Fp8GemmArgs& args) {
  const ops::GemmDims d = ops::validate_fp8_gemm(kOnHost, c, a, b, a_scale_inv, b_scale_inv, args);
  MG_CHECK(!overlaps(c, a) && !overlaps(c, b), "fp8_gemm: C " << c.str() << " overlaps an input");
  const int64_t m = d.m, n = d.n, k = d.k;
  if (m * n == 0) return;
  const float s = *a_scale_inv.data<float>() * *b_scale_inv.data<float>();
  const std::vector<float> af = widen(a), bf = widen(b);
  std::vector<float> acc(static_cast<std::size_t>(m * n), 0.0f);
  if (k > 0) {
    constexpr int64_t kMinBlock = 16;
    const int64_t parts =
        m * n * k < (int64_t{1} << 20)
            ? 1
            : std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), m / kMinBlock));
#pragma omp parallel for schedule(static) num_threads(static_cast <int>(parts)) if (parts > 1)
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t lo = m * p / parts, len = m * (p + 1) / parts - lo;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(len),
                  static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, af.data() + lo * k,
                  static_cast<blasint>(k), bf.data(), static_cast<blasint>(k), 0.0f,
                  acc.data() + lo * n, static_cast<blasint>(n));
    }
  }
  if (c.dtype() == DType::fp8_e4m3 || c.dtype() == DType::fp8_e5m2) {
    // FP8 output: v = s * acc, the cast of f32(v * out_scale), amax of v (fp8_cast_transpose's
    // rule, on the f32 value before any rounding).
    const float so = *args.out_scale.data<float>();
    const bool e4m3 = c.dtype() == DType::fp8_e4m3;
    auto* cp = static_cast<uint8_t*>(c.raw_data());
    float m_all = 0.0f;
    for (int64_t r = 0; r < m; ++r) {  // max is exact: the order does not matter
      for (int64_t j = 0; j < n; ++j) {
        const float v = s * acc[static_cast<std::size_t>(r * n + j)];
        m_all = nan_max(m_all, std::fabs(v));
        cp[r * n + j] = to_fp8(v * so, e4m3);
      }
    }
    if (args.out_amax.defined()) {
      float* ap = args.out_amax.data<float>();
      *ap = nan_max(*ap, m_all);
    }
    return;
  }
  const bool accumulate = args.beta != 0.0f;
  dispatch_float(c.dtype(), "fp8_gemm", [&]<typename T>(std::type_identity<T>) {
    T* cp = c.data<T>();
    const int64_t mn = m * n;
#pragma omp parallel for schedule(static) if (mn >= kParallelMinElements)
    for (int64_t i = 0; i < mn; ++i) {
      const float v = s * acc[static_cast<std::size_t>(i)];
      cp[i] = store_from<T>(accumulate ? v + load<float>(cp[i]) : v);
    }
  });
}

void fp8_transpose(Tensor& qt, const Tensor& q) {
  const ops::GemmDims d = ops::validate_fp8_transpose(kOnHost, qt, q);
  const int64_t rows = d.m, cols = d.n;
  const auto* qp = static_cast<const uint8_t*>(q.raw_data());
  auto* tp = static_cast<uint8_t*>(qt.raw_data());
  constexpr int64_t kTile = 64;  // square tiles: both sides stay in cache
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMinElements)
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c)
          tp[c * rows + r] = qp[r * cols + c];
}

void fp8_scale_update(Tensor& history, Tensor& scale, Tensor& scale_inv,
                      const ops::Fp8ScaleUpdateArgs& args) {
  const ops::GemmDims d = ops::validate_fp8_scale_update(kOnHost, history, scale, scale_inv, args);
  const float pow2 = std::ldexp(1.0f, static_cast<int>(args.margin));
  for (int64_t j = 0; j < d.n; ++j)
    fp8::math::scale_update_slot(history.data<float>(), scale.data<float>(),
                                 scale_inv.data<float>(), d.m, d.n, j, args.fp8_max, pow2,
                                 args.max_history, args.current);
}

}  // namespace

void register_fp8_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::fp8_scale_update>("cpu", &fp8_scale_update, "cpu:host");
  r.register_op<ops::OpId::fp8_cast_transpose>("cpu", &fp8_cast_transpose, "cpu:omp");
  r.register_op<ops::OpId::fp8_gemm>("cpu", &fp8_gemm, "cpu:openblas");
  r.register_op<ops::OpId::fp8_transpose>("cpu", &fp8_transpose, "cpu:omp");
}

}  // namespace mg::platforms::cpu
