// TransformerLayer forward/backward (transformer_layer.h).
// Gradient rule: parameter gradients +=, activation gradients =.
// Fusions (norm.cpp / norm.cu ops, bit-identical to the unfused sequences on the CPU): the
// attention bias-dropout-add and pre_mlp_layernorm run as one op (bias_dropout_add_norm_fwd); in
// backward each norm's dx and the residual gradient are summed in the norm's pass (norm_bwd_add).
// Not fused: the MLP bias-dropout-add with the next layer's input_layernorm (a cross-layer fusion),
// and inference (infer(), unfused ops).
#include "megatron/core/transformer/transformer_layer.h"

#include "megatron/core/common/error.h"
#include "megatron/core/tensor_parallel/random.h"

namespace mg::transformer {

namespace {

// Hidden dropout (bias-dropout-add) on `x`: under sequence parallelism x is this rank's sequence
// shard, drawn at the offset of its first element in the full [S, B, H] tensor, so its mask is the
// slice of the unsharded mask (tensor_parallel/random.h): SP on and off drop the same elements.
ops::DropoutArgs hidden_dropout(const ModuleContext& ctx, const DropoutCtx& rng, double p,
                                int64_t layer, DropoutSite site, const Tensor& x) {
  ops::DropoutArgs a = rng.args(p, layer, site);
  if (ctx.sequence_parallel && a.p > 0.0f)
    a.offset = static_cast<uint64_t>(ctx.tp_rank() * x.numel());
  return a;
}

// Attention-probability dropout acts on this rank's heads: with TP > 1 it draws from Megatron's
// model-parallel region (seed + 2718 + tp_rank), so ranks do not repeat each other's masks. One
// rank keeps the data-parallel seed (single-rank results unchanged; Megatron forks even at TP 1).
ops::DropoutArgs attention_dropout(const ModuleContext& ctx, const DropoutCtx& rng, double p,
                                   int64_t layer) {
  DropoutCtx r = rng;
  if (ctx.tp_size() > 1)
    r.seed =
        rng.seed + tensor_parallel::kModelParallelSeedOffset + static_cast<uint64_t>(ctx.tp_rank());
  return r.args(p, layer, DropoutSite::attention_probs);
}

// The norm module of a slot as the spec names it, or null (identity): parameters named as a
// separate module (input_layernorm.weight) or, TE naming, after the next linear
// (self_attention.linear_qkv.layer_norm_weight).
std::unique_ptr<Norm> make_norm(const ModuleContext& ctx, ParamBuilder& pb, const NormSpec& spec,
                                const std::string& separate_prefix,
                                const std::string& fused_prefix) {
  if (spec.impl == NormImpl::identity) return nullptr;
  const int64_t h = ctx.config->hidden_size;
  switch (spec.naming) {
    case NormNaming::separate:
      return std::make_unique<Norm>(ctx, pb, spec.impl, separate_prefix + "weight",
                                    separate_prefix + "bias", h, ctx.sequence_parallel);
    case NormNaming::fused_into_linear:
      return std::make_unique<Norm>(ctx, pb, spec.impl, fused_prefix + "layer_norm_weight",
                                    fused_prefix + "layer_norm_bias", h, ctx.sequence_parallel);
  }
  return nullptr;
}

}  // namespace

TransformerLayer::TransformerLayer(const ModuleContext& ctx, ParamBuilder& pb,
                                   const TransformerLayerSpec& spec, int64_t layer_number)
    : ctx_(ctx), layer_(layer_number) {
  const std::string p = "decoder.layers." + std::to_string(layer_number) + ".";
  MG_CHECK(spec.self_attn_bda == BdaImpl::fused && spec.mlp_bda == BdaImpl::fused,
           p << ": the bias-dropout-adds are the fused op only (BdaImpl::fused)");
  norm1_ = make_norm(ctx, pb, spec.input_layernorm, p + "input_layernorm.",
                     p + "self_attention.linear_qkv.");
  attn_ = std::make_unique<SelfAttention>(ctx, pb, p + "self_attention.", spec.self_attention);
  norm2_ =
      make_norm(ctx, pb, spec.pre_mlp_layernorm, p + "pre_mlp_layernorm.", p + "mlp.linear_fc1.");
  switch (spec.mlp.impl) {
    case MlpImpl::dense:
      mlp_ = std::make_unique<MLP>(ctx, pb, p + "mlp.", spec.mlp.submodules);
      break;
    case MlpImpl::moe:
      moe_ =
          std::make_unique<moe::MoELayer>(ctx, pb, p + "mlp.", layer_number, spec.mlp.submodules);
      break;
  }
  const bool fuse = ctx.config->fp8.enabled() && ctx.config->fp8.norm_cast_fusion;
  fuse_norm1_ = fuse && norm1_ && attn_->fuses_input_norm();
  fuse_norm2_ = fuse && norm2_ && mlp_ && mlp_->fuses_input_norm();
}

Tensor TransformerLayer::forward(const Tensor& x, Saved& saved, const AttentionInputs& in,
                                 const DropoutCtx& rng, bool keep_core_attention) const {
  const TransformerConfig& c = *ctx_.config;
  saved.x = x;
  const ops::DropoutArgs probs = attention_dropout(ctx_, rng, c.attention_dropout, layer_);
  Tensor y;
  if (fuse_norm1_) {  // input_layernorm made inside linear_qkv's FP8 cast: ln1 never written
    fp8::NormFusion nf;
    const fp8::Operand ln1 = norm1_->fp8_operand(x, saved.norm1, nf);
    saved.ln1 = Tensor();
    y = attn_->forward(Tensor(), saved.attn, in, probs, keep_core_attention, &ln1);
  } else {
    saved.ln1 = norm1_ ? norm1_->forward(x, saved.norm1) : x;
    y = attn_->forward(saved.ln1, saved.attn, in, probs, keep_core_attention);
  }
  // self_attn_bda + pre_mlp_layernorm in one op (h written, then normalised from the stored h).
  const ops::DropoutArgs bda1 =
      hidden_dropout(ctx_, rng, c.hidden_dropout, layer_, DropoutSite::attention_bda, x);
  Tensor h, z;
  if (fuse_norm2_) {  // ... inside linear_fc1's FP8 cast, which writes h: ln2 never written
    fp8::NormFusion nf;
    const fp8::Operand ln2 =
        norm2_->fp8_operand_bda(y, attn_->proj_bias().value, x, bda1, h, saved.norm2, nf);
    saved.ln2 = Tensor();
    saved.h = h;
    z = mlp_->forward(ln2, saved.mlp);
  } else {
    if (norm2_) {
      saved.ln2 = norm2_->forward_bda(y, attn_->proj_bias().value, x, bda1, h, saved.norm2);
    } else {
      h = ctx_.empty(x.shape());
      ctx_.op().bias_dropout_add_fwd(h, y, attn_->proj_bias().value, x, bda1);
      saved.ln2 = h;
    }
    saved.h = h;
    z = moe_ ? moe_->forward(saved.ln2, saved.moe, rng.training)
             : mlp_->forward(saved.ln2, saved.mlp);
  }
  Tensor out = ctx_.empty(x.shape());
  ctx_.op().bias_dropout_add_fwd(
      out, z, moe_ ? Tensor() : mlp_->fc2_bias().value, h,
      hidden_dropout(ctx_, rng, c.hidden_dropout, layer_, DropoutSite::mlp_bda, x));
  saved.complete = true;
  return out;
}

Tensor TransformerLayer::backward(const Tensor& dout, Saved& saved, const AttentionInputs& in,
                                  const DropoutCtx& rng) {
  const TransformerConfig& c = *ctx_.config;
  // mlp_bda: dz = dropout'(dout), d(fc2 bias) += sum; the residual passes dout through. Without
  // dropout (p 0, as in Megatron's pretraining recipes) dz is dout itself: the op only sums the
  // bias gradient instead of also copying dout (the same values; nothing downstream writes dz).
  const ops::DropoutArgs mlp_drop =
      hidden_dropout(ctx_, rng, c.hidden_dropout, layer_, DropoutSite::mlp_bda, dout);
  Tensor dz = mlp_drop.p == 0.0f ? dout : ctx_.empty(dout.shape());
  Tensor no_bias;
  ctx_.op().bias_dropout_add_bwd(dz, moe_ ? no_bias : mlp_->fc2_bias().grad, dout, mlp_drop);
  Tensor dln2 = moe_ ? moe_->backward(dz, saved.moe) : mlp_->backward(dz, saved.ln2, saved.mlp);
  if (fuse_norm2_) dln2 = dln2.view(dout.shape());  // fc1's dx without its (unwritten) input
  // pre_mlp_layernorm's dx + the residual path's dout, in one pass.
  Tensor dh = dln2;
  if (norm2_)
    dh = norm2_->backward_add(dln2, dout, saved.h, saved.norm2);
  else
    ctx_.op().axpy(dh, dout, 1.0f);
  // self_attn_bda (dy is dh itself without dropout, as above)
  const ops::DropoutArgs attn_drop =
      hidden_dropout(ctx_, rng, c.hidden_dropout, layer_, DropoutSite::attention_bda, dout);
  Tensor dy = attn_drop.p == 0.0f ? dh : ctx_.empty(dh.shape());
  ctx_.op().bias_dropout_add_bwd(dy, attn_->proj_bias().grad, dh, attn_drop);
  const ops::DropoutArgs probs = attention_dropout(ctx_, rng, c.attention_dropout, layer_);
  Tensor dln1 = attn_->backward(dy, saved.ln1, saved.attn, in, probs);
  // input_layernorm's dx + the residual path's dh, in one pass.
  Tensor dx = dln1;
  if (norm1_)
    dx = norm1_->backward_add(dln1, dh, saved.x, saved.norm1);
  else
    ctx_.op().axpy(dx, dh, 1.0f);
  saved = Saved{};
  return dx;
}

}  // namespace mg::transformer
