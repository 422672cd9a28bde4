// Self-attention forward/backward over the tensor-parallel linears (layers.h) and the rope, norm
// and attention ops (attention.h).
// Gradient rule: parameter gradients +=, activation gradients =.
#include "megatron/core/transformer/attention.h"

#include "megatron/core/common/error.h"

namespace mg::transformer {

SelfAttention::SelfAttention(const ModuleContext& ctx, ParamBuilder& pb, const std::string& prefix,
                             const SelfAttentionSubmodules& spec)
    : ctx_(ctx) {
  const TransformerConfig& c = *ctx.config;
  MG_CHECK(
      spec.linear_qkv == LinearImpl::column_parallel,
      prefix << "linear_qkv: the fused QKV is column-parallel only (LinearImpl::column_parallel)");
  MG_CHECK(spec.linear_proj == LinearImpl::row_parallel,
           prefix << "linear_proj: row-parallel only (LinearImpl::row_parallel)");
  switch (spec.core_attention) {
    case CoreAttentionImpl::dot_product:  // attention_fwd/bwd, or the CP ring (core_attention_*)
      break;
  }
  // This TP rank's heads: whole KV groups (an error naming the values when TP does not divide).
  const tensor_parallel::AttentionPartition ap = tensor_parallel::attention_partition(
      c.num_attention_heads, c.num_query_groups, ctx.tp_rank(), ctx.tp_size());
  nh_ = ap.heads;
  ng_ = ap.groups;
  hd_ = c.kv_channels;
  h_ = c.hidden_size;
  rope_ = c.position_embedding_type == PositionEmbeddingType::rope;
  // The grouped rows (per KV group: its q heads, then k, then v) as parts q, k, v.
  const int64_t qpg = nh_ / ng_;
  qkv_split_.part_rows = {nh_ * hd_, ng_ * hd_, ng_ * hd_};
  for (int64_t g = 0; g < ng_; ++g) {
    const int64_t base = g * (qpg + 2) * hd_;
    qkv_split_.blocks.push_back({0, base, qpg * hd_});
    qkv_split_.blocks.push_back({1, base + qpg * hd_, hd_});
    qkv_split_.blocks.push_back({2, base + (qpg + 1) * hd_, hd_});
  }
  // Column-parallel QKV: contiguous rows = whole groups in the grouped layout; the bias (if any)
  // always in the GEMM epilogues.
  linear_qkv_ = std::make_unique<tensor_parallel::ColumnParallelLinear>(
      ctx, pb, prefix + "linear_qkv.",
      tensor_parallel::ColumnParallelLinearConfig{.input_size = h_,
                                                  .output_size = c.qkv_projection_size(),
                                                  .bias = c.add_bias_linear || c.add_qkv_bias,
                                                  .init = InitRule::normal,
                                                  .gemm_bias_fusion = true});
  if (spec.q_layernorm.impl != NormImpl::identity || spec.k_layernorm.impl != NormImpl::identity) {
    MG_CHECK(
        spec.q_layernorm.impl != NormImpl::identity && spec.k_layernorm.impl != NormImpl::identity,
        prefix << ": the spec has a q layernorm or a k layernorm but not both");
    // Each rank normalises only its heads: the grads are partial sums over TP.
    q_norm_ = std::make_unique<Norm>(ctx, pb, spec.q_layernorm.impl, prefix + "q_layernorm.weight",
                                     prefix + "q_layernorm.bias", hd_, true);
    k_norm_ = std::make_unique<Norm>(ctx, pb, spec.k_layernorm.impl, prefix + "k_layernorm.weight",
                                     prefix + "k_layernorm.bias", hd_, true);
  }
  // --fp8-dot-product-attention: this layer's core attention in FP8 when FP8 covers the layer.
  if (c.fp8.dot_product_attention && ctx.fp8_covers(prefix)) {
    MG_CHECK(!ctx.cp.active(), prefix
                                   << "core_attention: --fp8-dot-product-attention with context "
                                      "parallelism is not built (use --context-parallel-size 1)");
    fp8_attn_id_ = ctx.fp8->add_attention(prefix + "core_attention");
  }
  // Row-parallel linear_proj; its replicated bias is added by the layer's bias-dropout-add, on
  // sequence shards under SP (grads then summed over TP).
  linear_proj_ = std::make_unique<tensor_parallel::RowParallelLinear>(
      ctx, pb, prefix + "linear_proj.",
      tensor_parallel::RowParallelLinearConfig{.input_size = c.query_projection_size(),
                                               .output_size = h_,
                                               .bias = c.add_bias_linear,
                                               .input_is_parallel = true,
                                               .skip_bias_add = true,
                                               .init = InitRule::scaled_normal});
}

// x [S, B, H] -> q [N, NH HD], k and v [N, NG HD]: linear_qkv with the grouped rows split into
// q, k, v (one GEMM per part, the bias as the GEMM's bias epilogue). Shared by forward() and
// infer(), so that the KV-cache path has the training numerics.
void SelfAttention::project_qkv(const Tensor& x, Saved& saved, Tensor& q, Tensor& k, Tensor& v,
                                const fp8::Operand* xop) const {
  const std::vector<Tensor> parts = xop ? linear_qkv_->forward_split(*xop, saved.qkv, qkv_split_)
                                        : linear_qkv_->forward_split(x, saved.qkv, qkv_split_);
  q = parts[0];
  k = parts[1];
  v = parts[2];
}

ops::AttentionArgs SelfAttention::attention_args(const AttentionInputs& in,
                                                 const ops::DropoutArgs& attn_dropout) const {
  ops::AttentionArgs a;
  a.causal = true;
  a.doc_ids = in.doc_ids;
  a.dropout = attn_dropout;
  return a;
}

Tensor SelfAttention::new_lse(int64_t s, int64_t b) const {
  return Tensor::empty(cp_lse_shape(ctx_.cp, s, b, nh_), ctx_.stat_dtype(), ctx_.device);
}

void SelfAttention::core_attention_fwd(Tensor& out, Tensor& lse, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const ops::AttentionArgs& a) const {
  if (ctx_.cp.active())
    cp_attention_fwd(ctx_.op(), ctx_.cp, out, lse, q, k, v, a);
  else
    ctx_.op().attention_fwd(out, lse, q, k, v, a);
}

void SelfAttention::core_attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout,
                                       const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& out, const Tensor& lse,
                                       const ops::AttentionArgs& a) const {
  if (ctx_.cp.active())
    cp_attention_bwd(ctx_.op(), ctx_.cp, dq, dk, dv, dout, q, k, v, out, lse, a);
  else
    ctx_.op().attention_bwd(dq, dk, dv, dout, q, k, v, out, lse, a);
}

