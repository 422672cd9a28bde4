// The CPU platform: always available; host memory through the host allocator; synchronous streams;
// kernels in this folder (OpenBLAS GEMM, OpenMP loops), one family per file.
#pragma once

namespace mg::plugin {
class Registry;
}

namespace mg::platforms::cpu {
// Registers the CPU platform object and every CPU kernel (kernels.h) into `registry`.
void register_cpu(plugin::Registry& registry);
}  // namespace mg::platforms::cpu
