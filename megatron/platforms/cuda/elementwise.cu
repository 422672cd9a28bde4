// CUDA element-wise linear-algebra helpers: bias_add, bias_grad, axpy, fill.
//
// Gradient rule: parameter gradients accumulate (+=: bias_grad); activation gradients are written
// (=). axpy is the accumulation primitive itself (y += alpha * x).
// Semantics as the CPU kernels (megatron/platforms/cpu/gemm.cpp): y and bias, x and y, may differ
// in float dtype; math in f32, or f64 when an operand is f64; bias_grad sums in f64 in a fixed
// order (reduce.cuh). fill converts the value exactly as Tensor::to does and accepts any dtype.
// bias_grad of bf16/f16 rows takes reduce.cuh's 8-column vector path (the same bits); this file
// keeps the vector-path counters (vector_path_stats). axpy of f32 / bf16 / f16 data aligned to 4
// elements takes 4 elements a thread (the same bits). Not here: a vectorised bias_add (not yet).
#include <atomic>
#include <cstring>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/platforms/cuda/reduce.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

// [path][vector]: VectorPathStats.
std::atomic<uint64_t> g_vector_path_calls[5][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}, {0, 0}};

// y [N, F] += bias [F]
template <typename C>
__global__ void bias_add_kernel(void* y, DType ty, const void* bias, DType tb, int64_t n,
                                int64_t f) {
  for (int64_t i = grid_start(); i < n; i += grid_stride())
    store<C>(y, ty, i, load<C>(y, ty, i) + load<C>(bias, tb, i % f));
}

// One element of axpy: the expression both axpy kernels inline, so they give the same bits.
template <typename C>
__device__ __forceinline__ C axpy_one(C y, C x, C alpha) {
  return y + alpha * x;
}

template <typename C>
__global__ void axpy_kernel(void* y, DType ty, const void* x, DType tx, C alpha, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride())
    store<C>(y, ty, i, axpy_one<C>(load<C>(y, ty, i), load<C>(x, tx, i), alpha));
}

// Four consecutive f32 / bf16 / f16 elements [4 i4, 4 i4 + 4) of p (16 bytes for f32, 8 for the
// halves, aligned), widened to f32 / rounded from f32 as load<float> / store<float> do.
__device__ __forceinline__ void load4(const void* p, DType t, int64_t i4, float (&o)[4]) {
  if (t == DType::f32) {
    const float4 v = static_cast<const float4*>(p)[i4];
    o[0] = v.x, o[1] = v.y, o[2] = v.z, o[3] = v.w;
    return;
  }
  const uint2 w = static_cast<const uint2*>(p)[i4];
  const uint32_t h[4] = {w.x & 0xffffu, w.x >> 16, w.y & 0xffffu, w.y >> 16};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const auto b = static_cast<uint16_t>(h[k]);
    o[k] = t == DType::bf16 ? dmath::bf16_to_f32(b) : dmath::f16_to_f32(b);
  }
}
__device__ __forceinline__ void store4(void* p, DType t, int64_t i4, const float (&v)[4]) {
  if (t == DType::f32) {
    static_cast<float4*>(p)[i4] = make_float4(v[0], v[1], v[2], v[3]);
    return;
  }
  uint32_t h[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    h[k] = t == DType::bf16 ? dmath::f32_to_bf16(v[k]) : dmath::f32_to_f16(v[k]);
  static_cast<uint2*>(p)[i4] = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
}

// axpy_kernel<float> four elements a thread (y and x f32 / bf16 / f16, each aligned to 4
// elements), the last n % 4 one at a time: the same axpy_one, so the same bits. The scalar kernel
// (runtime dtype per element): 0.6 ms of a gpt2-124m mb-64 step in 25 calls, the QKV weight and
// bias gradients' f32 adds and the position embedding's bf16 add (session 21's op table).
__global__ void axpy4_kernel(void* y, DType ty, const void* x, DType tx, float alpha, int64_t n) {
  const int64_t n4 = n / 4;
  for (int64_t i4 = grid_start(); i4 < n4; i4 += grid_stride()) {
    float yv[4], xv[4];
    load4(y, ty, i4, yv);
    load4(x, tx, i4, xv);
#pragma unroll
    for (int k = 0; k < 4; ++k) yv[k] = axpy_one<float>(yv[k], xv[k], alpha);
    store4(y, ty, i4, yv);
  }
  for (int64_t i = 4 * n4 + grid_start(); i < n; i += grid_stride())
    store<float>(y, ty, i, axpy_one<float>(load<float>(y, ty, i), load<float>(x, tx, i), alpha));
}

template <typename U>
__global__ void fill_kernel(U* x, U value, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) x[i] = value;
}

// y [N, F] += bias [F]
void bias_add(Tensor& y, const Tensor& bias) {
  const int64_t f = ops::validate_bias_add(OnCudaDevice{}, y, bias), n = y.numel();
  if (f == 0 || n == 0) return;
  const int dev = y.device().index;
  DeviceGuard guard(dev);
  with_compute(y.dtype(), [&](auto c) {
    using C = decltype(c);
    bias_add_kernel<C><<<grid_for(n), kThreads, 0, current_stream(dev)>>>(
        y.raw_data(), y.dtype(), bias.raw_data(), bias.dtype(), n, f);
  });
  MG_CUDA_CHECK_LAUNCH();
}