ops::RopeArgs SelfAttention::rope_args(const AttentionInputs& in) const {
  const TransformerConfig& c = *ctx_.config;
  ops::RopeArgs a;
  a.base = static_cast<float>(c.rotary_base);
  a.rotary_percent = static_cast<float>(c.rotary_percent);
  a.interleaved = c.rotary_interleaved;
  a.scaling = c.rope_scaling;
  a.position_ids = in.position_ids;
  return a;
}

// FP8 core attention (docs/fp8.md "FP8 attention"): q, k and v cast at the QKV scale (one amax,
// Transformer Engine's QKV quantizer), the fp8_attention forward op into saved.fp8.out. The
// forward's scale vectors are copied: the update after the forward changes the state, and the
// backward (and a recompute) must use these.
void SelfAttention::fp8_core_attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                           Saved& saved, const ops::AttentionArgs& a) const {
  fp8::Fp8State& st = *ctx_.fp8;
  const bool training = ctx_.fp8_training;
  Saved::Fp8& f = saved.fp8;
  const fp8::Scaling sq = st.attention_scaling(fp8_attn_id_, true, training);
  st.cast(sq, q, &f.q, nullptr);
  st.cast(sq, k, &f.k, nullptr);
  st.cast(sq, v, &f.v, nullptr);
  const fp8::Fp8State::AttentionScales sc = st.attention_scales(fp8_attn_id_);
  f.fwd_scale = sc.fwd_scale.clone();
  f.fwd_scale_inv = sc.fwd_scale_inv.clone();
  f.out = Tensor::empty(q.shape(), sq.dtype, ctx_.device);
  saved.lse = new_lse(q.size(0), q.size(1));
  Tensor amax = Tensor::empty({2}, DType::f32, ctx_.device);
  ctx_.op().fp8_attention_fwd(f.out, saved.lse, amax, f.q, f.k, f.v, f.fwd_scale, f.fwd_scale_inv,
                              a);
  st.record_attention_amax(fp8_attn_id_, true, amax, training);
}

