// The CUDA platform: devices through the CUDA runtime, cuBLASLt GEMMs, CUDA kernels (.cu files in
// this folder). Registered whenever the build has CUDA; available only when a GPU and driver are.
#pragma once

namespace mg::plugin {
class Registry;
}

namespace mg::platforms::cuda {
// Registers the CUDA platform object and every CUDA kernel into `registry`.
void register_cuda(plugin::Registry& registry);
}  // namespace mg::platforms::cuda
