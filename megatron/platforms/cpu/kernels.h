// Registration functions of the CPU kernel families, one per .cpp in this folder. register_cpu()
// calls each. Every kernel file states the gradient rule at its top: parameter gradients +=,
// activation gradients =. All kernels accept f32/bf16/f16 with f32 math, and f64 with f64 math.
#pragma once

namespace mg::plugin {
class Registry;
}

namespace mg::platforms::cpu {
void register_gemm_kernels(plugin::Registry& r);           // gemm, bias_add, bias_grad, axpy, fill
void register_embedding_kernels(plugin::Registry& r);      // embedding_fwd/bwd
void register_norm_kernels(plugin::Registry& r);           // layernorm, rmsnorm
void register_activation_kernels(plugin::Registry& r);     // gelu, swiglu, squared_relu
void register_dropout_kernels(plugin::Registry& r);        // dropout, bias_dropout_add
void register_softmax_kernels(plugin::Registry& r);        // softmax
void register_attention_kernels(plugin::Registry& r);      // attention_fwd/bwd
void register_rope_kernels(plugin::Registry& r);           // rope_fwd/bwd
void register_cross_entropy_kernels(plugin::Registry& r);  // cross_entropy_*, ce_*
void register_optimizer_kernels(plugin::Registry& r);  // adamw_step, l2_norm_sq, multi_tensor_scale
void register_init_kernels(plugin::Registry& r);       // init_normal, init_uniform
void register_fp8_kernels(plugin::Registry& r);        // fp8_cast_transpose, fp8_gemm
// fp8_attention_fwd / fp8_attention_bwd (the reference), fp8_dequantize
void register_fp8_attention_kernels(plugin::Registry& r);
// moe_permute, moe_unpermute(_bwd), moe_router_topk(_bwd), moe_dispatch_index, moe_chunk_order,
// moe_shared_gate_fwd/_bwd
void register_moe_kernels(plugin::Registry& r);
}  // namespace mg::platforms::cpu