// Its backward on do8, the output gradient at the dO scale (cast by the caller, or written in FP8
// by linear_proj's data-gradient GEMM under --fp8-multi-head-attention); the dQKV gradients
// dequantised. (Under selective recompute backward() has first rerun the forward op on the saved
// FP8 q, k, v with the saved scales: the same out and lse bytes, no amax recorded.)
void SelfAttention::fp8_core_attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& do8,
                                           const Saved& saved, const ops::AttentionArgs& a) const {
  fp8::Fp8State& st = *ctx_.fp8;
  const bool training = ctx_.fp8_training;
  const Saved::Fp8& f = saved.fp8;
  const fp8::Fp8State::AttentionScales sc = st.attention_scales(fp8_attn_id_);
  Tensor dq8 = Tensor::empty(dq.shape(), do8.dtype(), ctx_.device);
  Tensor dk8 = Tensor::empty(dk.shape(), do8.dtype(), ctx_.device);
  Tensor dv8 = Tensor::empty(dv.shape(), do8.dtype(), ctx_.device);
  Tensor amax = Tensor::empty({4}, DType::f32, ctx_.device);
  ctx_.op().fp8_attention_bwd(dq8, dk8, dv8, amax, do8, f.q, f.k, f.v, f.out, saved.lse,
                              f.fwd_scale, f.fwd_scale_inv, sc.bwd_scale, sc.bwd_scale_inv, a);
  st.record_attention_amax(fp8_attn_id_, false, amax, training);
  const Tensor dqkv_inv = sc.bwd_scale_inv.slice(2, 1);
  ctx_.op().fp8_dequantize(dq, dq8, dqkv_inv);
  ctx_.op().fp8_dequantize(dk, dk8, dqkv_inv);
  ctx_.op().fp8_dequantize(dv, dv8, dqkv_inv);
}

bool SelfAttention::fp8_mha() const {
  return fp8_attn_id_ >= 0 && ctx_.config->fp8.multi_head_attention;
}

