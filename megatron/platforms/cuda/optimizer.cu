// CUDA optimizer and multi-tensor utilities: the AdamW step (apex FusedAdam semantics, see AdamArgs
// in op_args.h), the sum of squares behind the gradient norm, and in-place scaling with an
// overflow flag (apex multi_tensor_l2norm / multi_tensor_scale).
//
// Invariants: adamw_step math is f32 for f32 master params, f64 for f64, with the bias
// corrections computed in f64 on the host and rounded to the math type (as apex and the CPU do).
// All three take the tensors of a call in multi-tensor launches (tables of up to 48 tensors cut
// into 32768-element chunks, one block a chunk; adamw_step only for its f32 mixed-precision case,
// the other dtypes one launch per tensor). l2_norm_sq accumulates in f64: every chunk writes a
// block partial (the partition a function of the tensors' sizes only), and one block adds them in
// a fixed order, so the result is deterministic. multi_tensor_scale checks finiteness after
// rounding to the storage type and never clears found_nonfinite (the caller zeroes it, as apex's
// amp does).
// Gradient rule: none here (no backward); the optimizer updates param/exp_avg/exp_avg_sq in place.
// Not here: the distributed optimizer's sharding; the multi-tensor launches have not yet run on a
// GPU (optimizer_test ManyTensors* are their CUDA cases).
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

// ---- multi-tensor launches ------------------------------------------------------------------
//
// The tensors of one call go to a kernel as a by-value table (apex multi_tensor_apply's idea):
// each tensor is cut into chunks of kMtChunk elements, one block per chunk, so one launch serves
// up to kMtTensors tensors whatever their sizes. One launch per tensor cost a launch and a ramp
// each: gpt2-124m's 148 gradients made l2_norm_sq 0.97 ms of a 125 ms mb-64 step (0.5 GB read), and
// its adamw_step 1.41 ms, on an H200 (session 21's op table). Chunk starts are multiples of 4, so a
// 16-byte aligned f32 tensor stays aligned in every chunk.
constexpr int64_t kMtChunk = 32768;
constexpr int kMtTensors = 48;

struct MtTensor {
  void* ptr[5];  // the kernel's operands of this tensor (unused slots null)
  int64_t n;
  int64_t first_chunk;  // this launch's chunk index of the tensor's chunk 0
  DType dtype;          // of ptr[0]
  bool vec;             // ptr[0..) 16-byte aligned f32 (the float4 body; the tail is scalar)
};
struct MtTable {
  MtTensor t[kMtTensors];
  int count;
};
static_assert(sizeof(MtTable) <= 4000, "a kernel parameter must stay within 4 KB");

// This block's tensor and its element range [lo, hi).
struct MtChunk {
  const MtTensor* t;
  int64_t lo, hi;
};
__device__ __forceinline__ MtChunk mt_chunk(const MtTable& table) {
  const int64_t b = blockIdx.x;
  int i = 0;
  while (i + 1 < table.count && table.t[i + 1].first_chunk <= b) ++i;
  const MtTensor& t = table.t[i];
  const int64_t lo = (b - t.first_chunk) * kMtChunk;
  return {&t, lo, lo + kMtChunk < t.n ? lo + kMtChunk : t.n};
}

int64_t mt_chunks(int64_t n) {
  return (n + kMtChunk - 1) / kMtChunk;
}

// Calls launch(table, chunks) for consecutive groups of the entries (each with n > 0), up to
// kMtTensors tensors a launch.
template <typename F>
void for_mt_tables(std::vector<MtTensor>& entries, F&& launch) {
  std::size_t at = 0;
  while (at < entries.size()) {
    MtTable table{};
    int64_t chunks = 0;
    while (at < entries.size() && table.count < kMtTensors) {
      MtTensor e = entries[at++];
      e.first_chunk = chunks;
      chunks += mt_chunks(e.n);
      table.t[table.count++] = e;
    }
    launch(table, chunks);
  }
}

// device_util.cuh's 16-byte check, also true for an absent operand (no model weight).
bool aligned16(const void* ptr) {
  return ptr == nullptr || aligned_16_bytes(ptr);
}

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

