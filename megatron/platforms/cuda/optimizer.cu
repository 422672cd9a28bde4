// CUDA optimizer and multi-tensor utilities: the AdamW step (apex FusedAdam semantics, see AdamArgs
// in op_args.h), the sum of squares behind the gradient norm, and in-place scaling with an
// overflow flag (apex multi_tensor_l2norm / multi_tensor_scale).
//
// Invariants: adamw_step math is f32 for f32 master params, f64 for f64, with the bias
// corrections computed in f64 on the host and rounded to the math type (as apex and the CPU do).
// l2_norm_sq accumulates in f64: every tensor's grid (a function of its size only) writes block
// partials, and one block adds them in a fixed order, so the result is deterministic.
// multi_tensor_scale checks finiteness after rounding to the storage type and never clears
// found_nonfinite (the caller zeroes it, as apex's amp does).
// Gradient rule: none here (no backward); the optimizer updates param/exp_avg/exp_avg_sq in place.
// Not here: one launch for all tensors (multi_tensor_apply chunk lists, not yet), the
// distributed optimizer's sharding.
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

// ---- adamw_step -----------------------------------------------------------------------------

template <typename C>
struct AdamCoeffs {
  C lr, beta1, beta2, eps, wd, bc1, bc2, grad_scale;
  bool decoupled;
};

// One element's update: p, m, v in place from the gradient g (the ONE definition both kernels
// inline, so the vector kernel computes the scalar one's bits).
template <typename C>
__device__ __forceinline__ void adam_update(C& pi, C& mi, C& vi, C g, const AdamCoeffs<C>& k) {
  C gi = g * k.grad_scale;
  if (!k.decoupled) gi += k.wd * pi;  // L2 mode: decay folded into the gradient
  mi = k.beta1 * mi + (C(1) - k.beta1) * gi;
  vi = k.beta2 * vi + (C(1) - k.beta2) * gi * gi;
  const C denom = sqrt_c(vi / k.bc2) + k.eps;
  C update = (mi / k.bc1) / denom;
  if (k.decoupled) update += k.wd * pi;  // AdamW: decay on the weight itself
  pi = pi - k.lr * update;
}

// p, m, v [n] (dtype pt) updated in place from g [n] (dtype gt); model [n] (dtype mt) optional.
template <typename C>
__global__ void adam_kernel(void* p, void* m, void* v, DType pt, const void* g, DType gt,
                            void* model, DType mt, AdamCoeffs<C> k, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    C pi = load<C>(p, pt, i), mi = load<C>(m, pt, i), vi = load<C>(v, pt, i);
    adam_update<C>(pi, mi, vi, load<C>(g, gt, i), k);
    store<C>(p, pt, i, pi);
    store<C>(m, pt, i, mi);
    store<C>(v, pt, i, vi);
    if (model) store<C>(model, mt, i, pi);
  }
}

// The mixed-precision case of every bf16 run: f32 p, m, v and gradient (main_grad), the bf16 model
// weight (or none), n a multiple of 4 and every pointer aligned: 16-byte loads and stores, no
// per-element dtype dispatch. The scalar kernel ran at 1.7 TB/s on an H200, 19.6 ms of a 168 ms
// llama-1b step (benchmarks/results/2026-11-26-h200-lease.md).
__global__ void adam_f32x4_kernel(float4* p, float4* m, float4* v, const float4* g, uint2* model,
                                  AdamCoeffs<float> k, int64_t n4) {
  for (int64_t i = grid_start(); i < n4; i += grid_stride()) {
    float4 pi = p[i], mi = m[i], vi = v[i];
    const float4 gi = g[i];
    adam_update<float>(pi.x, mi.x, vi.x, gi.x, k);
    adam_update<float>(pi.y, mi.y, vi.y, gi.y, k);
    adam_update<float>(pi.z, mi.z, vi.z, gi.z, k);
    adam_update<float>(pi.w, mi.w, vi.w, gi.w, k);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (model) {
      const auto b = [](float f) { return static_cast<uint32_t>(dmath::f32_to_bf16(f)); };
      model[i] = make_uint2(b(pi.x) | (b(pi.y) << 16), b(pi.z) | (b(pi.w) << 16));
    }
  }
}

bool aligned16(const void* ptr) {
  return ptr == nullptr || reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0;
}

