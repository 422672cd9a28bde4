// CPU dropout family: dropout_fwd/bwd and the fused bias_dropout_add_fwd/bwd of Megatron's
// transformer layer (y = residual + dropout(x + bias)).
//
// Gradient rule: parameter gradients accumulate (dbias +=), activation gradients are written
// (dx =). Masks are never stored: element i of an op keeps its value iff
// mg::random::dropout_keep(seed, offset + i, p) (philox.h), so backward regenerates exactly the
// forward's mask from (seed, offset), and a shard run with offset + its global start reproduces
// the slice of the full run. Kept values are scaled by 1/(1-p); p == 0 is the identity.
// Storage f32/bf16/f16 with f32 math, f64 with f64 math; x, bias, residual and y share a dtype,
// dbias may be any kernel float dtype (an f32 main-grad buffer for bf16 weights). The
// bias-dropout-add element loop is dropout_util.h's, shared with the fused
// bias_dropout_add_norm_fwd of norm.cpp (bit-identical sums).
// Not here: attention-probability dropout (attention.cpp uses the same stream).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "megatron/platforms/cpu/dropout_util.h"
#include "megatron/platforms/cpu/kernel_util.h"
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {

namespace {

// Elements per OpenMP work item. A multiple of 4, so chunks start on Philox block boundaries
// when the offset is aligned (not required for correctness: every chunk walks its own counters).
constexpr int64_t kChunk = 1 << 14;

// ---- dropout
// -------------------------------------------------------------------------------------

// y = mask * x / (1 - p); also the backward (dx = mask * dy / (1 - p)): the op is linear in x.
void dropout_apply(const char* op, Tensor& out, const Tensor& in, const ops::DropoutArgs& args) {
  ops::validate_dropout(kOnHost, op, out, in, args);
  const int64_t n = in.numel();
  if (n == 0) return;
  dispatch_float(in.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    using C = compute_t<T>;
    const T* x = in.data<T>();
    T* y = out.data<T>();
    if (args.p == 0.0f) {  // identity (in place when out aliases in)
      if (y != x) std::copy(x, x + n, y);
      return;
    }
    const C scale = keep_scale<C>(args.p);
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (int64_t c = 0; c < chunks; ++c) {
      for_each_keep(args, c * kChunk, std::min(n, (c + 1) * kChunk), [&](int64_t i, bool keep) {
        y[i] = keep ? store<T>(to_f32(x[i]) * scale) : store<T>(C(0));
      });
    }
  });
}

// y [*] = dropout(x [*])
void dropout_fwd(Tensor& y, const Tensor& x, const ops::DropoutArgs& args) {
  dropout_apply("dropout_fwd", y, x, args);
}

// dx [*] = mask * dy [*] / (1 - p)
void dropout_bwd(Tensor& dx, const Tensor& dy, const ops::DropoutArgs& args) {
  dropout_apply("dropout_bwd", dx, dy, args);
}

// ---- bias + dropout + residual
// -------------------------------------------------------------------

// y [N, F] = residual [N, F] + dropout(x [N, F] + bias [F]); bias optional (undefined).
void bias_dropout_add_fwd(Tensor& y, const Tensor& x, const Tensor& bias, const Tensor& residual,
                          const ops::DropoutArgs& args) {
  constexpr const char* op = "bias_dropout_add_fwd";
  const int64_t f = ops::validate_bias_dropout_add_fwd(kOnHost, y, x, bias, residual, args);
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    const T* bp = bias.defined() ? bias.data<T>() : nullptr;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
    for (int64_t c = 0; c < chunks; ++c)
      bias_dropout_add_range(y.data<T>(), x.data<T>(), bp, residual.data<T>(), f, args, c * kChunk,
                             std::min(n, (c + 1) * kChunk));
  });
}

// dx [N, F] = mask * dy [N, F] / (1 - p); dbias [F] += sum_n dx (optional). d(residual) = dy.
void bias_dropout_add_bwd(Tensor& dx, Tensor& dbias, const Tensor& dy,
                          const ops::DropoutArgs& args) {
  constexpr const char* op = "bias_dropout_add_bwd";
  const int64_t f = ops::validate_bias_dropout_add_bwd(kOnHost, dx, dbias, dy, args);
  if (!dbias.defined()) {
    dropout_apply(op, dx, dy, args);
    return;
  }
  const int64_t n = dy.numel();
  if (n == 0) return;
  const int64_t rows = n / f;
  std::vector<double> sum;
  dispatch_float(dy.dtype(), op, [&]<typename T>(std::type_identity<T>) {
    using C = compute_t<T>;
    const T* g = dy.data<T>();
    T* out = dx.data<T>();
    const bool identity = args.p == 0.0f;
    const C scale = identity ? C(1) : keep_scale<C>(args.p);
    // dx and the bias partial sums in one pass; chunk boundaries depend on rows only, so dbias is
    // bit-identical for any thread count.
    chunked_row_reduce<double>(rows, f, sum, [&](int64_t r0, int64_t r1, double* partial) {
      auto one = [&](int64_t i, bool keep) {
        const C v = keep ? static_cast<C>(to_f32(g[i])) * scale : C(0);
        out[i] = store<T>(v);
        partial[i % f] += static_cast<double>(v);
      };
      if (identity) {
        for (int64_t i = r0 * f; i < r1 * f; ++i) one(i, true);
      } else {
        for_each_keep(args, r0 * f, r1 * f, one);
      }
    });
  });
  accumulate_into(dbias, sum, op);
}

}  // namespace

void register_dropout_kernels(plugin::Registry& r) {
  using ops::OpId;
  r.register_op<OpId::dropout_fwd>("cpu", &dropout_fwd, "cpu:omp");
  r.register_op<OpId::dropout_bwd>("cpu", &dropout_bwd, "cpu:omp");
  r.register_op<OpId::bias_dropout_add_fwd>("cpu", &bias_dropout_add_fwd, "cpu:omp");
  r.register_op<OpId::bias_dropout_add_bwd>("cpu", &bias_dropout_add_bwd, "cpu:omp");
}

}  // namespace mg::platforms::cpu
