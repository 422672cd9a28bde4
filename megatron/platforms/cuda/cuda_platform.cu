// PLACEHOLDER: replaced by the CUDA platform implementation.
#include "megatron/platforms/cuda/cuda_platform.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cuda {
void register_cuda(plugin::Registry&) {}
}  // namespace mg::platforms::cuda
