// CUDA dropout family: dropout_fwd/bwd and the fused bias_dropout_add_fwd/bwd of Megatron's
// transformer layer (y = residual + dropout(x + bias)).
//
// Gradient rule: parameter gradients accumulate (dbias +=), activation gradients are written
// (dx =). Masks are never stored: element i keeps its value iff
// mg::random::dropout_keep(seed, offset + i, p) (philox.h, the same __host__ __device__ code the
// CPU runs, so masks are bit-identical across platforms), and kept values are scaled by 1/(1-p);
// p == 0 is the identity, p must be in [0, 1). x, bias, residual and y share a dtype; dbias may
// be any kernel float dtype (f64 sums in a fixed order, reduce.cuh). Outputs may alias their
// same-shaped inputs (each element is read, then written by the same thread).
// The mask (DropoutMask, dropout_mask.cuh) is shared with norm.cu's fused
// bias_dropout_add_norm_fwd. bf16 / f16 tensors whose sizes are multiples of 8 take vector kernels
// (8 elements per thread, the same per-element expressions); dropout with p == 0 in place is a
// no-op. bias_dropout_add_bwd's dbias sums MaskedGrad terms with reduce.cuh's column sums; for
// bf16/f16 dy with rows 16-byte aligned and a multiple of 8 wide they take the vector path (8
// columns per thread from one 16-byte load, each element still masked by keep(i) and scaled in
// C), bit-identical to the scalar path. The vector kernels take their masks 8 at a time
// (DropoutMask::keep8: each Philox block computed once, 2-3 per 8 elements), and
// bias_dropout_add_bwd with a dbias runs as one pass over dy (bias_dropout_add_bwd_vec_kernel:
// dx and the dbias partials from one load and one mask; the same bits). Not here:
// attention-probability dropout (attention.cu uses the same stream); the scalar kernels still
// compute one Philox block per element (4x the needed work).
#include <initializer_list>

#include "megatron/core/ops/ops.h"
#include "megatron/core/random/philox.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/platforms/cuda/dropout_mask.cuh"
#include "megatron/platforms/cuda/reduce.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

using Mask = DropoutMask;

// out [*] = mask * in [*] * scale
template <typename C>
__global__ void dropout_kernel(void* out, const void* in, DType t, Mask m, C scale, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride())
    store<C>(out, t, i, m.keep(i) ? load<C>(in, t, i) * scale : C(0));
}

// y [N, F] = residual + mask * (x + bias[f]) * scale
template <typename C>
__global__ void bias_dropout_add_kernel(void* y, const void* x, const void* bias,
                                        const void* residual, DType t, Mask m, C scale, int64_t n,
                                        int64_t f) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    C v = C(0);
    if (m.keep(i)) {
      v = load<C>(x, t, i);
      if (bias) v += load<C>(bias, t, i % f);
      v *= scale;
    }
    store<C>(y, t, i, load<C>(residual, t, i) + v);
  }
}

// The 16-bit vector forms of the two kernels above (8 elements per thread, 16-byte loads and
// stores; n, and f with a bias, multiples of 8; pointers 16-byte aligned): the same per-element
// expressions in f32, the mask of the 8 elements from DropoutMask::keep8 (the same decisions as
// keep(i) from 2-3 Philox blocks instead of 8).
__global__ void dropout_vec_kernel(void* out, const void* in, bool bf16, Mask m, float scale,
                                   int64_t n8) {
  for (int64_t v = grid_start(); v < n8; v += grid_stride()) {
    float x[8], o[8];
    bool keep[8];
    load8_half(in, v * 8, bf16, x);
    m.keep8(v * 8, keep);
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = keep[e] ? x[e] * scale : 0.0f;
    store8_half(out, v * 8, bf16, o);
  }
}
__global__ void bias_dropout_add_vec_kernel(void* y, const void* x, const void* bias,
                                            const void* residual, bool bf16, Mask m, float scale,
                                            int64_t n8, int64_t f) {
  for (int64_t v = grid_start(); v < n8; v += grid_stride()) {
    const int64_t i = v * 8;
    float xv[8], rv[8], bv[8] = {}, o[8];
    bool keep[8];
    load8_half(x, i, bf16, xv);
    load8_half(residual, i, bf16, rv);
    if (bias) load8_half(bias, i % f, bf16, bv);
    m.keep8(i, keep);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float d = 0.0f;
      if (keep[e]) {
        d = xv[e];
        if (bias) d += bv[e];
        d *= scale;
      }
      o[e] = rv[e] + d;
    }
    store8_half(y, i, bf16, o);
  }
}
bool vec_ok(DType t, int64_t n, std::initializer_list<const void*> ptrs) {
  if ((t != DType::bf16 && t != DType::f16) || n % 8 != 0) return false;
  for (const void* p : ptrs)
    if (p && !aligned_for_8_halves(p)) return false;
  return true;
}

