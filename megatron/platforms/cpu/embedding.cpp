// PLACEHOLDER: replaced by the kernel family's implementation.
#include "megatron/platforms/cpu/kernels.h"
#include "megatron/plugin/registry.h"

namespace mg::platforms::cpu {
void register_embedding_kernels(plugin::Registry&) {}
}  // namespace mg::platforms::cpu