// The mixed-precision case of every bf16 run (f32 p, m, v and gradient (main_grad), the bf16 model
// weight or none, 16-byte aligned) over a table of tensors (ptr = p, m, v, g, model or null): the
// float4 body of each chunk, then the tensor's last n % 4 elements one at a time, with the same
// adam_update and bf16 rounding as the scalar kernel (the same bits). The scalar kernel ran at
// 1.7 TB/s on an H200, 19.6 ms of a 168 ms llama-1b step
// (benchmarks/results/2026-11-26-h200-lease.md); a float4 kernel per tensor at 3.96 TB/s on
// llama-1b, 2.6 TB/s on gpt2-124m's 148 tensors.
__global__ void adam_f32_mt_kernel(MtTable table, AdamCoeffs<float> k) {
  const MtChunk c = mt_chunk(table);
  auto* p = static_cast<float*>(c.t->ptr[0]);
  auto* m = static_cast<float*>(c.t->ptr[1]);
  auto* v = static_cast<float*>(c.t->ptr[2]);
  const auto* g = static_cast<const float*>(c.t->ptr[3]);
  auto* model = static_cast<uint16_t*>(c.t->ptr[4]);
  const int64_t lo4 = c.lo / 4, hi4 = c.hi / 4;  // whole float4s of the chunk
  for (int64_t i = lo4 + threadIdx.x; i < hi4; i += blockDim.x) {
    float4 pi = reinterpret_cast<float4*>(p)[i], mi = reinterpret_cast<float4*>(m)[i],
           vi = reinterpret_cast<float4*>(v)[i];
    const float4 gi = reinterpret_cast<const float4*>(g)[i];
    adam_update<float>(pi.x, mi.x, vi.x, gi.x, k);
    adam_update<float>(pi.y, mi.y, vi.y, gi.y, k);
    adam_update<float>(pi.z, mi.z, vi.z, gi.z, k);
    adam_update<float>(pi.w, mi.w, vi.w, gi.w, k);
    reinterpret_cast<float4*>(p)[i] = pi;
    reinterpret_cast<float4*>(m)[i] = mi;
    reinterpret_cast<float4*>(v)[i] = vi;
    if (model) {
      const auto b = [](float f) { return static_cast<uint32_t>(dmath::f32_to_bf16(f)); };
      reinterpret_cast<uint2*>(model)[i] =
          make_uint2(b(pi.x) | (b(pi.y) << 16), b(pi.z) | (b(pi.w) << 16));
    }
  }
  for (int64_t i = hi4 * 4 + threadIdx.x; i < c.hi; i += blockDim.x) {  // at most 3, last chunk
    adam_update<float>(p[i], m[i], v[i], g[i], k);
    if (model) model[i] = dmath::f32_to_bf16(p[i]);
  }
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
  // The mixed-precision case (f32 p, m, v and gradient, bf16 model weight or none, aligned): all
  // such tensors in multi-tensor launches; the others one launch each.
  std::vector<MtTensor> f32_entries;
  std::vector<bool> in_table(params.size(), false);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ops::AdamParam& a = params[i];
    const bool has_model = a.model_param.defined();
    void* model = has_model ? a.model_param.raw_data() : nullptr;
    if (a.param.numel() > 0 && a.param.dtype() == DType::f32 && a.grad.dtype() == DType::f32 &&
        (!has_model || a.model_param.dtype() == DType::bf16) && aligned16(a.param.raw_data()) &&
        aligned16(a.exp_avg.raw_data()) && aligned16(a.exp_avg_sq.raw_data()) &&
        aligned16(a.grad.raw_data()) &&
        (!has_model || reinterpret_cast<std::uintptr_t>(model) % 8 == 0)) {
      MtTensor e{};
      e.ptr[0] = a.param.raw_data();
      e.ptr[1] = a.exp_avg.raw_data();
      e.ptr[2] = a.exp_avg_sq.raw_data();
      e.ptr[3] = a.grad.raw_data();
      e.ptr[4] = model;
      e.n = a.param.numel();
      e.dtype = DType::f32;
      e.vec = true;
      f32_entries.push_back(e);
      in_table[i] = true;
    }
  }
  if (!f32_entries.empty()) {
    const AdamCoeffs<float> k{
        float(args.lr),  float(args.beta1),        float(args.beta2),
        float(args.eps), float(args.weight_decay), float(bc1),
        float(bc2),      float(args.grad_scale),   args.decoupled_weight_decay};
    for_mt_tables(f32_entries, [&](const MtTable& table, int64_t chunks) {
      adam_f32_mt_kernel<<<static_cast<unsigned int>(chunks), kThreads, 0, s>>>(table, k);
      MG_CUDA_CHECK_LAUNCH();
    });
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ops::AdamParam& a = params[i];
    const int64_t n = a.param.numel();
    if (n == 0 || in_table[i]) continue;
    with_compute(a.param.dtype(), [&](auto tag) {
      using C = decltype(tag);
      const AdamCoeffs<C> k{C(args.lr),  C(args.beta1),        C(args.beta2),
                            C(args.eps), C(args.weight_decay), C(bc1),
                            C(bc2),      C(args.grad_scale),   args.decoupled_weight_decay};
      const bool has_model = a.model_param.defined();
      adam_kernel<C><<<grid_for(n), kThreads, 0, s>>>(
          a.param.raw_data(), a.exp_avg.raw_data(), a.exp_avg_sq.raw_data(), a.param.dtype(),
          a.grad.raw_data(), a.grad.dtype(), has_model ? a.model_param.raw_data() : nullptr,
          has_model ? a.model_param.dtype() : DType::f32, k, n);
    });
    MG_CUDA_CHECK_LAUNCH();
  }
}