// The dbias term: mask * dy[r, f] * scale in C, widened.
template <typename C>
struct MaskedGrad {
  const void* dy;
  DType t;
  Mask m;
  C scale;
  int64_t width;
  __device__ double operator()(int64_t r, int64_t f) const {
    const int64_t i = r * width + f;
    return m.keep(i) ? static_cast<double>(load<C>(dy, t, i) * scale) : 0.0;
  }
  // reduce.cuh's vector path: bf16/f16 dy with 16-byte aligned rows; elements i..i+7 from one
  // 16-byte load, each masked by keep(i + k) (DropoutMask::keep8: 2-3 Philox blocks per 8
  // elements instead of 8) and the scalar term's expression.
  bool eight_ok() const {
    return (t == DType::bf16 || t == DType::f16) && width % 8 == 0 && aligned_for_8_halves(dy);
  }
  __device__ void operator()(int64_t r, int64_t f, double (&out)[8]) const {
    const int64_t i = r * width + f;
    float v[8];
    load8_half(dy, i, t == DType::bf16, v);
    bool keep[8];
    m.keep8(i, keep);
#pragma unroll
    for (int k = 0; k < 8; ++k)
      out[k] = keep[k] ? static_cast<double>(static_cast<C>(v[k]) * scale) : 0.0;
  }
};

// bias_dropout_add_bwd in one pass over dy for bf16/f16 (F % 8 == 0, dy and dx 16-byte aligned):
// the layout of reduce.cuh's column_partial8_kernel (thread t of chunk c takes columns
// [8t, 8t + 8) of the chunk's rows, column_chunking's chunks), dy loaded once, the mask from
// keep8 once, dx written (unless kWriteDx is false: p == 0 in place) and MaskedGrad's dbias terms
// added in row order to the thread's f64 partials, which column_finish adds up.
// So dbias and dx are the bits of column_sum_accumulate(MaskedGrad) followed by dropout_vec_kernel
// (which read dy and ran the Philox rounds twice). dx may alias dy: each thread reads its 8
// elements before writing them.
template <bool kWriteDx>
__global__ void bias_dropout_add_bwd_vec_kernel(void* dx, const void* dy, bool bf16, Mask m,
                                                float scale, int64_t rows, int64_t width,
                                                int64_t rows_per_chunk, double* partial) {
  const int64_t f = 8 * (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  if (f >= width) return;
  const int64_t c = blockIdx.y;
  const auto [r0, r1] = chunk_rows(c, rows_per_chunk, rows);
  double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  // Unrolled as column_partial8_kernel: without dx stores (p 0 in place, the layer's backward
  // without dropout) the loads of four rows can be in flight before their adds (same order).
#pragma unroll 4
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t i = r * width + f;
    float v[8], o[8];
    bool keep[8];
    load8_half(dy, i, bf16, v);
    m.keep8(i, keep);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float kept = v[k] * scale;
      s[k] += keep[k] ? static_cast<double>(kept) : 0.0;
      o[k] = keep[k] ? kept : 0.0f;
    }
    if (kWriteDx) store8_half(dx, i, bf16, o);
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) partial[c * width + f + k] = s[k];
}

