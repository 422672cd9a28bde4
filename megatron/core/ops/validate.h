// Platform-independent argument validation of the ops in op_list.h / op_args.h: which tensors must
// be defined, their dtypes and allowed mixes, their shapes, and the ranges of scalar arguments.
// Every platform's kernels call these, so an op's contract is checked, and worded, in one place.
//
// Invariants: every check throws mg::Error naming the op, the argument and the offending values.
// Each validate_* hands every tensor it checks to the caller's Placement first (before any dtype
// or shape check on it), so a tensor on the wrong device is reported as such, whatever else is
// wrong with it. They return the sizes the kernels derive from the shapes.
// Not here: where tensors live (the Placement: host for cpu, one CUDA device for cuda), anything
// that reads tensor data (negative ids, cu_seqlens values are checked from a host copy the
// platform provides), backend limits (BLAS int range, CUDA head-dim limit) and alias rules that
// depend on how a kernel writes its outputs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "megatron/core/ops/op_args.h"
#include "megatron/core/tensor/tensor.h"

namespace mg::ops {

// Where a platform's kernels need their tensors. check() throws unless t is defined and usable
// there; it may keep state (cuda: every tensor of one call on the first tensor's device).
class Placement {
 public:
  virtual ~Placement() = default;
  virtual void check(const char* op, const char* name, const Tensor& t) const = 0;
};

// ---- generic helpers ----------------------------------------------------------------------------

// The storage dtypes every float kernel accepts: f64, f32, bf16, f16.
bool is_kernel_float(DType t);
// The index dtypes (targets, ids, positions): i32, i64.
bool is_index(DType t);
// The dtype of compute_t for storage dtype t: f64 for f64, f32 for the rest. Per-row statistics
// (lse, loss, max, mean, rstd) are stored in it.
DType compute_dtype(DType t);
// True when the byte ranges of a and b intersect (same storage only).
bool overlaps(const Tensor& a, const Tensor& b);

void check_defined(const char* op, const char* name, const Tensor& t);
// t's dtype is a kernel float / an index dtype (t itself is assumed defined).
void check_float_dtype(const char* op, const char* name, const Tensor& t);
void check_index_dtype(const char* op, const char* name, const Tensor& t);
void check_same_dtype(const char* op, const char* name, const Tensor& t, const char* ref_name,
                      const Tensor& ref);
void check_same_shape(const char* op, const char* name, const Tensor& t, const char* ref_name,
                      const Tensor& ref);
void check_same_numel(const char* op, const char* name, const Tensor& t, const char* ref_name,
                      const Tensor& ref);
// t's dtype is compute_dtype(ref's dtype): a statistic of ref.
void check_stat_dtype(const char* op, const char* name, const Tensor& t, const char* ref_name,
                      const Tensor& ref);

// Placed (on.check), then the dtype check.
void check_float(const Placement& on, const char* op, const char* name, const Tensor& t);
void check_index(const Placement& on, const char* op, const char* name, const Tensor& t);
// A tensor like `ref` (an output or gradient of it): placed, with ref's dtype and shape.
void check_like(const Placement& on, const char* op, const char* name, const Tensor& t,
                const char* ref_name, const Tensor& ref);
// A statistic of `ref`: placed, with dtype compute_dtype(ref's dtype); the shape is the caller's.
void check_stat(const Placement& on, const char* op, const char* name, const Tensor& t,
                const char* ref_name, const Tensor& ref);

// ---- gemm family --------------------------------------------------------------------------------

struct GemmDims {
  int64_t batch = 1, m = 0, n = 0, k = 0;
};
// C = alpha op(A) @ op(B) + beta C: A, B floats of one dtype, C that dtype or f32; all rank 2, or
// all rank 3 with a shared batch dim; inner and output dims agree.
GemmDims validate_gemm(const Placement& on, const Tensor& c, const Tensor& a, const Tensor& b,
                       const GemmArgs& args);
// grouped_gemm: as many C as A and B (>= 0 groups); each group's C, A, B rank 2 and valid for
// gemm; every group has group 0's A and C dtypes. Returns the dims of each group.
std::vector<GemmDims> validate_grouped_gemm(const Placement& on, std::span<Tensor> c,
                                            std::span<const Tensor> a, std::span<const Tensor> b,
                                            const GemmArgs& args);
// gemm_epilogue (op_args.h GemmEpilogueArgs): A, B, C rank 2 as for gemm (C A's dtype or f32);
// per epilogue: bias [N] (required for bias, optional for bias_gelu, absent otherwise), aux [M, N]
// of C's dtype (bias_gelu: output, dgelu_bgrad: input), dbias [N] (dgelu_bgrad, optional) or [M]
// (bgrad, required), any float dtype; beta 0, or 0 or 1 for bgrad; c overlaps no other tensor.
// Returns the dims (batch 1).
GemmDims validate_gemm_epilogue(const Placement& on, const Tensor& c, const Tensor& aux,
                                const Tensor& dbias, const Tensor& a, const Tensor& b,
                                const Tensor& bias, const GemmEpilogueArgs& args);
// fp8_cast_transpose: x a float tensor viewed as [R, C] (C its last dim); q (optional) fp8 of x's
// shape, qt (optional) fp8 [C, R] of q's dtype; amax and scale f32 [1]. Returns {R, C} as {m, n}.
GemmDims validate_fp8_cast_transpose(const Placement& on, const Tensor& q, const Tensor& qt,
                                     const Tensor& amax, const Tensor& x, const Tensor& scale);
// fp8_swiglu_cast_transpose (dy undefined) and fp8_dswiglu_cast_transpose: x [R, 2F] bf16 / f16 /
// f32, dy [R, F] of x's dtype; the operand swiglu(x) [R, F] (resp. swiglu_bwd(dy, x) [R, 2F]) as
// fp8_cast_transpose's x: q (optional) fp8 of the operand's shape, qt (optional) [C, R] of q's
// dtype, amax and scale f32 [1], no overlap. Returns {R, C} (C = F, resp. 2F) as {m, n}.
GemmDims validate_fp8_swiglu_cast_transpose(const Placement& on, const char* op, const Tensor& q,
                                            const Tensor& qt, const Tensor& amax, const Tensor& dy,
                                            const Tensor& x, const Tensor& scale);
// fp8_norm_cast_transpose: x [.., C] f32 / bf16 / f16 viewed as [R, C]; q [R, C] and qt [C, R]
// fp8 (optional, one format); amax, scale f32 [1]; the norm's inputs and outputs as
// layernorm_fwd / rmsnorm_fwd (residual undefined) or bias_dropout_add_norm_fwd check them, sum
// not overlapping x or residual (the function may run twice: tensorwise's amax pass). Returns
// m = R, n = C.
GemmDims validate_fp8_norm_cast_transpose(const Placement& on, const Tensor& q, const Tensor& qt,
                                          const Tensor& amax, const Tensor& sum, const Tensor& mean,
                                          const Tensor& rstd, const Tensor& x, const Tensor& bias,
                                          const Tensor& residual, const Tensor& gamma,
                                          const Tensor& beta, const Tensor& scale,
                                          const DropoutArgs& dropout, const NormArgs& args,
                                          NormKind kind);
// fp8_gemm: a [M, K], b [N, K] fp8 (e4m3 or e5m2, not both e5m2), c [M, N] f32/bf16/f16, the
// scale inverses f32 [1], beta 0 or 1, M, N, K multiples of 16. Returns the dims (batch 1).
GemmDims validate_fp8_gemm(const Placement& on, const Tensor& c, const Tensor& a, const Tensor& b,
                           const Tensor& a_scale_inv, const Tensor& b_scale_inv,
                           const Fp8GemmArgs& args);
// fp8_scale_update: history [L, S], scale and scale_inv [S], all f32, not overlapping, L >= 1 (1
// when current), margin >= 0, fp8_max > 0. Returns {L, S} as {m, n}.
GemmDims validate_fp8_scale_update(const Placement& on, const Tensor& history, const Tensor& scale,
                                   const Tensor& scale_inv, const Fp8ScaleUpdateArgs& args);
// fp8_dequantize: q fp8, y f32 / bf16 / f16 of q's shape (not overlapping q), scale_inv f32 [1].
// Returns the element count.
int64_t validate_fp8_dequantize(const Placement& on, const Tensor& y, const Tensor& q,
                                const Tensor& scale_inv);
// fp8_transpose: q [R, C] and qt [C, R] fp8 of one dtype, not overlapping; returns m = R, n = C.
GemmDims validate_fp8_transpose(const Placement& on, const Tensor& qt, const Tensor& q);
// y [N, F] += bias [F]; returns F.
int64_t validate_bias_add(const Placement& on, const Tensor& y, const Tensor& bias);
// dbias [F] += sum_n dy [N, F]; returns F.
int64_t validate_bias_grad(const Placement& on, const Tensor& dbias, const Tensor& dy);
// y += alpha x: floats of any dtypes with equal element counts.
void validate_axpy(const Placement& on, const Tensor& y, const Tensor& x);

// ---- activation ---------------------------------------------------------------------------------

// out has in's float dtype and element count (gelu, squared_relu, their gradients).
void validate_unary(const Placement& on, const char* op, const char* out_name, const Tensor& out,
                    const char* in_name, const Tensor& in);
// x [N, 2F] -> F; `half` [N, F] (y, or dy) is x with its last dim halved.
int64_t validate_swiglu(const Placement& on, const char* op, const char* half_name,
                        const Tensor& half, const Tensor& x);
// dx [N, 2F] like x, dy [N, F], dx not overlapping dy; returns F.
int64_t validate_swiglu_bwd(const Placement& on, const Tensor& dx, const Tensor& dy,
                            const Tensor& x);

// ---- attention ----------------------------------------------------------------------------------

struct AttentionDims {
  int64_t s, b, nh, ng, hd;
  int64_t sk;  // keys (== s for self-attention over one block)
};
// out, lse [B, NH, Sq] <- q [Sq, B, NH, HD], k, v [Sk, B, NG, HD]; dropout p in [0, 1), finite
// softmax_scale, and the document mask tensors (doc_ids [B, Sq] i32 with optional kv_doc_ids
// [B, Sk] i32, required when Sk != Sq; or cu_seqlens [D+1] i32 with Sk == Sq; not both).
// cu_seqlens values: validate_cu_seqlens on a host copy.
AttentionDims validate_attention_fwd(const Placement& on, const Tensor& out, const Tensor& lse,
                                     const Tensor& q, const Tensor& k, const Tensor& v,
                                     const AttentionArgs& args);
AttentionDims validate_attention_bwd(const Placement& on, const Tensor& dq, const Tensor& dk,
                                     const Tensor& dv, const Tensor& dout, const Tensor& q,
                                     const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const AttentionArgs& args);
// attention_merge: out, block_out [S, B, NH, HD] alike; lse, block_lse [B, NH, S] of out's stat
// dtype. Returns the dims (ng = nh, sk = s).
AttentionDims validate_attention_merge(const Placement& on, const Tensor& out, const Tensor& lse,
                                       const Tensor& block_out, const Tensor& block_lse);
// cu_seqlens values c [D+1]: start at 0, end at S, monotone.
void validate_cu_seqlens(const char* op, std::span<const int32_t> c, int64_t s);
// fp8_attention_fwd: q [S, B, NH, HD], k, v [S, B, NG, HD] fp8 of one dtype, out fp8 like q, lse
// [B, NH, S] f32, amax f32 [2], fwd_scale and fwd_scale_inv f32 [3]; Sk == Sq, no dropout, no
// document masks (the FP8 attention's contract: Transformer Engine's fp8_dpa as Megatron trains
// it).
AttentionDims validate_fp8_attention_fwd(const Placement& on, const Tensor& out, const Tensor& lse,
                                         const Tensor& amax, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const Tensor& fwd_scale,
                                         const Tensor& fwd_scale_inv, const AttentionArgs& args);
// fp8_attention_bwd: as the forward's, with dout fp8 like q (its own format), dq like dout, dk and
// dv like k in dout's format, amax f32 [4], bwd_scale and bwd_scale_inv f32 [3].
AttentionDims validate_fp8_attention_bwd(const Placement& on, const Tensor& dq, const Tensor& dk,
                                         const Tensor& dv, const Tensor& amax, const Tensor& dout,
                                         const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& out, const Tensor& lse,
                                         const Tensor& fwd_scale, const Tensor& fwd_scale_inv,
                                         const Tensor& bwd_scale, const Tensor& bwd_scale_inv,
                                         const AttentionArgs& args);

// ---- cross entropy ------------------------------------------------------------------------------

struct CeRows {
  int64_t n, v;  // rows N (leading dims of the logits flattened), local vocab Vl
};
CeRows validate_cross_entropy_fwd(const Placement& on, const Tensor& loss, const Tensor& max,
                                  const Tensor& sum_exp, const Tensor& logits,
                                  const Tensor& targets);
CeRows validate_ce_local_max(const Placement& on, const Tensor& max, const Tensor& logits);
CeRows validate_ce_local_stats(const Placement& on, const Tensor& sum_exp,
                               const Tensor& target_logit, const Tensor& logits, const Tensor& max,
                               const Tensor& targets, int64_t vocab_start);
// loss f32/f64; max, sum_exp, target_logit of loss's dtype and element count.
void validate_ce_combine(const Placement& on, const Tensor& loss, const Tensor& max,
                         const Tensor& sum_exp, const Tensor& target_logit);
// dlogits like logits (its alias rule is the platform's); the rest as in the forward.
CeRows validate_cross_entropy_bwd(const Placement& on, const Tensor& dlogits, const Tensor& dloss,
                                  const Tensor& logits, const Tensor& max, const Tensor& sum_exp,
                                  const Tensor& targets, int64_t vocab_start);

// ---- dropout ------------------------------------------------------------------------------------

void validate_dropout_p(const char* op, const DropoutArgs& args);
// out like in (dropout_fwd: y, x; dropout_bwd: dx, dy).
void validate_dropout(const Placement& on, const char* op, const Tensor& out, const Tensor& in,
                      const DropoutArgs& args);
// y, residual like x [N, F], bias [F] optional of x's dtype; returns F.
int64_t validate_bias_dropout_add_fwd(const Placement& on, const Tensor& y, const Tensor& x,
                                      const Tensor& bias, const Tensor& residual,
                                      const DropoutArgs& args);
// dx like dy [N, F], dbias [F] optional of any float dtype; returns F.
int64_t validate_bias_dropout_add_bwd(const Placement& on, const Tensor& dx, const Tensor& dbias,
                                      const Tensor& dy, const DropoutArgs& args);

// ---- embedding ----------------------------------------------------------------------------------

struct EmbeddingDims {
  int64_t n, v, h;  // tokens N = ids.numel(), local vocab Vl, hidden H
};
// out [N, H] of weight's dtype <- ids [N] i32/i64, weight [Vl, H]; vocab_start >= 0.
EmbeddingDims validate_embedding_fwd(const Placement& on, const Tensor& out, const Tensor& ids,
                                     const Tensor& weight, int64_t vocab_start);
// dweight [Vl, H] (any float dtype) <- dout [N, H], ids [N].
EmbeddingDims validate_embedding_bwd(const Placement& on, const Tensor& dweight, const Tensor& dout,
                                     const Tensor& ids, int64_t vocab_start);
// Every id >= 0 (checked on a host copy of `ids`).
void validate_ids_nonnegative(const char* op, const Tensor& ids, std::span<const int64_t> id);

// ---- init ---------------------------------------------------------------------------------------

void validate_init_normal(const Placement& on, const Tensor& x, const InitArgs& args);
void validate_init_uniform(const Placement& on, const Tensor& x, const InitArgs& args);

// ---- norms --------------------------------------------------------------------------------------

struct NormDims {
  int64_t rows, h;  // x [N, H]: rows N (leading dims flattened), H
};
// y like x [N, H], gamma and beta (optional) [H], mean and rstd [N] of compute_dtype(x), eps >= 0.
NormDims validate_layernorm_fwd(const Placement& on, const Tensor& y, const Tensor& mean,
                                const Tensor& rstd, const Tensor& x, const Tensor& gamma,
                                const Tensor& beta, const NormArgs& args);
NormDims validate_layernorm_bwd(const Placement& on, const Tensor& dx, const Tensor& dgamma,
                                const Tensor& dbeta, const Tensor& dy, const Tensor& x,
                                const Tensor& mean, const Tensor& rstd, const Tensor& gamma);
NormDims validate_rmsnorm_fwd(const Placement& on, const Tensor& y, const Tensor& rstd,
                              const Tensor& x, const Tensor& gamma, const NormArgs& args);
NormDims validate_rmsnorm_bwd(const Placement& on, const Tensor& dx, const Tensor& dgamma,
                              const Tensor& dy, const Tensor& x, const Tensor& rstd,
                              const Tensor& gamma);
// bias_dropout_add_norm_fwd: x [N, H] and residual, sum, y like it (same dtype and shape; y must
// not overlap sum); bias [H] optional of x's dtype; dropout p in [0, 1); gamma [H], and for
// layernorm beta [H] optional and mean [N]; for rmsnorm beta and mean undefined; rstd [N];
// eps >= 0.
NormDims validate_bias_dropout_add_norm_fwd(const Placement& on, const Tensor& y, const Tensor& sum,
                                            const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                            const Tensor& bias, const Tensor& residual,
                                            const Tensor& gamma, const Tensor& beta,
                                            const DropoutArgs& dropout, const NormArgs& args,
                                            NormKind kind);
// norm_bwd_add: as layernorm_bwd / rmsnorm_bwd (rmsnorm: mean and dbeta undefined), plus
// dresidual (optional) with x's dtype and element count, not overlapping dx (dx may alias dy).
NormDims validate_norm_bwd_add(const Placement& on, const Tensor& dx, const Tensor& dgamma,
                               const Tensor& dbeta, const Tensor& dy, const Tensor& dresidual,
                               const Tensor& x, const Tensor& mean, const Tensor& rstd,
                               const Tensor& gamma, NormKind kind);

// ---- optimizer ----------------------------------------------------------------------------------

// Adam hyper-parameters, then per params[i]: param f32/f64, grad, exp_avg, exp_avg_sq (of param's
// dtype) and model_param (optional) of param's shape.
void validate_adamw(const Placement& on, std::span<const AdamParam> params, const AdamArgs& args);
// out a single f32/f64 element; xs floats.
void validate_l2_norm_sq(const Placement& on, const Tensor& out, std::span<const Tensor> xs);
// xs floats; found_nonfinite (optional) a single f32 element.
void validate_multi_tensor_scale(const Placement& on, std::span<const Tensor> xs,
                                 const Tensor& found_nonfinite);

// ---- rope ---------------------------------------------------------------------------------------

struct RopeDims {
  int64_t s, b, heads, hd, rot;
  bool per_batch_positions;  // position_ids is [B, S] (else [S], or none)
};
// out like in [S, B, NH, HD]; rotary_percent in (0, 1], base > 0, rotary width even and > 0;
// position_ids (optional) i32/i64 [S] or [B, S].
RopeDims validate_rope(const Placement& on, const char* op, const char* out_name, const Tensor& out,
                       const char* in_name, const Tensor& in, const RopeArgs& args);

// ---- softmax ------------------------------------------------------------------------------------

// y like x (rank >= 1), finite scale.
void validate_softmax_fwd(const Placement& on, const char* op, const Tensor& y, const Tensor& x,
                          float scale);
// dy, dx like y (rank >= 1), finite scale.
void validate_softmax_bwd(const Placement& on, const char* op, const Tensor& dx, const Tensor& dy,
                          const Tensor& y, float scale);

// ---- MoE token permutation ---------------------------------------------------------------------
struct MoePermuteDims {
  int64_t t = 0, r = 0, h = 0;  // tokens, rows, hidden
};
// rows [R, H] like x [T, H] (a kernel float), index [R] i64.
MoePermuteDims validate_moe_permute(const Placement& on, const Tensor& rows, const Tensor& x,
                                    const Tensor& index);
// out [T, H], rows [R, H] (kernel floats, any mix), prob [R] f64 (optional), offsets [T + 1] and
// token_rows [R] i64.
MoePermuteDims validate_moe_unpermute(const Placement& on, const Tensor& out, const Tensor& rows,
                                      const Tensor& prob, const Tensor& offsets,
                                      const Tensor& token_rows);
// drows [R, H] like rows (optional when dprob is given and rows too), dprob [R] f64 (optional,
// needs rows), dout [T, H] a kernel float, prob [R] f64 (optional), index [R] i64.
MoePermuteDims validate_moe_unpermute_bwd(const Placement& on, const Tensor& drows,
                                          const Tensor& dprob, const Tensor& dout,
                                          const Tensor& rows, const Tensor& prob,
                                          const Tensor& index);
// ---- MoE dispatch index lists ------------------------------------------------------------------
struct MoeDispatchDims {
  int64_t n = 0, k = 0, tokens = 0;  // choices, topk, tokens (n / k)
  int64_t l = 0;                     // selected experts (counts' size)
  int64_t g = 0, e = 0;              // choice_counts' rows and experts (0 when not given)
};
// counts [L] i64 (L >= 1); choice_counts [G, E] i64 (optional); row_choice, row_token,
// choice_rows, token_rows [N] i64; choice_offsets [N + 1], token_offsets [N / K + 1] i64; expert
// [N] i64, kept [N] u8 (optional); args: K >= 1 dividing N, first_expert >= 0, count_first and
// count_num multiples of K within [0, N]. The outputs must not overlap each other or the inputs.
MoeDispatchDims validate_moe_dispatch_index(const Placement& on, const Tensor& counts,
                                            const Tensor& choice_counts, const Tensor& row_choice,
                                            const Tensor& row_token, const Tensor& choice_offsets,
                                            const Tensor& choice_rows, const Tensor& token_offsets,
                                            const Tensor& token_rows, const Tensor& expert,
                                            const Tensor& kept, const MoeDispatchArgs& args);
// order, inverse [R] i64, counts [EP, L] i64 (EP, L >= 1); order and inverse distinct.
void validate_moe_chunk_order(const Placement& on, const Tensor& order, const Tensor& inverse,
                              const Tensor& counts);
// ---- MoE shared-expert gate --------------------------------------------------------------------
struct MoeSharedGateDims {
  int64_t t = 0, h = 0;  // tokens, hidden size
};
// out [T, H] and z, x [T, H] kernel floats, y [T, H] f64, w [H] (or [1, H]) a kernel float, gate
// [T] f64; out must not overlap an input.
MoeSharedGateDims validate_moe_shared_gate_fwd(const Placement& on, const Tensor& out,
                                               const Tensor& gate, const Tensor& y, const Tensor& z,
                                               const Tensor& x, const Tensor& w);
// dz, dx [T, H] kernel floats, dw [H] f64, dy, z, x [T, H], w [H], gate [T] f64; the outputs must
// not overlap the inputs.
MoeSharedGateDims validate_moe_shared_gate_bwd(const Placement& on, const Tensor& dz,
                                               const Tensor& dx, const Tensor& dw, const Tensor& dy,
                                               const Tensor& z, const Tensor& x, const Tensor& w,
                                               const Tensor& gate);
// ---- MoE router --------------------------------------------------------------------------------
struct MoeRouterDims {
  int64_t t = 0, e = 0, k = 0;  // tokens, experts, topk
};
// logits [T, E] f32 or f64; expert [T, K] i64, prob [T, K] f64, kept [T, K] u8, scores [T, E]
// f64, tokens_per_expert [E] f64, expert_counts [E] i64, aux_sums [G, E] f64 (G >= 1), z_sum [1]
// f64 (the last four optional), expert_bias [E] f32 (optional; sigmoid only); args: 1 <= K <= E,
// valid groups (E % G == 0, g <= G, K % g == 0, K / g <= E / G), capacity_factor > 0, finite
// scaling_factor, z_loss_coeff >= 0 and finite z_loss_scale.
MoeRouterDims validate_moe_router_topk(const Placement& on, const Tensor& expert,
                                       const Tensor& prob, const Tensor& kept, const Tensor& scores,
                                       const Tensor& tokens_per_expert, const Tensor& expert_counts,
                                       const Tensor& aux_sums, const Tensor& z_sum,
                                       const Tensor& logits, const Tensor& expert_bias,
                                       const MoeRouterArgs& args);
// dlogits [T, E] f64, dprob [T, K] f64, aux_dscores [G, E] f64 (optional) and the forward's
// tensors as above.
MoeRouterDims validate_moe_router_topk_bwd(const Placement& on, const Tensor& dlogits,
                                           const Tensor& dprob, const Tensor& aux_dscores,
                                           const Tensor& logits, const Tensor& expert,
                                           const Tensor& prob, const Tensor& kept,
                                           const Tensor& scores, const MoeRouterArgs& args);
// Index values (a host copy): each in [0, n).
void validate_moe_indices(const char* op, const char* name, std::span<const int64_t> v, int64_t n);

}  // namespace mg::ops