// ---- l2_norm_sq -----------------------------------------------------------------------------

// partial[blockIdx.x] = the sum of x^2 over this block's chunk, in f64: each thread adds its
// elements (float4s in order x, y, z, w for an aligned f32 tensor) in ascending order, then the
// block's fixed-order reduction. The partition depends only on the tensors' sizes: deterministic.
__global__ void sum_sq_mt_kernel(double* partial, MtTable table) {
  const MtChunk c = mt_chunk(table);
  const void* x = c.t->ptr[0];
  double s = 0.0;
  int64_t scalar_from = c.lo;
  if (c.t->vec) {
    const auto* x4 = static_cast<const float4*>(x);
    const int64_t hi4 = c.hi / 4;
#pragma unroll 4
    for (int64_t i = c.lo / 4 + threadIdx.x; i < hi4; i += blockDim.x) {
      const float4 v = x4[i];
      s += static_cast<double>(v.x) * v.x;
      s += static_cast<double>(v.y) * v.y;
      s += static_cast<double>(v.z) * v.z;
      s += static_cast<double>(v.w) * v.w;
    }
    scalar_from = hi4 * 4;
  }
  for (int64_t i = scalar_from + threadIdx.x; i < c.hi; i += blockDim.x) {
    const double v = load<double>(x, c.t->dtype, i);
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// out[0] = sum of partial[0, count), in a fixed order (one block; llama-1b's 1.1G gradients make
// 34K partials, so each thread's loads are unrolled to be in flight together, the adds in order).
__global__ void sum_partials_kernel(void* out, DType t, const double* partial, int64_t count) {
  double s = 0.0;
#pragma unroll 8
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) store<double>(out, t, 0, s);
}

// One table entry per non-empty tensor (ptr[0] = its data).
std::vector<MtTensor> mt_entries(std::span<const Tensor> xs) {
  std::vector<MtTensor> entries;
  for (const Tensor& x : xs) {
    if (!x.defined() || x.numel() == 0) continue;
    MtTensor e{};
    e.ptr[0] = const_cast<void*>(x.raw_data());
    e.n = x.numel();
    e.dtype = x.dtype();
    e.vec = x.dtype() == DType::f32 && aligned16(x.raw_data());
    entries.push_back(e);
  }
  return entries;
}

// out [1] f32/f64 = sum over all xs of sum(x^2), accumulated in f64.
void l2_norm_sq(Tensor& out, std::span<const Tensor> xs) {
  ops::validate_l2_norm_sq(OnCudaDevice{}, out, xs);
  std::vector<MtTensor> entries = mt_entries(xs);
  int64_t count = 0;
  for (const MtTensor& e : entries) count += mt_chunks(e.n);
  const int dev = out.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  Scratch partial(dev, static_cast<std::size_t>(count < 1 ? 1 : count) * sizeof(double));
  int64_t at = 0;
  for_mt_tables(entries, [&](const MtTable& table, int64_t chunks) {
    sum_sq_mt_kernel<<<static_cast<unsigned int>(chunks), kThreads, 0, s>>>(
        partial.as<double>() + at, table);
    MG_CUDA_CHECK_LAUNCH();
    at += chunks;
  });
  sum_partials_kernel<<<1, kThreads, 0, s>>>(out.raw_data(), out.dtype(), partial.as<double>(),
                                             count);
  MG_CUDA_CHECK_LAUNCH();
}

// ---- multi_tensor_scale ---------------------------------------------------------------------

// x *= factor over this block's chunk (math in C); *found = 1 when a stored result is not finite
// (checked after rounding to the storage type: a finite product may overflow f16/bf16).
template <typename C>
__global__ void scale_mt_kernel(MtTable table, C factor, float* found) {
  const MtChunk c = mt_chunk(table);
  void* x = c.t->ptr[0];
  bool bad = false;
  int64_t scalar_from = c.lo;
  if constexpr (std::is_same_v<C, float>) {
    if (c.t->vec) {
      auto* x4 = static_cast<float4*>(x);
      const int64_t hi4 = c.hi / 4;
      for (int64_t i = c.lo / 4 + threadIdx.x; i < hi4; i += blockDim.x) {
        float4 v = x4[i];
        v.x *= factor;
        v.y *= factor;
        v.z *= factor;
        v.w *= factor;
        x4[i] = v;
        bad |= !isfinite_c(v.x) || !isfinite_c(v.y) || !isfinite_c(v.z) || !isfinite_c(v.w);
      }
      scalar_from = hi4 * 4;
    }
  }
  const DType t = c.t->dtype;
  for (int64_t i = scalar_from + threadIdx.x; i < c.hi; i += blockDim.x) {
    store<C>(x, t, i, load<C>(x, t, i) * factor);
    bad |= !isfinite_c(load<C>(x, t, i));
  }
  if (bad && found) *found = 1.0f;  // benign race: every writer stores the same value
}

// xs[i] [*] *= factor in place; found_nonfinite [1] f32 (optional) := 1 if any result is inf/nan.
// One table per compute type: f64 tensors scale in double, the others in float.
void multi_tensor_scale(std::span<Tensor> xs, double factor, Tensor& found_nonfinite) {
  ops::validate_multi_tensor_scale(OnCudaDevice{}, xs, found_nonfinite);
  if (xs.empty()) return;
  const int dev = xs[0].device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  float* found =
      found_nonfinite.defined() ? static_cast<float*>(found_nonfinite.raw_data()) : nullptr;
  std::vector<MtTensor> entries = mt_entries(std::span<const Tensor>(xs.data(), xs.size()));
  std::vector<MtTensor> f64, other;
  for (const MtTensor& e : entries) (e.dtype == DType::f64 ? f64 : other).push_back(e);
  for_mt_tables(other, [&](const MtTable& table, int64_t chunks) {
    scale_mt_kernel<float><<<static_cast<unsigned int>(chunks), kThreads, 0, s>>>(
        table, static_cast<float>(factor), found);
    MG_CUDA_CHECK_LAUNCH();
  });
  for_mt_tables(f64, [&](const MtTable& table, int64_t chunks) {
    scale_mt_kernel<double>
        <<<static_cast<unsigned int>(chunks), kThreads, 0, s>>>(table, factor, found);
    MG_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void register_optimizer_kernels(plugin::Registry& r) {
  using ops::OpId;
  r.register_op<OpId::adamw_step>(kPlatformName, &adamw_step, "cuda:kernel");
  r.register_op<OpId::l2_norm_sq>(kPlatformName, &l2_norm_sq, "cuda:kernel");
  r.register_op<OpId::multi_tensor_scale>(kPlatformName, &multi_tensor_scale, "cuda:kernel");
}

}  // namespace mg::platforms::cuda
