// Registration functions of the CUDA kernel families, one per .cu file in this folder;
// register_cuda calls each. Every kernel file states the gradient rule at its top: parameter
// gradients +=, activation gradients =. Kernels accept f32/bf16/f16 storage with f32 math and f64
// with f64 math, and run on the thread's current stream of the tensors' device.
#pragma once

#include <cstddef>
#include <cstdint>

#include "megatron/core/tensor/dtype.h"

namespace mg {
class Tensor;
namespace ops {
struct RopeArgs;
}
namespace plugin {
class Registry;
}
}  // namespace mg

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
void register_fp8_kernels(plugin::Registry& r);  // fp8_cast_transpose, fp8_scale_update, fp8_gemm
void register_moe_kernels(plugin::Registry& r);  // moe_permute, moe_unpermute(_bwd)
// Counters of fp8.cu's cuBLASLt FP8 plan cache since process start: lookups that found a plan
// (hits) or built one (misses), and the plans cached now (all devices). Also exported as the C
// symbol mg_cuda_fp8_gemm_plan_cache_stats (dlsym from tests built without CUDA).
struct Fp8GemmPlanCacheStats {
  uint64_t hits = 0, misses = 0, plans = 0;
};
Fp8GemmPlanCacheStats fp8_gemm_plan_cache_stats();

// Counters of gemm.cu's cuBLASLt plan cache since process start: lookups that found a plan
// (hits) or built one (misses), gemm_epilogue calls run as a fused cuBLASLt epilogue or as the
// unfused fallback, and the plans cached now (all devices). Also exported as the C symbol
// mg_cuda_gemm_plan_cache_stats, so that a test built without CUDA can look it up with dlsym.
struct GemmPlanCacheStats {
  uint64_t hits = 0, misses = 0, fused = 0, unfused = 0, plans = 0;
};
GemmPlanCacheStats gemm_plan_cache_stats();

// rope.cu: counters since process start: cos/sin table lookups that found a cached table (hits)
// or built one (misses), the tables cached now (all devices), and the apply kernels launched
// (vector: bf16/f16, 16-byte accesses; scalar: the rest). Also exported as the C symbol
// mg_cuda_rope_stats (dlsym from tests built without CUDA).
struct RopeStats {
  uint64_t table_hits = 0, table_misses = 0, tables = 0, vector_calls = 0, scalar_calls = 0;
};
RopeStats rope_stats();
// rope_fwd (backward = false) or rope_bwd (true), with force_scalar running the scalar apply
// kernel where the vector one would serve (tests compare the two bit for bit). Also exported as
// the C symbol mg_cuda_rope_apply_with.
void rope_apply_with(Tensor& y, const Tensor& x, const ops::RopeArgs& args, bool backward,
                     bool force_scalar);

// out [width] += the column sums of partial [chunks, width] (f64, on out's device): reduce.cuh's
// column_finish, every column sum's last pass (its fixed order: column_finish_kernel). Also
// exported as the C symbol mg_cuda_column_finish_with (tests emulate the order on the host).
void column_finish_with(Tensor& out, const Tensor& partial);

// Counters since process start of the calls that took a 16-byte vector path (bf16/f16, widths a
// multiple of 8, 16-byte aligned data) or its scalar fallback, the same bits either way:
// column_sum: reduce.cuh's column_sum_accumulate (bias_grad, bias_dropout_add_bwd's dbias (also
// its one-pass dx + dbias kernel), the
// dgelu dbias of gemm_epilogue, the unfused norm dgamma/dbeta); ce_rows: cross_entropy.cu's row
// passes (cross_entropy_fwd, ce_local_max, ce_local_stats); dropout: dropout.cu's element-wise
// kernels (dropout_fwd, dropout_bwd and bias_dropout_add_bwd's dx, bias_dropout_add_fwd; not the
// p == 0 in-place no-op); ce_row_cache / ce_online: the cross_entropy_fwd calls of the vector path
// that cached their rows in shared memory / took the online one-pass kernel (MG_CUDA_CE_FWD;
// counted as ce_rows vector calls too; no scalar counterparts).
// Kept in elementwise.cu; also exported
// as the C symbol mg_cuda_vector_path_stats (dlsym from tests built without CUDA).
struct VectorPathStats {
  uint64_t column_sum_vector = 0, column_sum_scalar = 0, ce_rows_vector = 0, ce_rows_scalar = 0,
           dropout_vector = 0, dropout_scalar = 0, ce_row_cache = 0, ce_online = 0;
};
enum class VectorPath { column_sum, ce_rows, dropout, ce_row_cache, ce_online };
VectorPathStats vector_path_stats();
void count_vector_path(VectorPath path, bool vector);

// attention_mma.cu: the tensor-core (mma.sync m16n8k16) attention forward, registered by
// attention.cu as the opt-in provider "cuda:attention-mma" (Priority::alternative; preferred with
// MG_OP_PROVIDERS=attention_fwd=cuda:attention-mma). Everything attention.cu's tiled forward
// takes, as plain values: out/q [Sq, B, NH, HD], k/v [Sk, B, NG, HD] of dtype t, lse [B, NH, Sq]
// f32.
struct MmaAttentionFwd {
  void* out = nullptr;
  float* lse = nullptr;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  DType t = DType::bf16;
  int64_t b = 0, sq = 0, sk = 0, nh = 0, ng = 0, hd = 0;
  bool causal = true;
  const int32_t* docs = nullptr;  // query documents docs[b * doc_bstride + i], or null
  int64_t doc_bstride = 0;
  const int32_t* kdocs = nullptr;  // key documents kdocs[b * kdoc_bstride + j] (null iff docs is)
  int64_t kdoc_bstride = 0;
  bool dropout = false;
  float p = 0.0f;
  uint64_t seed = 0, offset = 0;
  float scale = 1.0f, keep_scale = 1.0f;
  int device = 0;
};
// Whether the mma forward serves this call: bf16/f16 storage, head dim 64 or 128, and q, k, v,
// out 16-byte aligned (cp.async of 16-byte chunks). Reads only t, hd, q, k, v and out: the
// provider's supports predicate asks it before anything else is computed.
bool mma_attention_fwd_supported(const MmaAttentionFwd& a);
// Launches it on current_stream(a.device) (the caller checked mma_attention_fwd_supported).
void launch_attention_fwd_mma(const MmaAttentionFwd& a);

// Element-wise dtype conversion on the current stream of `device` (Platform::convert).
void launch_convert(void* dst, DType dst_type, const void* src, DType src_type, std::size_t n,
                    int device);
}  // namespace mg::platforms::cuda
