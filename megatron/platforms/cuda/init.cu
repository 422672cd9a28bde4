// CUDA weight initialisation from the counter-based Philox streams (philox.h):
//   init_normal : x[i] = mean + std * normal(seed, offset + i)
//   init_uniform: x[i] = low + (high - low) * uniform(seed, offset + i)   (InitArgs mean/std =
//   low/high)
// Each value is computed in f64 (explicitly rounded multiply and add, so no FMA contraction makes
// it differ from the host's) and rounded to x's dtype as convert_host does (narrow floats via
// f32); any float dtype, fp8 included. Element i draws counter offset + i, so a tensor-parallel
// shard initialised with offset + (its global start) equals the slice of the full tensor.
// The Philox bits are those of the CPU (same header); normal() also uses the device's f64 log,
// sqrt, sin and cos, which may differ from glibc's in the last ulp of the f64 draw (invisible
// after rounding to f32 in all but rare ties).
// Gradient rule: none (no backward).
// Not here: the choice of std per layer (init_method_normal / scaled_init_method_normal).
#include <cmath>

#include "megatron/core/ops/ops.h"
#include "megatron/core/random/philox.h"
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {

namespace {

__global__ void init_normal_kernel(void* x, DType t, double mean, double std, uint64_t seed,
                                   uint64_t offset, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const double z = random::normal(seed, offset + static_cast<uint64_t>(i));
    dmath::store_from_double(x, t, i, __dadd_rn(mean, __dmul_rn(std, z)));
  }
}

__global__ void init_uniform_kernel(void* x, DType t, double low, double range, uint64_t seed,
                                    uint64_t offset, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const float u = random::uniform(seed, offset + static_cast<uint64_t>(i));
    dmath::store_from_double(x, t, i, __dadd_rn(low, __dmul_rn(range, static_cast<double>(u))));
  }
}

// x [*] = mean + std * N(0, 1)
void init_normal(Tensor& x, const ops::InitArgs& args) {
  ops::validate_init_normal(OnCudaDevice{}, x, args);
  const int64_t n = x.numel();
  if (n == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  init_normal_kernel<<<grid_for(n), kThreads, 0, current_stream(dev)>>>(
      x.raw_data(), x.dtype(), args.mean, args.std, args.seed, args.offset, n);
  MG_CUDA_CHECK_LAUNCH();
}

// x [*] = low + (high - low) * U[0, 1)
void init_uniform(Tensor& x, const ops::InitArgs& args) {
  ops::validate_init_uniform(OnCudaDevice{}, x, args);
  const double low = args.mean, high = args.std;
  const int64_t n = x.numel();
  if (n == 0) return;
  const int dev = x.device().index;
  DeviceGuard guard(dev);
  init_uniform_kernel<<<grid_for(n), kThreads, 0, current_stream(dev)>>>(
      x.raw_data(), x.dtype(), low, high - low, args.seed, args.offset, n);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

void register_init_kernels(plugin::Registry& r) {
  using ops::OpId;
  r.register_op<OpId::init_normal>(kPlatformName, &init_normal, "cuda:kernel");
  r.register_op<OpId::init_uniform>(kPlatformName, &init_uniform, "cuda:kernel");
}

}  // namespace mg::platforms::cuda
