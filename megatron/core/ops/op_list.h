// THE op table: every op and every overridable function, declared once with its typed signature
// and its backward beside it. Platforms and plugins register implementations against these slots
// (megatron/plugin/registry.h); modules resolve a whole OpTable once and call through it.
//
// X(slot, kind, backward, signature)
//   kind      op: a kernel each platform implements; function: a named overridable function (the
//             Megatron-LM-FL @overridable analog) with a generic default any platform may replace
//   backward  the slot that computes this slot's gradient ("" for backward slots and
//             non-differentiable ones)
//
// Rule for every kernel: parameter gradients accumulate (+=), activation gradients are written (=).
// Argument order: outputs, saved tensors, inputs, parameters. Argument structs: op_args.h.
// Changing this list changes kOpTableAbiHash, so plugins built against another list are refused.
#pragma once

#define MG_OP_LIST(X)                                                                             \
  /* ---- linear algebra ---- */                                                                  \
  X(gemm, op, "gemm", void(Tensor & c, const Tensor& a, const Tensor& b, const GemmArgs& args))   \
  /* grouped GEMM: c[g] = alpha op(a[g]) @ op(b[g]) + beta c[g] for every group g, rank-2         \
     operands of one dtype set (as gemm's) in all groups, any group may be empty (M, N or K 0):   \
     the MoE experts' GEMMs (--moe-grouped-gemm) in one call, forward, dgrad and wgrad alike */   \
  X(grouped_gemm, op, "grouped_gemm",                                                             \
    void(std::span<Tensor> c, std::span<const Tensor> a, std::span<const Tensor> b,               \
         const GemmArgs& args))                                                                   \
  /* c [M,N] = epilogue(op(a) @ op(b)) with aux [M,N], bias, dbias: GemmEpilogueArgs */           \
  X(gemm_epilogue, op, "",                                                                        \
    void(Tensor & c, Tensor & aux, Tensor & dbias, const Tensor& a, const Tensor& b,              \
         const Tensor& bias, const GemmEpilogueArgs& args))                                       \
  /* FP8 (docs/fp8.md): q [R,C] fp8 = saturate(round(x [R,C] * scale)), qt [C,R] its transpose    \
     (cast-transpose; q, qt optional), amax [1] f32 = max(amax, max |x|); scale [1] f32 */        \
  X(fp8_cast_transpose, op, "",                                                                   \
    void(Tensor & q, Tensor & qt, Tensor & amax, const Tensor& x, const Tensor& scale))           \
  /* c [M,N] = a_scale_inv * b_scale_inv * (a [M,K] @ b [N,K]^T) + beta c, a and b fp8: the TN    \
     layout Hopper's FP8 tensor cores require; f32 accumulation; c fp8: cast at args.out_scale    \
     with its amax (Fp8GemmArgs) */                                                               \
  X(fp8_gemm, op, "",                                                                             \
    void(Tensor & c, const Tensor& a, const Tensor& b, const Tensor& a_scale_inv,                 \
         const Tensor& b_scale_inv, const Fp8GemmArgs& args))                                     \
  /* FP8 scaling update on the device: history [L,S] f32 (row 0 the pass's amaxes), scale and     \
     scale_inv [S] f32, in place (delayed: roll + scale from the history; current: from row 0) */ \
  X(fp8_scale_update, op, "",                                                                     \
    void(Tensor & history, Tensor & scale, Tensor & scale_inv, const Fp8ScaleUpdateArgs& args))   \
  /* y = f32(q) * scale_inv rounded to y's dtype (TE's dequantize): q fp8, y f32/bf16/f16 of      \
     q's shape, scale_inv [1] f32 */                                                              \
  X(fp8_dequantize, op, "", void(Tensor & y, const Tensor& q, const Tensor& scale_inv))           \
  /* qt [C,R] = q [R,C] transposed, both fp8 of one format (the bytes moved, not converted): the  \
     column-wise copy of an FP8 tensor that no cast made (--fp8-multi-head-attention's O) */      \
  X(fp8_transpose, op, "", void(Tensor & qt, const Tensor& q))                                    \
  /* FP8 dot-product attention (docs/fp8.md "FP8 attention"; TE's fp8_dpa, cuDNN's FP8 SDPA):     \
     q [S,B,NH,HD], k, v [S,B,NG,HD] fp8 of one format; fwd_scale, fwd_scale_inv [3] f32 = the    \
     (QKV, S, O) scales; out fp8 like q = cast(O * scale_O), O = softmax(q k^T) v with P cast at  \
     scale_S; lse [B,NH,S] f32; amax [2] f32 written = (max P, max |O|) before their scaling */   \
  X(fp8_attention_fwd, op, "fp8_attention_bwd",                                                   \
    void(Tensor & out, Tensor & lse, Tensor & amax, const Tensor& q, const Tensor& k,             \
         const Tensor& v, const Tensor& fwd_scale, const Tensor& fwd_scale_inv,                   \
         const AttentionArgs& args))                                                              \
  /* its backward: dout fp8 like q (the gradient format), bwd_scale, bwd_scale_inv [3] f32 = the  \
     (dO, dP, dQKV) scales; dq, dk, dv fp8 in dout's format at scale_dQKV; amax [4] f32 written = \
     (max |dP|, max |dQ|, max |dK|, max |dV|) before their scaling */                             \
  X(fp8_attention_bwd, op, "",                                                                    \
    void(Tensor & dq, Tensor & dk, Tensor & dv, Tensor & amax, const Tensor& dout,                \
         const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, \
         const Tensor& fwd_scale, const Tensor& fwd_scale_inv, const Tensor& bwd_scale,           \
         const Tensor& bwd_scale_inv, const AttentionArgs& args))                                 \
  /* y[N,F] += bias[F] */                                                                         \
  X(bias_add, op, "bias_grad", void(Tensor & y, const Tensor& bias))                              \
  /* dbias[F] += sum_n dy[N,F] */                                                                 \
  X(bias_grad, op, "", void(Tensor & dbias, const Tensor& dy))                                    \
  /* y += alpha * x (gradient accumulation, residual backward) */                                 \
  X(axpy, op, "axpy", void(Tensor & y, const Tensor& x, float alpha))                             \
  X(fill, op, "", void(Tensor & x, double value))                                                 \
  /* ---- embedding: out[N,H] = weight[ids - vocab_start] (0 for ids outside this shard) ---- */  \
  X(embedding_fwd, op, "embedding_bwd",                                                           \
    void(Tensor & out, const Tensor& ids, const Tensor& weight, int64_t vocab_start))             \
  X(embedding_bwd, op, "",                                                                        \
    void(Tensor & dweight, const Tensor& dout, const Tensor& ids, int64_t vocab_start))           \
  /* ---- norms over the last dim; mean/rstd [N] f32 (f64 for f64 x); beta optional ---- */       \
  X(layernorm_fwd, op, "layernorm_bwd",                                                           \
    void(Tensor & y, Tensor & mean, Tensor & rstd, const Tensor& x, const Tensor& gamma,          \
         const Tensor& beta, const NormArgs& args))                                               \
  X(layernorm_bwd, op, "",                                                                        \
    void(Tensor & dx, Tensor & dgamma, Tensor & dbeta, const Tensor& dy, const Tensor& x,         \
         const Tensor& mean, const Tensor& rstd, const Tensor& gamma, const NormArgs& args))      \
  X(rmsnorm_fwd, op, "rmsnorm_bwd",                                                               \
    void(Tensor & y, Tensor & rstd, const Tensor& x, const Tensor& gamma, const NormArgs& args))  \
  X(rmsnorm_bwd, op, "",                                                                          \
    void(Tensor & dx, Tensor & dgamma, const Tensor& dy, const Tensor& x, const Tensor& rstd,     \
         const Tensor& gamma, const NormArgs& args))                                              \
  /* fused (pre-norm layer): sum [N,H] = residual + dropout(x + bias) (bias [H] optional),        \
     stored in x's dtype, then y = norm(sum) as layernorm_fwd / rmsnorm_fwd compute it from the   \
     stored sum (mean undefined for rmsnorm). Bit-identical to bias_dropout_add_fwd + the norm    \
     on the cpu */                                                                                \
  X(bias_dropout_add_norm_fwd, op, "norm_bwd_add",                                                \
    void(Tensor & y, Tensor & sum, Tensor & mean, Tensor & rstd, const Tensor& x,                 \
         const Tensor& bias, const Tensor& residual, const Tensor& gamma, const Tensor& beta,     \
         const DropoutArgs& dropout, const NormArgs& args, NormKind kind))                        \
  /* dx = store(store(norm_bwd(dy)) + dresidual) (dresidual optional): layernorm_bwd /            \
     rmsnorm_bwd then axpy(dx, dresidual, 1) in one pass, bit-identical on the cpu */             \
  X(norm_bwd_add, op, "",                                                                         \
    void(Tensor & dx, Tensor & dgamma, Tensor & dbeta, const Tensor& dy, const Tensor& dresidual, \
         const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& gamma,            \
         const NormArgs& args, NormKind kind))                                                    \
  /* ---- activations (element-wise; swiglu: x[N,2F] = [gate | up], y[N,F] = silu(gate)*up) ----  \
   */                                                                                             \
  X(gelu_fwd, op, "gelu_bwd", void(Tensor & y, const Tensor& x, GeluApprox approx))               \
  X(gelu_bwd, op, "", void(Tensor & dx, const Tensor& dy, const Tensor& x, GeluApprox approx))    \
  X(swiglu_fwd, op, "swiglu_bwd", void(Tensor & y, const Tensor& x))                              \
  X(swiglu_bwd, op, "", void(Tensor & dx, const Tensor& dy, const Tensor& x))                     \
  X(squared_relu_fwd, op, "squared_relu_bwd", void(Tensor & y, const Tensor& x))                  \
  X(squared_relu_bwd, op, "", void(Tensor & dx, const Tensor& dy, const Tensor& x))               \
  /* ---- dropout family (counter-based masks, regenerated in backward) ---- */                   \
  X(dropout_fwd, op, "dropout_bwd", void(Tensor & y, const Tensor& x, const DropoutArgs& args))   \
  X(dropout_bwd, op, "", void(Tensor & dx, const Tensor& dy, const DropoutArgs& args))            \
  /* y = residual + dropout(x + bias); bias [F] optional */                                       \
  X(bias_dropout_add_fwd, op, "bias_dropout_add_bwd",                                             \
    void(Tensor & y, const Tensor& x, const Tensor& bias, const Tensor& residual,                 \
         const DropoutArgs& args))                                                                \
  /* dx = dropout'(dy); dbias += sum_n dx (optional); d(residual) is dy itself */                 \
  X(bias_dropout_add_bwd, op, "",                                                                 \
    void(Tensor & dx, Tensor & dbias, const Tensor& dy, const DropoutArgs& args))                 \
  /* ---- softmax over the last dim of scale * x ---- */                                          \
  X(softmax_fwd, op, "softmax_bwd", void(Tensor & y, const Tensor& x, float scale))               \
  X(softmax_bwd, op, "", void(Tensor & dx, const Tensor& dy, const Tensor& y, float scale))       \
  /* ---- attention: out [Sq,B,NH,HD], lse [B,NH,Sq] f32 (f64 for f64) ---- */                    \
  X(attention_fwd, op, "attention_bwd",                                                           \
    void(Tensor & out, Tensor & lse, const Tensor& q, const Tensor& k, const Tensor& v,           \
         const AttentionArgs& args))                                                              \
  X(attention_bwd, op, "",                                                                        \
    void(Tensor & dq, Tensor & dk, Tensor & dv, const Tensor& dout, const Tensor& q,              \
         const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,                  \
         const AttentionArgs& args))                                                              \
  /* out, lse (+)= a partial result over other keys, merged by log-sum-exp (ring attention) */    \
  X(attention_merge, op, "",                                                                      \
    void(Tensor & out, Tensor & lse, const Tensor& block_out, const Tensor& block_lse))           \
  /* ---- rotary embeddings on x [S, B, NH, HD] ---- */                                           \
  X(rope_fwd, op, "rope_bwd", void(Tensor & y, const Tensor& x, const RopeArgs& args))            \
  X(rope_bwd, op, "", void(Tensor & dx, const Tensor& dy, const RopeArgs& args))                  \
  /* ---- cross entropy on logits [N, Vl] (this rank's vocab shard starting at vocab_start) ----  \
     serial: loss[N] = logsumexp(logits) - logits[target], keeping max/sum_exp [N] f32 for bwd.   \
     vocab-parallel pieces: local max -> all-reduce(max) -> local stats with the global max ->    \
     all-reduce(sum) -> ce_combine. Targets [N] i32/i64. */                                       \
  X(cross_entropy_fwd, op, "cross_entropy_bwd",                                                   \
    void(Tensor & loss, Tensor & max, Tensor & sum_exp, const Tensor& logits,                     \
         const Tensor& targets))                                                                  \
  X(ce_local_max, op, "cross_entropy_bwd", void(Tensor & max, const Tensor& logits))              \
  X(ce_local_stats, op, "cross_entropy_bwd",                                                      \
    void(Tensor & sum_exp, Tensor & target_logit, const Tensor& logits, const Tensor& max,        \
         const Tensor& targets, int64_t vocab_start))                                             \
  /* loss = log(sum_exp) + max - target_logit */                                                  \
  X(ce_combine, op, "cross_entropy_bwd",                                                          \
    void(Tensor & loss, const Tensor& max, const Tensor& sum_exp, const Tensor& target_logit))    \
  /* dlogits = dloss * (softmax(logits) - onehot(target)); dlogits may alias logits */            \
  X(cross_entropy_bwd, op, "",                                                                    \
    void(Tensor & dlogits, const Tensor& dloss, const Tensor& logits, const Tensor& max,          \
         const Tensor& sum_exp, const Tensor& targets, int64_t vocab_start))                      \
  /* ---- MoE token permutation (transformer/moe): rows [R, H] of tokens x [T, H] and back. ----  \
     rows[i] = x[index[i]] (index [R] i64 in [0, T)): an exact copy. */                           \
  X(moe_permute, op, "moe_unpermute", void(Tensor & rows, const Tensor& x, const Tensor& index))  \
  /* out[t] = sum over i in token_rows[offsets[t] .. offsets[t + 1]) (in that order) of prob[i] * \
     rows[i] (prob [R] f64, optional: 1), summed in f64 and rounded once to out's dtype; written. \
     offsets [T + 1], token_rows [R] i64. */                                                      \
  X(moe_unpermute, op, "moe_unpermute_bwd",                                                       \
    void(Tensor & out, const Tensor& rows, const Tensor& prob, const Tensor& offsets,             \
         const Tensor& token_rows))                                                               \
  /* drows[i] = prob[i] * dout[index[i]] (f64, rounded once; prob optional: 1); dprob [R] f64     \
     (optional) = sum_j dout[index[i], j] * rows[i, j] in f64, j ascending; both written. */      \
  X(moe_unpermute_bwd, op, "",                                                                    \
    void(Tensor & drows, Tensor & dprob, const Tensor& dout, const Tensor& rows,                  \
         const Tensor& prob, const Tensor& index))                                                \
  /* MoE dispatch index lists (MoeDispatchArgs a): the stable counting sort of the chosen         \
     experts, expert [N] i64 (N = tokens * a.topk, token-major), kept [N] u8 (optional: all       \
     kept). Selected: the kept choices whose expert is in [a.first_expert, a.first_expert + L).   \
     Written: counts [L], the selected choices per expert; rows ordered by expert, then choice:   \
     row_choice [N] (row r's choice) and row_token [N] (its token, choice / K) for r < R = the    \
     sum of counts, -1 after; moe_unpermute's lists choice_offsets [N + 1] / choice_rows [N]      \
     (each choice's row, none when not selected) and token_offsets [N / K + 1] / token_rows       \
     [N] (each token's rows ascending), -1 after R; choice_counts [G, E] (optional) = the         \
     choices i in [a.count_first, a.count_first + a.count_num) per expert before selection,       \
     in row ((i - a.count_first) / K) mod G. All i64. */                                          \
  X(moe_dispatch_index, op, "",                                                                   \
    void(Tensor & counts, Tensor & choice_counts, Tensor & row_choice, Tensor & row_token,        \
         Tensor & choice_offsets, Tensor & choice_rows, Tensor & token_offsets,                   \
         Tensor & token_rows, const Tensor& expert, const Tensor& kept,                           \
         const MoeDispatchArgs& args))                                                            \
  /* The all-to-all's received rows, chunks [source rank j][local expert i] of counts [EP, L]     \
     i64 rows, put in [i][j] order: order [R] i64 = each [i][j]-ordered row's index in the        \
     received layout, inverse [R] i64 its inverse (R = the sum of counts); written. */            \
  X(moe_chunk_order, op, "", void(Tensor & order, Tensor & inverse, const Tensor& counts))        \
  /* MoE router (MoeRouterArgs a): logits [T, E] f32/f64, expert_bias [E] f32 (optional; sigmoid) \
     -> expert [T, K] i64 (descending score, ties to the lower expert), prob [T, K] f64, kept     \
     [T, K] u8 (0: dropped for capacity), scores [T, E] f64 (the score function's, saved),        \
     tokens_per_expert [E] f64 (choices before dropping), expert_counts [E] i64 (the kept         \
     choices), aux_sums [G, E] f64 (row g: the sum over the tokens t = g mod G, ascending, of     \
     the load-balancing scores), z_sum [1] f64 (sum over t of logsumexp(l_t)^2); the last         \
     four optional; all written. */                                                               \
  X(moe_router_topk, op, "moe_router_topk_bwd",                                                   \
    void(Tensor & expert, Tensor & prob, Tensor & kept, Tensor & scores,                          \
         Tensor & tokens_per_expert, Tensor & expert_counts, Tensor & aux_sums, Tensor & z_sum,   \
         const Tensor& logits, const Tensor& expert_bias, const MoeRouterArgs& a))                \
  /* dlogits [T, E] f64 (written) = d(prob) [T, K] f64 through the routing (dropped choices       \
     give nothing), + d(load-balancing scores)[t, e] = aux_dscores[t mod G, e] ([G, E] f64,       \
     optional) through them, + the z-loss's gradient (a.z_loss_coeff > 0), in that order;         \
     from the forward's logits, expert, prob, kept and scores */                                  \
  X(moe_router_topk_bwd, op, "",                                                                  \
    void(Tensor & dlogits, const Tensor& dprob, const Tensor& aux_dscores, const Tensor& logits,  \
         const Tensor& expert, const Tensor& prob, const Tensor& kept, const Tensor& scores,      \
         const MoeRouterArgs& a))                                                                 \
  /* MoE shared-expert gate (--moe-shared-expert-gate, Qwen2-MoE's sigmoid gate): per token t,    \
     g_t = sigmoid(x_t . w) with the dot in f64 (j ascending), gate [T] f64 = g_t, out [T, H] =   \
     y_t + g_t * z_t in f64 rounded once to out's dtype; y [T, H] f64 (the routed experts' sum),  \
     z [T, H] (the shared experts' output), x [T, H], w [H] kernel floats; written. */            \
  X(moe_shared_gate_fwd, op, "moe_shared_gate_bwd",                                               \
    void(Tensor & out, Tensor & gate, const Tensor& y, const Tensor& z, const Tensor& x,          \
         const Tensor& w))                                                                        \
  /* its backward, from the forward's gate: dz [T, H] = g_t * dy_t, dg_t = (dy_t . z_t) g_t       \
     (1 - g_t) (the dot in f64, j ascending), dx [T, H] = dg_t * w (dz and dx rounded once to     \
     their dtypes), dw [H] f64 = sum over t ascending of dg_t * x_t; all written (the caller adds \
     dx and dw where they accumulate). */                                                         \
  X(moe_shared_gate_bwd, op, "",                                                                  \
    void(Tensor & dz, Tensor & dx, Tensor & dw, const Tensor& dy, const Tensor& z,                \
         const Tensor& x, const Tensor& w, const Tensor& gate))                                   \
  /* ---- optimizer and multi-tensor utilities ---- */                                            \
  X(adamw_step, op, "", void(std::span<const AdamParam> params, const AdamArgs& args))            \
  /* out [1] f32 or f64 (caller's choice) = sum of squares of all elements of all xs */           \
  X(l2_norm_sq, op, "", void(Tensor & out, std::span<const Tensor> xs))                           \
  /* x *= factor in place; found_nonfinite ([1] f32, optional) set to 1 if any result is inf/nan  \
   */                                                                                             \
  X(multi_tensor_scale, op, "",                                                                   \
    void(std::span<Tensor> xs, double factor, Tensor& found_nonfinite))                           \
  /* ---- initialisation (counter-based, TP-invariant: see InitArgs) ---- */                      \
  X(init_normal, op, "", void(Tensor & x, const InitArgs& args))                                  \
  X(init_uniform, op, "", void(Tensor & x, const InitArgs& args))                                 \
  /* ---- named overridable functions ---- */                                                     \
  /* global L2 norm of the gradients this rank counts, reduced over the parallel groups of args   \
     (GradNormArgs; a default args is one process) */                                             \
  X(grad_norm, function, "", double(std::span<const Tensor> grads, const GradNormArgs& args))     \
  /* scales grads by max_norm/norm when norm > max_norm (Megatron's clip_grad_norm_fp32), norm =  \
     grad_norm(grads_for_norm, args); returns the norm before clipping */                         \
  X(clip_grad_norm, function, "",                                                                 \
    double(std::span<Tensor> grads, std::span<const Tensor> grads_for_norm, double max_norm,      \
           const GradNormArgs& args))                                                             \
  /* FP8 casts fused with the op that makes their operand (docs/fp8.md): fp8_cast_transpose of    \
     y = swiglu_fwd(x) [R,F] (x [R,2F]), resp. of dx = swiglu_bwd(dy, x) [R,2F], the operand      \
     rounded to x's dtype as the unfused op stores it (the same q, qt and amax) but never         \
     written; generic default: the two ops */                                                     \
  X(fp8_swiglu_cast_transpose, function, "",                                                      \
    void(Tensor & q, Tensor & qt, Tensor & amax, const Tensor& x, const Tensor& scale))           \
  X(fp8_dswiglu_cast_transpose, function, "",                                                     \
    void(Tensor & q, Tensor & qt, Tensor & amax, const Tensor& dy, const Tensor& x,               \
         const Tensor& scale))                                                                    \
  /* FP8 cast fused with the norm in front of a linear (docs/fp8.md "Fused casts"): y = norm(x)   \
     by kind (layernorm_fwd / rmsnorm_fwd; residual defined: of sum = residual + dropout(x +      \
     bias), written, as bias_dropout_add_norm_fwd), mean / rstd written as those ops write them,  \
     q [R,C] and qt [C,R] (each optional) and amax as fp8_cast_transpose of y rounded to x's      \
     dtype, y never written; generic default: the norm op, then fp8_cast_transpose */             \
  X(fp8_norm_cast_transpose, function, "",                                                        \
    void(Tensor & q, Tensor & qt, Tensor & amax, Tensor & sum, Tensor & mean, Tensor & rstd,      \
         const Tensor& x, const Tensor& bias, const Tensor& residual, const Tensor& gamma,        \
         const Tensor& beta, const Tensor& scale, const DropoutArgs& dropout,                     \
         const NormArgs& args, NormKind kind))
