// CUDA rotary position embeddings (RoPE) on x [S, B, NH, HD] (any head count: q's NH or k's NG),
// Megatron's non-interleaved rotate_half form by default, interleaved on request.
//
// Gradient rule: no parameters; dx is an activation gradient and is written (=).
// Invariants: rot = int(HD * rotary_percent) must be even and > 0; features >= rot pass through.
// Pair i < rot/2 is (i, i + rot/2) (interleaved: (2i, 2i + 1)) and turns by
// pos * base^(-2i/rot). A first kernel builds the cos/sin table [positions, rot/2] with the angle
// in f64 and cos/sin rounded to the compute type (f32, or f64 for f64 storage), as the CPU does; a
// second applies the rotation, one thread per feature pair, so y may alias x and dx may alias dy.
// Positions come from position_ids ([S] or [B, S], i32/i64, on the device) or else are
// s + position_offset. The backward is the rotation by the negative angle.
// Scaled frequencies (RopeArgs::scaling: linear, llama3, YaRN) come from ops::rope_inv_freq on the
// host, as on the CPU. Not here: fused q/k application, dynamic NTK, mrope sections, bshd.
#include <cmath>
#include <vector>

#include "megatron/core/common/host_sync.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/ops/rope_scaling.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

using ops::RopeArgs;

struct RopePlan {
  int64_t s, b, heads, hd, rot;
  bool per_batch_positions;  // position_ids is [B, S]
  int64_t npos;              // rows of the cos/sin table: S or B*S
};

// cs/sn [npos, half] = cos/sin(sign * pos[t] * base^(-2i/rot)), or with scaled frequencies
// (`scaled_inv_freq` [half] from ops::rope_inv_freq, on the device) times the attention factor.
template <typename C>
__global__ void rope_table_kernel(C* cs, C* sn, const void* pos_ids, DType pos_type,
                                  int64_t position_offset, double base, int64_t npos, int64_t half,
                                  int64_t rot, double sign, const double* scaled_inv_freq,
                                  double att) {
  const int64_t total = npos * half;
  for (int64_t k = grid_start(); k < total; k += grid_stride()) {
    const int64_t t = k / half, i = k - t * half;
    const int64_t pos = pos_ids ? load_index(pos_ids, pos_type, t) : t + position_offset;
    if (scaled_inv_freq) {
      const double ang = static_cast<double>(pos) * scaled_inv_freq[i];
      cs[k] = static_cast<C>(cos(ang) * att);
      sn[k] = static_cast<C>(sign * sin(ang) * att);
      continue;
    }
    const double inv_freq = pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rot));
    const double ang = static_cast<double>(pos) * inv_freq;
    cs[k] = static_cast<C>(cos(ang));
    sn[k] = static_cast<C>(sign * sin(ang));
  }
}

// One thread per (row, pair) and per pass-through feature; rows are (s, b, head).
template <typename C>
__global__ void rope_apply_kernel(void* y, const void* x, DType t, const C* cs, const C* sn,
                                  RopePlan p, bool interleaved, bool copy_rest) {
  const int64_t half = p.rot / 2;
  const int64_t per_row = half + (copy_rest ? p.hd - p.rot : 0);
  const int64_t rows = p.s * p.b * p.heads;
  const int64_t total = rows * per_row;
  for (int64_t k = grid_start(); k < total; k += grid_stride()) {
    const int64_t r = k / per_row, q = k - r * per_row;
    const int64_t base = r * p.hd;
    if (q >= half) {  // pass-through feature
      const int64_t e = p.rot + (q - half);
      store<C>(y, t, base + e, load<C>(x, t, base + e));
      continue;
    }
    const int64_t sb = r / p.heads;  // s * B + b
    const int64_t s = sb / p.b, b = sb - s * p.b;
    const int64_t row_t = p.per_batch_positions ? b * p.s + s : s;
    const C c = cs[row_t * half + q], sv = sn[row_t * half + q];
    const int64_t i1 = interleaved ? 2 * q : q;
    const int64_t i2 = interleaved ? 2 * q + 1 : q + half;
    const C x1 = load<C>(x, t, base + i1), x2 = load<C>(x, t, base + i2);
    store<C>(y, t, base + i1, x1 * c - x2 * sv);
    store<C>(y, t, base + i2, x2 * c + x1 * sv);
  }
}

