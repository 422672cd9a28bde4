// Self-attention forward/backward over the gemm, rope, norm and attention ops (attention.h).
// Gradient rule: parameter gradients +=, activation gradients =.
#include "megatron/core/transformer/attention.h"

#include "megatron/core/common/error.h"

namespace mg::transformer {

SelfAttention::SelfAttention(const ModuleContext& ctx, ParamBuilder& pb, const std::string& prefix,
                             const SelfAttentionSpec& spec)
    : ctx_(ctx) {
  const TransformerConfig& c = *ctx.config;
  // This TP rank's heads: whole KV groups (an error naming the values when TP does not divide).
  const tensor_parallel::AttentionPartition ap = tensor_parallel::attention_partition(
      c.num_attention_heads, c.num_query_groups, ctx.tp_rank(), ctx.tp_size());
  nh_ = ap.heads;
  ng_ = ap.groups;
  hd_ = c.kv_channels;
  h_ = c.hidden_size;
  rope_ = c.position_embedding_type == PositionEmbeddingType::rope;
  // Column-parallel QKV: contiguous rows = whole groups in the grouped layout (FORMATS.md §6.2).
  pb.add(qkv_w_, prefix + "linear_qkv.weight", {c.qkv_projection_size(), h_}, InitRule::normal,
         ctx.tp_partition(0));
  if (c.add_bias_linear || c.add_qkv_bias)
    pb.add(qkv_b_, prefix + "linear_qkv.bias", {c.qkv_projection_size()}, InitRule::zeros,
           ctx.tp_partition(0));
  if (c.qk_layernorm) {
    MG_CHECK(spec.q_layernorm != NormSlot::identity && spec.k_layernorm != NormSlot::identity,
             "qk_layernorm is set but the layer spec has no q/k layernorm slot");
    // Each rank normalises only its heads: the grads are partial sums over TP.
    q_norm_ = std::make_unique<Norm>(ctx, pb, prefix + "q_layernorm.weight",
                                     prefix + "q_layernorm.bias", hd_, true);
    k_norm_ = std::make_unique<Norm>(ctx, pb, prefix + "k_layernorm.weight",
                                     prefix + "k_layernorm.bias", hd_, true);
  }
  // Row-parallel linear_proj; its replicated bias is added by the layer's bias-dropout-add, on
  // sequence shards under SP (grads then summed over TP).
  pb.add(proj_w_, prefix + "linear_proj.weight", {h_, c.query_projection_size()},
         InitRule::scaled_normal, ctx.tp_partition(1));
  if (c.add_bias_linear)
    pb.add(proj_b_, prefix + "linear_proj.bias", {h_}, InitRule::zeros,
           tensor_parallel::Partition{}, ctx.sequence_parallel && ctx.tp_size() > 1);
}

void SelfAttention::ungroup(const Tensor& grouped, Tensor& q, Tensor& k, Tensor& v) const {
  const int64_t qpg = nh_ / ng_;
  for (int64_t g = 0; g < ng_; ++g) {
    const int64_t base = g * (qpg + 2) * hd_;
    q.slice(g * qpg * hd_, qpg * hd_).copy_(grouped.slice(base, qpg * hd_));
    k.slice(g * hd_, hd_).copy_(grouped.slice(base + qpg * hd_, hd_));
    v.slice(g * hd_, hd_).copy_(grouped.slice(base + (qpg + 1) * hd_, hd_));
  }
}

// x2 [N, H] -> q [N, NH HD], k and v [N, NG HD]: the weight (and bias) rows regrouped as
// [q-all; k-all; v-all], then one GEMM per part (the bias as the GEMM's bias epilogue). Shared by
// forward() and infer(), so that the KV-cache path has the training numerics.
void SelfAttention::project_qkv(const Tensor& x2, Tensor& q, Tensor& k, Tensor& v) const {
  const int64_t n = x2.size(0);
  Tensor w = ctx_.empty(qkv_w_.value.shape());
  Tensor wq = w.slice(0, nh_ * hd_), wk = w.slice(nh_ * hd_, ng_ * hd_),
         wv = w.slice((nh_ + ng_) * hd_, ng_ * hd_);
  ungroup(qkv_w_.value, wq, wk, wv);
  if (qkv_b_.defined()) {
    Tensor bias = ctx_.empty(qkv_b_.value.shape());
    Tensor bq = bias.slice(0, nh_ * hd_), bk = bias.slice(nh_ * hd_, ng_ * hd_),
           bv = bias.slice((nh_ + ng_) * hd_, ng_ * hd_);
    ungroup(qkv_b_.value, bq, bk, bv);
    q = ctx_.empty({n, nh_ * hd_});
    k = ctx_.empty({n, ng_ * hd_});
    v = ctx_.empty({n, ng_ * hd_});
    const ops::GemmEpilogueArgs ea{.trans_b = true, .epilogue = ops::GemmEpilogue::bias};
    Tensor none, none2;
    ctx_.op().gemm_epilogue(q, none, none2, x2, wq, bq, ea);
    ctx_.op().gemm_epilogue(k, none, none2, x2, wk, bk, ea);
    ctx_.op().gemm_epilogue(v, none, none2, x2, wv, bv, ea);
  } else {
    q = linear_fwd(ctx_, x2, wq);
    k = linear_fwd(ctx_, x2, wk);
    v = linear_fwd(ctx_, x2, wv);
  }
}

void SelfAttention::add_grouped(Tensor& grouped, const Tensor& q, const Tensor& k,
                                const Tensor& v) const {
  const int64_t qpg = nh_ / ng_;
  for (int64_t g = 0; g < ng_; ++g) {
    const int64_t base = g * (qpg + 2) * hd_;
    Tensor gq = grouped.slice(base, qpg * hd_);
    Tensor gk = grouped.slice(base + qpg * hd_, hd_);
    Tensor gv = grouped.slice(base + (qpg + 1) * hd_, hd_);
    ctx_.op().axpy(gq, q.slice(g * qpg * hd_, qpg * hd_), 1.0f);
    ctx_.op().axpy(gk, k.slice(g * hd_, hd_), 1.0f);
    ctx_.op().axpy(gv, v.slice(g * hd_, hd_), 1.0f);
  }
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
  a.position_ids = in.position_ids;
  return a;
}

Tensor SelfAttention::forward(const Tensor& x, Saved& saved, const AttentionInputs& in,
                              const ops::DropoutArgs& attn_dropout, bool keep_core_out) const {
  const int64_t s = in.s, b = in.b, n = s * b;
  // TP region: x [S/TP, B, H] (SP) or [S, B, H] -> the full [S, B, H] on every TP rank.
  const Tensor xt = tp_region_enter(ctx_, x);
  if (ctx_.tp_size() > 1) saved.input = xt;
  const Tensor x2 = xt.view({n, h_});  // [N, H]
  Tensor q, k, v;                      // [N, NH HD], [N, NG HD], [N, NG HD]
  project_qkv(x2, q, k, v);
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
  saved.q = q;
  saved.k = k;
  saved.v = v;
  Tensor out = ctx_.empty({s, b, nh_, hd_});
  Tensor lse = new_lse(s, b);
  core_attention_fwd(out, lse, q, k, v, attention_args(in, attn_dropout));
  Tensor y = linear_fwd(ctx_, out.view({n, nh_ * hd_}), proj_w_.value);  // [N, H]
  if (keep_core_out) {
    saved.out = out;
    saved.lse = lse;
  }
  return tp_region_exit(ctx_, y.view({s, b, h_}));  // partial sums over TP -> reduced
}

Tensor SelfAttention::backward(const Tensor& dy, const Tensor& x, Saved& saved,
                               const AttentionInputs& in, const ops::DropoutArgs& attn_dropout) {
  const int64_t s = in.s, b = in.b, n = s * b;
  const ops::AttentionArgs aa = attention_args(in, attn_dropout);
  if (!saved.out.defined()) {  // selective recompute: core attention again, same dropout mask
    saved.out = ctx_.empty({s, b, nh_, hd_});
    saved.lse = new_lse(s, b);
    core_attention_fwd(saved.out, saved.lse, saved.q, saved.k, saved.v, aa);
  }
  // linear_proj: d(out) [N, NH HD], dW_proj += dy^T out.
  const Tensor dyt = tp_region_exit_bwd(ctx_, dy);  // [S, B, H]
  Tensor dout = ctx_.empty({n, nh_ * hd_});
  linear_bwd(ctx_, dout, proj_w_.grad, dyt.view({n, h_}), saved.out.view({n, nh_ * hd_}),
             proj_w_.value);
  Tensor dq = ctx_.empty({s, b, nh_, hd_});
  Tensor dk = ctx_.empty({s, b, ng_, hd_});
  Tensor dv = ctx_.empty({s, b, ng_, hd_});
  core_attention_bwd(dq, dk, dv, dout.view({s, b, nh_, hd_}), saved.q, saved.k, saved.v, saved.out,
                     saved.lse, aa);
  saved.out = Tensor();
  saved.lse = Tensor();
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
  const Tensor x2 = (saved.input.defined() ? saved.input : x).view({n, h_});
  saved.input = Tensor();
  // qkv weight gradient in [q-all; k-all; v-all] order, then added into the grouped main_grad.
  const int64_t rq = nh_ * hd_, rk = ng_ * hd_;
  Tensor dw = Tensor::empty(qkv_w_.grad.shape(), ctx_.grad_dtype, ctx_.device);
  Tensor dwq = dw.slice(0, rq), dwk = dw.slice(rq, rk), dwv = dw.slice(rq + rk, rk);
  if (qkv_b_.defined()) {  // dW = dq^T x with dbias = sum_n dq on the same GEMM (bgrad epilogue)
    Tensor db = Tensor::zeros(qkv_b_.grad.shape(), ctx_.grad_dtype, ctx_.device);
    Tensor dbq = db.slice(0, rq), dbk = db.slice(rq, rk), dbv = db.slice(rq + rk, rk);
    const ops::GemmEpilogueArgs wgrad{.trans_a = true, .epilogue = ops::GemmEpilogue::bgrad};
    Tensor none;
    ctx_.op().gemm_epilogue(dwq, none, dbq, dq2, x2, Tensor(), wgrad);
    ctx_.op().gemm_epilogue(dwk, none, dbk, dk2, x2, Tensor(), wgrad);
    ctx_.op().gemm_epilogue(dwv, none, dbv, dv2, x2, Tensor(), wgrad);
    add_grouped(qkv_b_.grad, dbq, dbk, dbv);
  } else {
    const ops::GemmArgs wgrad{.trans_a = true, .beta = 0.0f};
    ctx_.op().gemm(dwq, dq2, x2, wgrad);
    ctx_.op().gemm(dwk, dk2, x2, wgrad);
    ctx_.op().gemm(dwv, dv2, x2, wgrad);
  }
  add_grouped(qkv_w_.grad, dwq, dwk, dwv);
  // dx = dq Wq + dk Wk + dv Wv with the regrouped weight.
  Tensor w = ctx_.empty(qkv_w_.value.shape());
  Tensor wq = w.slice(0, rq), wk = w.slice(rq, rk), wv = w.slice(rq + rk, rk);
  ungroup(qkv_w_.value, wq, wk, wv);
  Tensor dx = ctx_.empty({n, h_});
  ctx_.op().gemm(dx, dq2, wq, ops::GemmArgs{});
  ctx_.op().gemm(dx, dk2, wk, ops::GemmArgs{.beta = 1.0f});
  ctx_.op().gemm(dx, dv2, wv, ops::GemmArgs{.beta = 1.0f});
  return tp_region_enter_bwd(ctx_, dx.view({s, b, h_}));  // summed over TP (or reduce-scattered)
}

}  // namespace mg::transformer