// dbias [F] += sum_n dy [N, F]
void bias_grad(Tensor& dbias, const Tensor& dy) {
  const int64_t f = ops::validate_bias_grad(OnCudaDevice{}, dbias, dy);
  if (f == 0) return;
  const int64_t rows = dy.numel() / f;
  const int dev = dy.device().index;
  DeviceGuard guard(dev);
  column_sum_accumulate(dbias.raw_data(), dbias.dtype(), rows, f,
                        MatrixTerm{dy.raw_data(), dy.dtype(), f}, dev);
}

// y [*] += alpha * x [*]; x and y may differ in float dtype (an f32 grad buffer, a bf16 grad).
void axpy(Tensor& y, const Tensor& x, float alpha) {
  ops::validate_axpy(OnCudaDevice{}, y, x);
  const int64_t n = y.numel();
  if (n == 0) return;
  const int dev = y.device().index;
  DeviceGuard guard(dev);
  const bool f64 = y.dtype() == DType::f64 || x.dtype() == DType::f64;
  // 4 elements a thread where both are f32 / bf16 / f16 and aligned to 4 elements.
  auto vec4 = [](const Tensor& t) {
    const bool half = t.dtype() == DType::bf16 || t.dtype() == DType::f16;
    return (t.dtype() == DType::f32 && aligned_16_bytes(t.raw_data())) ||
           (half && reinterpret_cast<std::uintptr_t>(t.raw_data()) % 8 == 0);
  };
  if (vec4(y) && vec4(x)) {
    axpy4_kernel<<<grid_for((n + 3) / 4), kThreads, 0, current_stream(dev)>>>(
        y.raw_data(), y.dtype(), x.raw_data(), x.dtype(), alpha, n);
    MG_CUDA_CHECK_LAUNCH();
    return;
  }
  with_compute(f64 ? DType::f64 : DType::f32, [&](auto c) {
    using C = decltype(c);
    axpy_kernel<C><<<grid_for(n), kThreads, 0, current_stream(dev)>>>(
        y.raw_data(), y.dtype(), x.raw_data(), x.dtype(), static_cast<C>(alpha), n);
  });
  MG_CUDA_CHECK_LAUNCH();
}

// x [*] = value; any dtype (integers and fp8 included), converted as Tensor::to converts.
void fill(Tensor& x, double value) {
  constexpr const char* op = "fill";
  check_cuda(op, "x", x);
  const int64_t n = x.numel();
  if (n == 0) return;
  unsigned char elem[8] = {};
  convert_host(elem, x.dtype(), &value, DType::f64, 1);
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  auto launch = [&](auto tag) {
    using U = decltype(tag);
    U v;
    std::memcpy(&v, elem, sizeof(U));
    fill_kernel<U><<<grid_for(n), kThreads, 0, s>>>(static_cast<U*>(x.raw_data()), v, n);
  };
  if (dtype_size(x.dtype()) == 1) {
    MG_CUDA_CHECK(cudaMemsetAsync(x.raw_data(), elem[0], static_cast<std::size_t>(n), s));
    return;
  }
  with_element_bits(x.dtype(), op, launch);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

void register_elementwise_kernels(plugin::Registry& r) {
  using ops::OpId;
  r.register_op<OpId::bias_add>(kPlatformName, &bias_add, "cuda:kernel");
  r.register_op<OpId::bias_grad>(kPlatformName, &bias_grad, "cuda:kernel");
  r.register_op<OpId::axpy>(kPlatformName, &axpy, "cuda:kernel");
  r.register_op<OpId::fill>(kPlatformName, &fill, "cuda:kernel");
}

void count_vector_path(VectorPath path, bool vector) {
  g_vector_path_calls[static_cast<int>(path)][vector ? 1 : 0].fetch_add(1,
                                                                        std::memory_order_relaxed);
}

void column_finish_with(Tensor& out, const Tensor& partial) {
  MG_CHECK(partial.dtype() == DType::f64 && partial.dim() == 2,
           "column_finish_with: partial must be an f64 [chunks, width], got " << partial.str());
  const int64_t chunks = partial.size(0), width = partial.size(1);
  MG_CHECK(out.numel() == width && out.device() == partial.device() &&
               partial.device().type == DeviceType::cuda,
           "column_finish_with: out " << out.str() << " must be a [" << width
                                      << "] on partial's CUDA device");
  const int dev = out.device().index;
  DeviceGuard guard(dev);
  column_finish(out.raw_data(), out.dtype(), partial.data<double>(), chunks, width,
                current_stream(dev));
}

VectorPathStats vector_path_stats() {
  auto at = [](VectorPath p, bool vector) {
    return g_vector_path_calls[static_cast<int>(p)][vector ? 1 : 0].load();
  };
  return {at(VectorPath::column_sum, true),   at(VectorPath::column_sum, false),
          at(VectorPath::ce_rows, true),      at(VectorPath::ce_rows, false),
          at(VectorPath::dropout, true),      at(VectorPath::dropout, false),
          at(VectorPath::ce_row_cache, true), at(VectorPath::ce_online, true)};
}

}  // namespace mg::platforms::cuda

extern "C" mg::platforms::cuda::VectorPathStats mg_cuda_vector_path_stats() {
  return mg::platforms::cuda::vector_path_stats();
}
extern "C" void mg_cuda_column_finish_with(mg::Tensor& out, const mg::Tensor& partial) {
  mg::platforms::cuda::column_finish_with(out, partial);
}