void adamw_step(std::span<const ops::AdamParam> params, const ops::AdamArgs& args) {
  ops::validate_adamw(OnCudaDevice{}, params, args);
  if (params.empty()) return;
  const Device dev = params[0].param.device();

  const double bc1 =
      args.bias_correction ? 1.0 - std::pow(double(args.beta1), double(args.step)) : 1.0;
  const double bc2 =
      args.bias_correction ? 1.0 - std::pow(double(args.beta2), double(args.step)) : 1.0;
  DeviceGuard guard(dev.index);
  cudaStream_t s = current_stream(dev.index);
  for (const auto& a : params) {
    const int64_t n = a.param.numel();
    if (n == 0) continue;
    with_compute(a.param.dtype(), [&](auto tag) {
      using C = decltype(tag);
      const AdamCoeffs<C> k{C(args.lr),  C(args.beta1),        C(args.beta2),
                            C(args.eps), C(args.weight_decay), C(bc1),
                            C(bc2),      C(args.grad_scale),   args.decoupled_weight_decay};
      const bool has_model = a.model_param.defined();
      if constexpr (std::is_same_v<C, float>) {
        void* model = has_model ? a.model_param.raw_data() : nullptr;
        if (a.param.dtype() == DType::f32 && a.grad.dtype() == DType::f32 && n % 4 == 0 &&
            (!has_model || a.model_param.dtype() == DType::bf16) && aligned16(a.param.raw_data()) &&
            aligned16(a.exp_avg.raw_data()) && aligned16(a.exp_avg_sq.raw_data()) &&
            aligned16(a.grad.raw_data()) &&
            (!has_model || reinterpret_cast<std::uintptr_t>(model) % 8 == 0)) {
          adam_f32x4_kernel<<<grid_for(n / 4), kThreads, 0, s>>>(
              static_cast<float4*>(a.param.raw_data()), static_cast<float4*>(a.exp_avg.raw_data()),
              static_cast<float4*>(a.exp_avg_sq.raw_data()),
              static_cast<const float4*>(a.grad.raw_data()), static_cast<uint2*>(model), k, n / 4);
          return;
        }
      }
      adam_kernel<C><<<grid_for(n), kThreads, 0, s>>>(
          a.param.raw_data(), a.exp_avg.raw_data(), a.exp_avg_sq.raw_data(), a.param.dtype(),
          a.grad.raw_data(), a.grad.dtype(), has_model ? a.model_param.raw_data() : nullptr,
          has_model ? a.model_param.dtype() : DType::f32, k, n);
    });
    MG_CUDA_CHECK_LAUNCH();
  }
}

// ---- l2_norm_sq -----------------------------------------------------------------------------

constexpr int64_t kMaxPartialBlocks = 1024;

unsigned int l2_blocks(int64_t n) {
  const int64_t b = (n + 4 * kThreads - 1) / (4 * kThreads);
  return static_cast<unsigned int>(b < 1 ? 1 : (b > kMaxPartialBlocks ? kMaxPartialBlocks : b));
}

// partial[blockIdx.x] = sum over this block's grid-stride elements of x^2, in f64.
__global__ void sum_sq_partial_kernel(double* partial, const void* x, DType t, int64_t n) {
  double s = 0.0;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const double v = load<double>(x, t, i);
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// out[0] = sum of partial[0, count), in a fixed order (one block).
__global__ void sum_partials_kernel(void* out, DType t, const double* partial, int64_t count) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) store<double>(out, t, 0, s);
}

// out [1] f32/f64 = sum over all xs of sum(x^2), accumulated in f64.
void l2_norm_sq(Tensor& out, std::span<const Tensor> xs) {
  ops::validate_l2_norm_sq(OnCudaDevice{}, out, xs);
  int64_t count = 0;
  for (const Tensor& x : xs)
    if (x.numel() > 0) count += l2_blocks(x.numel());
  const int dev = out.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  Scratch partial(dev, static_cast<std::size_t>(count < 1 ? 1 : count) * sizeof(double));
  int64_t at = 0;
  for (const Tensor& x : xs) {
    const int64_t n = x.numel();
    if (n == 0) continue;
    const unsigned int blocks = l2_blocks(n);
    sum_sq_partial_kernel<<<blocks, kThreads, 0, s>>>(partial.as<double>() + at, x.raw_data(),
                                                      x.dtype(), n);
    MG_CUDA_CHECK_LAUNCH();
    at += blocks;
  }
  sum_partials_kernel<<<1, kThreads, 0, s>>>(out.raw_data(), out.dtype(), partial.as<double>(),
                                             count);
  MG_CUDA_CHECK_LAUNCH();
}

// ---- multi_tensor_scale ---------------------------------------------------------------------

// x [n] *= factor; *found = 1 when a stored result is not finite.
template <typename C>
__global__ void scale_kernel(void* x, DType t, C factor, float* found, int64_t n) {
  bool bad = false;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    store<C>(x, t, i, load<C>(x, t, i) * factor);
    // Checked after rounding to the storage type: a finite product may overflow f16/bf16.
    bad |= !isfinite_c(load<C>(x, t, i));
  }
  if (bad && found) *found = 1.0f;  // benign race: every writer stores the same value
}

// xs[i] [*] *= factor in place; found_nonfinite [1] f32 (optional) := 1 if any result is inf/nan.
void multi_tensor_scale(std::span<Tensor> xs, double factor, Tensor& found_nonfinite) {
  ops::validate_multi_tensor_scale(OnCudaDevice{}, xs, found_nonfinite);
  if (xs.empty()) return;
  const int dev = xs[0].device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  float* found =
      found_nonfinite.defined() ? static_cast<float*>(found_nonfinite.raw_data()) : nullptr;
  for (Tensor& x : xs) {
    const int64_t n = x.numel();
    if (n == 0) continue;
    with_compute(x.dtype(), [&](auto tag) {
      using C = decltype(tag);
      scale_kernel<C><<<grid_for(n), kThreads, 0, s>>>(x.raw_data(), x.dtype(),
                                                       static_cast<C>(factor), found, n);
    });
    MG_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void register_optimizer_kernels(plugin::Registry& r) {
  using ops::OpId;
  r.register_op<OpId::adamw_step>(kPlatformName, &adamw_step, "cuda:kernel");
  r.register_op<OpId::l2_norm_sq>(kPlatformName, &l2_norm_sq, "cuda:kernel");
  r.register_op<OpId::multi_tensor_scale>(kPlatformName, &multi_tensor_scale, "cuda:kernel");
}

}  // namespace mg::platforms::cuda