void launch_dropout(Tensor& out, const Tensor& in, const ops::DropoutArgs& args) {
  const int64_t n = in.numel();
  if (n == 0) return;
  const int dev = in.device().index;
  DeviceGuard guard(dev);
  // p == 0 in place (the backward of a dropout-free layer): nothing to do.
  if (args.p == 0.0f && out.raw_data() == in.raw_data()) return;
  const bool vec = vec_ok(in.dtype(), n, {out.raw_data(), in.raw_data()});
  count_vector_path(VectorPath::dropout, vec);
  if (vec) {
    dropout_vec_kernel<<<grid_for(n / 8), kThreads, 0, current_stream(dev)>>>(
        out.raw_data(), in.raw_data(), in.dtype() == DType::bf16, make_mask(args),
        keep_scale<float>(args.p), n / 8);
    MG_CUDA_CHECK_LAUNCH();
    return;
  }
  with_compute(in.dtype(), [&](auto tag) {
    using C = decltype(tag);
    dropout_kernel<C><<<grid_for(n), kThreads, 0, current_stream(dev)>>>(
        out.raw_data(), in.raw_data(), in.dtype(), make_mask(args), keep_scale<C>(args.p), n);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void dropout_apply(const char* op, Tensor& out, const Tensor& in, const ops::DropoutArgs& args) {
  ops::validate_dropout(OnCudaDevice{}, op, out, in, args);
  launch_dropout(out, in, args);
}

// y [*] = dropout(x [*])
void dropout_fwd(Tensor& y, const Tensor& x, const ops::DropoutArgs& args) {
  dropout_apply("dropout_fwd", y, x, args);
}

// dx [*] = mask * dy [*] / (1 - p)
void dropout_bwd(Tensor& dx, const Tensor& dy, const ops::DropoutArgs& args) {
  dropout_apply("dropout_bwd", dx, dy, args);
}

// y [N, F] = residual [N, F] + dropout(x [N, F] + bias [F]); bias optional (undefined).
void bias_dropout_add_fwd(Tensor& y, const Tensor& x, const Tensor& bias, const Tensor& residual,
                          const ops::DropoutArgs& args) {
  const int64_t f = ops::validate_bias_dropout_add_fwd(OnCudaDevice{}, y, x, bias, residual, args);
  const int64_t n = x.numel();
  if (n == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  const void* bp = bias.defined() ? bias.raw_data() : nullptr;
  const bool vec = vec_ok(x.dtype(), n, {y.raw_data(), x.raw_data(), residual.raw_data(), bp}) &&
                   (!bp || f % 8 == 0);
  count_vector_path(VectorPath::dropout, vec);
  if (vec) {
    bias_dropout_add_vec_kernel<<<grid_for(n / 8), kThreads, 0, current_stream(dev)>>>(
        y.raw_data(), x.raw_data(), bp, residual.raw_data(), x.dtype() == DType::bf16,
        make_mask(args), keep_scale<float>(args.p), n / 8, f);
    MG_CUDA_CHECK_LAUNCH();
    return;
  }
  with_compute(x.dtype(), [&](auto tag) {
    using C = decltype(tag);
    bias_dropout_add_kernel<C><<<grid_for(n), kThreads, 0, current_stream(dev)>>>(
        y.raw_data(), x.raw_data(), bias.defined() ? bias.raw_data() : nullptr, residual.raw_data(),
        x.dtype(), make_mask(args), keep_scale<C>(args.p), n, f);
  });
  MG_CUDA_CHECK_LAUNCH();
}

// dx [N, F] = mask * dy [N, F] / (1 - p); dbias [F] += sum_n dx (optional). d(residual) = dy.
void bias_dropout_add_bwd(Tensor& dx, Tensor& dbias, const Tensor& dy,
                          const ops::DropoutArgs& args) {
  const int64_t f = ops::validate_bias_dropout_add_bwd(OnCudaDevice{}, dx, dbias, dy, args);
  // The one-pass kernel: dx and dy the same data or apart (a partial overlap keeps the two passes,
  // the column sums reading all of dy first).
  const bool apart = dx.raw_data() == dy.raw_data() || !dx.shares_storage_with(dy);
  if (dbias.defined() && dy.numel() > 0 && f > 0 && f % 8 == 0 && apart &&
      vec_ok(dy.dtype(), dy.numel(), {dx.raw_data(), dy.raw_data()})) {
    const int dev = dy.device().index;
    DeviceGuard guard(dev);
    const int64_t rows = dy.numel() / f, v = f / 8;
    const auto [chunks, rows_per_chunk] = column_chunking(rows);
    Scratch partial(dev, static_cast<std::size_t>(chunks * f) * sizeof(double));
    cudaStream_t s = current_stream(dev);
    const int threads = column_partial8_threads(v);
    const dim3 grid(static_cast<unsigned int>((v + threads - 1) / threads),
                    static_cast<unsigned int>(chunks));
    const bool write_dx = !(args.p == 0.0f && dx.raw_data() == dy.raw_data());
    auto launch = [&](auto kernel) {
      kernel<<<grid, threads, 0, s>>>(dx.raw_data(), dy.raw_data(), dy.dtype() == DType::bf16,
                                      make_mask(args), keep_scale<float>(args.p), rows, f,
                                      rows_per_chunk, partial.as<double>());
    };
    if (write_dx)
      launch(bias_dropout_add_bwd_vec_kernel<true>);
    else
      launch(bias_dropout_add_bwd_vec_kernel<false>);
    MG_CUDA_CHECK_LAUNCH();
    count_vector_path(VectorPath::column_sum, true);
    if (write_dx) count_vector_path(VectorPath::dropout, true);
    column_finish(dbias.raw_data(), dbias.dtype(), partial.as<double>(), chunks, f, s);
    return;
  }
  if (dbias.defined()) {
    if (dy.numel() > 0 && f > 0) {
      // Before dx: dx may alias dy.
      const int dev = dy.device().index;
      DeviceGuard guard(dev);
      with_compute(dy.dtype(), [&](auto tag) {
        using C = decltype(tag);
        column_sum_accumulate(
            dbias.raw_data(), dbias.dtype(), dy.numel() / f, f,
            MaskedGrad<C>{dy.raw_data(), dy.dtype(), make_mask(args), keep_scale<C>(args.p), f},
            dev);
      });
    }
  }
  launch_dropout(dx, dy, args);
}

}  // namespace

void register_dropout_kernels(plugin::Registry& r) {
  using ops::OpId;
  r.register_op<OpId::dropout_fwd>(kPlatformName, &dropout_fwd, "cuda:kernel");
  r.register_op<OpId::dropout_bwd>(kPlatformName, &dropout_bwd, "cuda:kernel");
  r.register_op<OpId::bias_dropout_add_fwd>(kPlatformName, &bias_dropout_add_fwd, "cuda:kernel");
  r.register_op<OpId::bias_dropout_add_bwd>(kPlatformName, &bias_dropout_add_bwd, "cuda:kernel");
}

}  // namespace mg::platforms::cuda