RopePlan plan_rope(const char* op, const char* out_name, const Tensor& out, const char* in_name,
                   const Tensor& in, const RopeArgs& a) {
  const ops::RopeDims d = ops::validate_rope(OnCudaDevice{}, op, out_name, out, in_name, in, a);
  RopePlan p{d.s, d.b, d.heads, d.hd, d.rot, d.per_batch_positions, d.s};
  if (a.position_ids.defined()) {
    const Tensor& ids = a.position_ids;
    p.npos = ids.numel();
  }
  return p;
}

void rope_apply(Tensor& y, const Tensor& x, const RopePlan& p, const RopeArgs& a, double sign) {
  if (x.numel() == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = current_stream(dev);
  const int64_t half = p.rot / 2;
  with_compute(x.dtype(), [&](auto tag) {
    using C = decltype(tag);
    Scratch table(dev, static_cast<std::size_t>(2 * p.npos * half) * sizeof(C));
    C* cs = table.as<C>();
    C* sn = cs + p.npos * half;
    const Tensor& ids = a.position_ids;
    // Scaled frequencies: computed on the host (ops/rope_scaling.h, as the CPU) and uploaded.
    Scratch freq;
    const double* scaled = nullptr;
    if (a.scaling.type != ops::RopeScalingType::none) {
      const std::vector<double> inv = ops::rope_inv_freq(a.base, p.rot, a.scaling);
      freq = Scratch(dev, inv.size() * sizeof(double));
      MG_CUDA_CHECK(cudaMemcpyAsync(freq.get(), inv.data(), inv.size() * sizeof(double),
                                    cudaMemcpyHostToDevice, s));
      count_host_sync(HostSync::kernel);
      MG_CUDA_CHECK(cudaStreamSynchronize(s));  // `inv` is pageable and dies here
      scaled = freq.as<double>();
    }
    rope_table_kernel<C><<<grid_for(p.npos * half), kThreads, 0, s>>>(
        cs, sn, ids.defined() ? ids.raw_data() : nullptr, ids.defined() ? ids.dtype() : DType::i64,
        a.position_offset, static_cast<double>(a.base), p.npos, half, p.rot, sign, scaled,
        ops::rope_attention_scaling(a.scaling));
    MG_CUDA_CHECK_LAUNCH();
    // In place, the pass-through features are already where they belong.
    const bool copy_rest = y.raw_data() != x.raw_data() && p.rot < p.hd;
    const int64_t per_row = half + (copy_rest ? p.hd - p.rot : 0);
    rope_apply_kernel<C><<<grid_for(p.s * p.b * p.heads * per_row), kThreads, 0, s>>>(
        y.raw_data(), x.raw_data(), x.dtype(), cs, sn, p, a.interleaved, copy_rest);
    MG_CUDA_CHECK_LAUNCH();
  });
}

// y [S, B, NH, HD] = rope(x [S, B, NH, HD])
void rope_fwd(Tensor& y, const Tensor& x, const RopeArgs& args) {
  const RopePlan p = plan_rope("rope_fwd", "y", y, "x", x, args);
  MG_CHECK(!overlaps(y, x) || y.raw_data() == x.raw_data(),
           "rope_fwd: y overlaps x at a different offset; alias them exactly or not at all");
  rope_apply(y, x, p, args, +1.0);
}

// dx [S, B, NH, HD] = rope^-1(dy [S, B, NH, HD])
void rope_bwd(Tensor& dx, const Tensor& dy, const RopeArgs& args) {
  const RopePlan p = plan_rope("rope_bwd", "dx", dx, "dy", dy, args);
  MG_CHECK(!overlaps(dx, dy) || dx.raw_data() == dy.raw_data(),
           "rope_bwd: dx overlaps dy at a different offset; alias them exactly or not at all");
  rope_apply(dx, dy, p, args, -1.0);
}

}  // namespace

void register_rope_kernels(plugin::Registry& r) {
  r.register_op<ops::OpId::rope_fwd>(kPlatformName, &rope_fwd, "cuda:kernel");
  r.register_op<ops::OpId::rope_bwd>(kPlatformName, &rope_bwd, "cuda:kernel");
}

}  // namespace mg::platforms::cuda