Tensor SelfAttention::forward(const Tensor& x, Saved& saved, const AttentionInputs& in,
                              const ops::DropoutArgs& attn_dropout, bool keep_core_out,
                              const fp8::Operand* xop) const {
  const int64_t s = in.s, b = in.b, n = s * b;
  // linear_qkv enters the TP region: x [S/TP, B, H] (SP) or [S, B, H] -> the full [S, B, H].
  Tensor q, k, v;  // [N, NH HD], [N, NG HD], [N, NG HD]
  project_qkv(x, saved, q, k, v, xop);
  if (q_norm_) {
    saved.q_pre = q;
    saved.k_pre = k;
    q = q_norm_->forward(q.view({n * nh_, hd_}), saved.q_norm);
    k = k_norm_->forward(k.view({n * ng_, hd_}), saved.k_norm);
  }
  q = q.view({s, b, nh_, hd_});
  k = k.view({s, b, ng_, hd_});
  v = v.view({s, b, ng_, hd_});
  if (rope_) {
    const ops::RopeArgs ra = rope_args(in);
    ctx_.op().rope_fwd(q, q, ra);  // in place
    ctx_.op().rope_fwd(k, k, ra);
  }
  if (fp8_attn_id_ >= 0) {  // FP8: saved.fp8 holds q, k, v and out; the dequantised out dies here
    if (!ctx_.config->fp8.dot_product_attention_fp8_backward) {  // NVTE_FP8_DPA_BWD=0
      saved.q = q;
      saved.k = k;
      saved.v = v;
    }
    fp8_core_attention_fwd(q, k, v, saved, attention_args(in, attn_dropout));
    Tensor y;
    if (fp8_mha()) {  // O at scale_O is linear_proj's FP8 input (TE's fp8_mha)
      y = linear_proj_->forward_fp8_input(saved.fp8.out.view({s, b, nh_ * hd_}),
                                          saved.fp8.fwd_scale_inv.slice(2, 1), saved.proj);
    } else {  // dequantised for linear_proj's own cast (TE's fp8_dpa without fp8_mha)
      Tensor out = ctx_.empty(q.shape());
      ctx_.op().fp8_dequantize(out, saved.fp8.out, saved.fp8.fwd_scale_inv.slice(2, 1));
      y = linear_proj_->forward(out.view({s, b, nh_ * hd_}), saved.proj);
    }
    if (!keep_core_out) {
      saved.fp8.out = Tensor();
      saved.lse = Tensor();
    }
    return y;
  }
  saved.q = q;
  saved.k = k;
  saved.v = v;
  Tensor out = ctx_.empty({s, b, nh_, hd_});
  Tensor lse = new_lse(s, b);
  core_attention_fwd(out, lse, q, k, v, attention_args(in, attn_dropout));
  // linear_proj: partial sums over TP -> reduced (SP: reduce-scattered) [S(/TP), B, H].
  Tensor y = linear_proj_->forward(out.view({s, b, nh_ * hd_}), saved.proj);
  if (keep_core_out) {
    saved.out = out;
    saved.lse = lse;
  }
  return y;
}

