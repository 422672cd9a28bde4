// Self-attention: linear_qkv -> [q/k layernorm] -> [rope] -> core attention -> linear_proj, each
// slot as the spec (SelfAttentionSubmodules) names it.
//
// linear_qkv is a tensor_parallel::ColumnParallelLinear whose weight is Megatron's fused GQA
// layout [(NH + 2 NG) HD, H], grouped by KV group (FORMATS.md §6.2: q rows of the group's NH/NG
// heads, then k, then v). The attention op wants q [S, B, NH, HD] and k, v [S, B, NG, HD] as
// separate contiguous tensors, so the layer runs with an OutputSplit (layers.h): the weight's row
// blocks regrouped into [q-all; k-all; v-all] and one GEMM per part; backward adds each row block
// of the weight gradient back into the grouped main_grad. The activations are never permuted.
// linear_proj is a RowParallelLinear with skip_bias_add: the layer's bias-dropout-add adds its
// bias (as Megatron).
// Tensor parallelism (ctx.tp_group): this rank holds NH/TP heads and NG/TP whole KV groups
// (linear_qkv rows) and the matching linear_proj columns; the input enters the TP region in
// linear_qkv (copy, or SP all-gather) and the output leaves it in linear_proj (all-reduce, or SP
// reduce-scatter). NH and NH/NG below are this rank's.
// Context parallelism (ctx.cp active): S is this rank's two sequence chunks (2C tokens); only core
// attention crosses the CP group (context_parallel.h), and its lse is then cp_lse_shape's.
#pragma once

#include <memory>
#include <string>

#include "megatron/core/inference/inference_context.h"
#include "megatron/core/tensor_parallel/layers.h"
#include "megatron/core/transformer/module.h"
#include "megatron/core/transformer/norm.h"
#include "megatron/core/transformer/transformer_layer_spec.h"

namespace mg::transformer {

// Per-micro-batch inputs shared by every layer.
struct AttentionInputs {
  int64_t s = 0, b = 0;
  Tensor position_ids;  // [B, S] on the device (rope), optional
  Tensor doc_ids;       // [B, S] i32 on the device, optional
};

class SelfAttention {
 public:
  struct Saved {
    Tensor q, k, v;       // after qk-norm and rope: [S, B, NH, HD], [S, B, NG, HD]
    Tensor q_pre, k_pre;  // before q/k layernorm (qk_layernorm only)
    Norm::Saved q_norm, k_norm;
    Tensor out, lse;  // core attention [S, B, NH, HD], [B, NH, S] (CP: cp_lse_shape); empty
                      // when recomputed
    tensor_parallel::ColumnParallelLinear::Saved qkv;  // TP > 1: the input in the TP region
    tensor_parallel::RowParallelLinear::Saved proj;    // FP8: the forward's casts
    // --fp8-dot-product-attention: q, k, v (after qk-norm and rope) and the core attention's out
    // as FP8, the forward's scale vectors (copies: the update after the forward changes the
    // state's); q, k, v above then stay empty (NVTE_FP8_DPA_BWD=0: kept for the model-dtype
    // backward) and out above is not used (lse is the FP8 forward's). Under
    // --fp8-multi-head-attention fp8.out is also linear_proj's input.
    struct Fp8 {
      Tensor q, k, v, out, fwd_scale, fwd_scale_inv;
    } fp8;
  };

  // prefix: "decoder.layers.N.self_attention."
  SelfAttention(const ModuleContext& ctx, ParamBuilder& pb, const std::string& prefix,
                const SelfAttentionSubmodules& spec);

  // x [S, B, H] (normalised) -> linear_proj(x) without its bias [S, B, H].
  // keep_core_out = false (selective recompute) drops out/lse after linear_proj.
  // xop: linear_qkv's input made inside its FP8 cast instead (the norm in front,
  // fp8::Operand::normed; x undefined, and backward then takes an undefined x); needs
  // fuses_input_norm().
  Tensor forward(const Tensor& x, Saved& saved, const AttentionInputs& in,
                 const ops::DropoutArgs& attn_dropout, bool keep_core_out,
                 const fp8::Operand* xop = nullptr) const;
  bool fuses_input_norm() const { return linear_qkv_->fuses_input_operand(); }
  // dy [S, B, H] -> dx [S, B, H] (written); accumulates qkv/proj/qk-norm grads.
  Tensor backward(const Tensor& dy, const Tensor& x, Saved& saved, const AttentionInputs& in,
                  const ops::DropoutArgs& attn_dropout);

  const Weight& proj_bias() const { return linear_proj_->bias(); }
  Weight& proj_bias() { return linear_proj_->bias(); }

  // ---- inference with a KV cache (megatron/core/inference/; inference_forward.cpp) ----
  // x [Sq, B, H] (normalised): the next Sq tokens, at positions ic.sequence_len_offset + [0, Sq).
  // Their k and v are written into layer `layer`'s cache rows, q attends to the cached keys
  // [0, offset + Sq) (causal, bottom-right aligned) -> linear_proj output without its bias
  // [Sq, B, H]. No dropout; nothing saved; does not advance the offset (GPTModel::infer does).
  Tensor infer(const Tensor& x, inference::StaticInferenceContext& ic, int64_t layer) const;

 private:
  ops::AttentionArgs attention_args(const AttentionInputs& in,
                                    const ops::DropoutArgs& attn_dropout) const;
  ops::RopeArgs rope_args(const AttentionInputs& in) const;
  // Core attention on this rank's heads, across the CP group when ctx.cp is active.
  Tensor new_lse(int64_t s, int64_t b) const;
  void core_attention_fwd(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                          const Tensor& v, const ops::AttentionArgs& a) const;
  void core_attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const ops::AttentionArgs& a) const;
  // x [S, B, H] -> q [N, NH HD], k, v [N, NG HD] (+ the QKV bias, as a GEMM epilogue).
  void project_qkv(const Tensor& x, Saved& saved, Tensor& q, Tensor& k, Tensor& v,
                   const fp8::Operand* xop = nullptr) const;

  // --fp8-dot-product-attention: the core attention in FP8 (q, k, v cast, the fp8_attention
  // forward op; saved.fp8.out the FP8 out) and its backward on the FP8 output gradient do8 (dq,
  // dk, dv dequantised); saved.fp8 holds what the backward reads.
  void fp8_core_attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, Saved& saved,
                              const ops::AttentionArgs& a) const;
  void fp8_core_attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& do8,
                              const Saved& saved, const ops::AttentionArgs& a) const;
  // --fp8-multi-head-attention: the FP8 out goes to linear_proj as it is (no dequantise, no cast).
  bool fp8_mha() const;

  const ModuleContext& ctx_;
  int fp8_attn_id_ = -1;  // the Fp8State attention id; -1: core attention in the model dtype
  int64_t nh_, ng_, hd_, h_;
  bool rope_;
  tensor_parallel::OutputSplit qkv_split_;  // the grouped rows of linear_qkv -> q, k, v
  std::unique_ptr<tensor_parallel::ColumnParallelLinear> linear_qkv_;
  std::unique_ptr<Norm> q_norm_, k_norm_;
  std::unique_ptr<tensor_parallel::RowParallelLinear> linear_proj_;
};

}  // namespace mg::transformer
