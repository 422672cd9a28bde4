// Platform::convert on the device: element-wise conversion between any two dtypes with exactly the
// semantics of convert_host (dtype_math.h: load as double, store from double; narrow floats via
// f32 with RNE and the NaN/overflow rules of dtype.h). Stream-ordered on the current stream.
// Not here: the same-dtype case (a device memcpy in cuda_platform.cpp), vectorised paths.
#include "megatron/platforms/cuda/cuda_common.h"
#include "megatron/platforms/cuda/cuda_kernels.h"
#include "megatron/platforms/cuda/device_util.cuh"

namespace mg::platforms::cuda {

namespace {

__global__ void convert_kernel(void* dst, DType dst_type, const void* src, DType src_type,
                               int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride())
    dmath::convert_element(dst, dst_type, src, src_type, i);
}

}  // namespace

void launch_convert(void* dst, DType dst_type, const void* src, DType src_type, std::size_t n,
                    int device) {
  if (n == 0) return;
  DeviceGuard guard(device);
  const auto count = static_cast<int64_t>(n);
  convert_kernel<<<grid_for(count), kThreads, 0, current_stream(device)>>>(dst, dst_type, src,
                                                                           src_type, count);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg::platforms::cuda