Tensor SelfAttention::backward(const Tensor& dy, const Tensor& x, Saved& saved,
                               const AttentionInputs& in, const ops::DropoutArgs& attn_dropout) {
  const int64_t s = in.s, b = in.b, n = s * b;
  const ops::AttentionArgs aa = attention_args(in, attn_dropout);
  Tensor dq, dk, dv;  // allocated after linear_proj's backward (its peak)
  auto alloc_grads = [&] {
    dq = ctx_.empty({s, b, nh_, hd_});
    dk = ctx_.empty({s, b, ng_, hd_});
    dv = ctx_.empty({s, b, ng_, hd_});
  };
  if (fp8_attn_id_ >= 0) {
    Saved::Fp8& f = saved.fp8;
    if (!f.out.defined()) {  // selective recompute: the same op, scales and bytes; no amax
      f.out = Tensor::empty(f.q.shape(), f.q.dtype(), ctx_.device);
      saved.lse = new_lse(s, b);
      Tensor scratch = Tensor::empty({2}, DType::f32, ctx_.device);
      ctx_.op().fp8_attention_fwd(f.out, saved.lse, scratch, f.q, f.k, f.v, f.fwd_scale,
                                  f.fwd_scale_inv, aa);
    }
    // linear_proj reads its input only for high-precision weight gradients, the model-dtype
    // backward (NVTE_FP8_DPA_BWD=0) reads out: dequantised again. Under
    // --fp8-multi-head-attention linear_proj's FP8 input was out itself: it takes it back.
    const bool fp8_bwd = ctx_.config->fp8.dot_product_attention_fp8_backward;
    const bool mha = fp8_mha();
    const bool proj_reads_hp = mha ? !ctx_.config->fp8.wgrad : !linear_proj_->fuses_input_cast();
    Tensor out;
    if (proj_reads_hp || !fp8_bwd) {
      out = ctx_.empty({s, b, nh_, hd_});
      ctx_.op().fp8_dequantize(out, f.out, f.fwd_scale_inv.slice(2, 1));
    }
    const Tensor proj_x = !proj_reads_hp && mha ? f.out.view({s, b, nh_ * hd_})
                          : out.defined()       ? out.view({s, b, nh_ * hd_})
                                                : out;
    if (fp8_bwd) {
      const fp8::Scaling sg = ctx_.fp8->attention_scaling(fp8_attn_id_, false, ctx_.fp8_training);
      Tensor do8;
      if (mha) {  // linear_proj's data-gradient GEMM writes dO in FP8 at the dO scale
        do8 = linear_proj_->backward_fp8_dgrad(dy, proj_x, saved.proj, sg);
      } else {
        const Tensor dout = linear_proj_->backward(dy, proj_x, saved.proj);
        ctx_.fp8->cast(sg, dout, &do8, nullptr);
      }
      alloc_grads();
      fp8_core_attention_bwd(dq, dk, dv, do8.view({s, b, nh_, hd_}), saved, aa);
    } else {  // TE's FP8 forward with the backward in the model dtype: q, k, v as they were
      const Tensor dout = linear_proj_->backward(dy, proj_x, saved.proj);
      alloc_grads();
      core_attention_bwd(dq, dk, dv, dout.view({s, b, nh_, hd_}), saved.q, saved.k, saved.v, out,
                         saved.lse, aa);
      saved.q = saved.k = saved.v = Tensor();
    }
    f = Saved::Fp8{};
    saved.lse = Tensor();
  } else {
    if (!saved.out.defined()) {  // selective recompute: core attention again, same dropout mask
      saved.out = ctx_.empty({s, b, nh_, hd_});
      saved.lse = new_lse(s, b);
      core_attention_fwd(saved.out, saved.lse, saved.q, saved.k, saved.v, aa);
    }
    // linear_proj: d(out) [S, B, NH HD], dW_proj += dy^T out.
    const Tensor dout = linear_proj_->backward(dy, saved.out.view({s, b, nh_ * hd_}), saved.proj);
    alloc_grads();
    core_attention_bwd(dq, dk, dv, dout.view({s, b, nh_, hd_}), saved.q, saved.k, saved.v,
                       saved.out, saved.lse, aa);
    saved.out = Tensor();
    saved.lse = Tensor();
  }
  if (rope_) {
    const ops::RopeArgs ra = rope_args(in);
    ctx_.op().rope_bwd(dq, dq, ra);  // in place
    ctx_.op().rope_bwd(dk, dk, ra);
  }
  Tensor dq2 = dq.view({n, nh_ * hd_}), dk2 = dk.view({n, ng_ * hd_}),
         dv2 = dv.view({n, ng_ * hd_});
  if (q_norm_) {
    dq2 = q_norm_->backward(dq.view({n * nh_, hd_}), saved.q_pre.view({n * nh_, hd_}), saved.q_norm)
              .view({n, nh_ * hd_});
    dk2 = k_norm_->backward(dk.view({n * ng_, hd_}), saved.k_pre.view({n * ng_, hd_}), saved.k_norm)
              .view({n, ng_ * hd_});
  }
  // linear_qkv: the weight (and bias) gradient per part added into the grouped main_grad rows;
  // dx = dq Wq + dk Wk + dv Wv, summed over TP (or reduce-scattered).
  const Tensor dx = linear_qkv_->backward_split({dq2, dk2, dv2}, x, saved.qkv, qkv_split_);
  return x.defined() ? dx : dx.view({s, b, h_});  // forward(xop): [N, H] back to [S, B, H]
}

}  // namespace mg::transformer
