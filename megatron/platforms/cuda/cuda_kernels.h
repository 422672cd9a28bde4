// Registration functions of the CUDA kernel families, one per .cu file in this folder;
// register_cuda calls each. Every kernel file states the gradient rule at its top: parameter
// gradients +=, activation gradients =. Kernels accept f32/bf16/f16 storage with f32 math and f64
// with f64 math, and run on the thread's current stream of the tensors' device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "megatron/core/tensor/dtype.h"

namespace mg::plugin {
class Registry;
}

namespace mg::platforms::cuda {
void register_gemm_kernels(plugin::Registry& r);         // gemm, gemm_epilogue (cuBLASLt / cuBLAS)
void register_elementwise_kernels(plugin::Registry& r);  // bias_add, bias_grad, axpy, fill
void register_embedding_kernels(plugin::Registry& r);    // embedding_fwd/bwd
void register_norm_kernels(plugin::Registry& r);         // layernorm, rmsnorm
void register_activation_kernels(plugin::Registry& r);   // gelu, swiglu, squared_relu
void register_dropout_kernels(plugin::Registry& r);      // dropout, bias_dropout_add
void register_softmax_kernels(plugin::Registry& r);      // softmax
void register_attention_kernels(plugin::Registry& r);    // attention_fwd/bwd
void register_rope_kernels(plugin::Registry& r);         // rope_fwd/bwd
void register_cross_entropy_kernels(plugin::Registry& r);  // cross_entropy_*, ce_*
void register_optimizer_kernels(plugin::Registry& r);  // adamw_step, l2_norm_sq, multi_tensor_scale
void register_init_kernels(plugin::Registry& r);       // init_normal, init_uniform

// Counters of gemm.cu's cuBLASLt plan cache since process start: lookups that found a plan
// (hits) or built one (misses), gemm_epilogue calls run as a fused cuBLASLt epilogue or as the
// unfused fallback, and the plans cached now (all devices). Also exported as the C symbol
// mg_cuda_gemm_plan_cache_stats, so that a test built without CUDA can look it up with dlsym.
struct GemmPlanCacheStats {
  uint64_t hits = 0, misses = 0, fused = 0, unfused = 0, plans = 0;
};
GemmPlanCacheStats gemm_plan_cache_stats();

// Element-wise dtype conversion on the current stream of `device` (Platform::convert).
void launch_convert(void* dst, DType dst_type, const void* src, DType src_type, std::size_t n,
                    int device);
}  // namespace mg::platforms::cuda
