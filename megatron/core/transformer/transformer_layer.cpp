// TransformerLayer forward/backward (transformer_layer.h).
// Gradient rule: parameter gradients +=, activation gradients =.
#include "megatron/core/transformer/transformer_layer.h"

namespace mg::transformer {

namespace {

// The norm module of a slot, named as the spec says (TE-fused or separate), or null (identity).
std::unique_ptr<Norm> make_norm(const ModuleContext& ctx, ParamBuilder& pb, NormSlot slot,
                                const std::string& separate_prefix,
                                const std::string& fused_prefix) {
  switch (slot) {
    case NormSlot::identity:
      return nullptr;
    case NormSlot::norm:
      return std::make_unique<Norm>(ctx, pb, separate_prefix + "weight", separate_prefix + "bias",
                                    ctx.config->hidden_size);
    case NormSlot::fused_into_linear:
      return std::make_unique<Norm>(ctx, pb, fused_prefix + "layer_norm_weight",
                                    fused_prefix + "layer_norm_bias", ctx.config->hidden_size);
  }
  return nullptr;
}

}  // namespace

TransformerLayer::TransformerLayer(const ModuleContext& ctx, ParamBuilder& pb,
                                   const TransformerLayerSpec& spec, int64_t layer_number)
    : ctx_(ctx), layer_(layer_number) {
  const std::string p = "decoder.layers." + std::to_string(layer_number) + ".";
  norm1_ = make_norm(ctx, pb, spec.input_layernorm, p + "input_layernorm.",
                     p + "self_attention.linear_qkv.");
  attn_ = std::make_unique<SelfAttention>(ctx, pb, p + "self_attention.", spec.self_attention);
  norm2_ =
      make_norm(ctx, pb, spec.pre_mlp_layernorm, p + "pre_mlp_layernorm.", p + "mlp.linear_fc1.");
  mlp_ = std::make_unique<MLP>(ctx, pb, p + "mlp.", spec.mlp);
}

Tensor TransformerLayer::forward(const Tensor& x, Saved& saved, const AttentionInputs& in,
                                 const DropoutCtx& rng, bool keep_core_attention) const {
  const TransformerConfig& c = *ctx_.config;
  saved.x = x;
  saved.ln1 = norm1_ ? norm1_->forward(x, saved.norm1) : x;
  const ops::DropoutArgs probs =
      rng.args(c.attention_dropout, layer_, DropoutSite::attention_probs);
  Tensor y = attn_->forward(saved.ln1, saved.attn, in, probs, keep_core_attention);
  Tensor h = ctx_.empty(x.shape());
  ctx_.op().bias_dropout_add_fwd(h, y, attn_->proj_bias().value, x,
                                 rng.args(c.hidden_dropout, layer_, DropoutSite::attention_bda));
  saved.h = h;
  saved.ln2 = norm2_ ? norm2_->forward(h, saved.norm2) : h;
  Tensor z = mlp_->forward(saved.ln2, saved.mlp);
  Tensor out = ctx_.empty(x.shape());
  ctx_.op().bias_dropout_add_fwd(out, z, mlp_->fc2_bias().value, h,
                                 rng.args(c.hidden_dropout, layer_, DropoutSite::mlp_bda));
  saved.complete = true;
  return out;
}

Tensor TransformerLayer::backward(const Tensor& dout, Saved& saved, const AttentionInputs& in,
                                  const DropoutCtx& rng) {
  const TransformerConfig& c = *ctx_.config;
  // mlp_bda: dz = dropout'(dout), d(fc2 bias) += sum; the residual passes dout through.
  Tensor dz = ctx_.empty(dout.shape());
  ctx_.op().bias_dropout_add_bwd(dz, mlp_->fc2_bias().grad, dout,
                                 rng.args(c.hidden_dropout, layer_, DropoutSite::mlp_bda));
  Tensor dln2 = mlp_->backward(dz, saved.ln2, saved.mlp);
  Tensor dh = norm2_ ? norm2_->backward(dln2, saved.h, saved.norm2) : dln2;
  ctx_.op().axpy(dh, dout, 1.0f);
  // self_attn_bda
  Tensor dy = ctx_.empty(dh.shape());
  ctx_.op().bias_dropout_add_bwd(dy, attn_->proj_bias().grad, dh,
                                 rng.args(c.hidden_dropout, layer_, DropoutSite::attention_bda));
  const ops::DropoutArgs probs =
      rng.args(c.attention_dropout, layer_, DropoutSite::attention_probs);
  Tensor dln1 = attn_->backward(dy, saved.ln1, saved.attn, in, probs);
  Tensor dx = norm1_ ? norm1_->backward(dln1, saved.x, saved.norm1) : dln1;
  ctx_.op().axpy(dx, dh, 1.0f);
  saved = Saved{};
  return dx;
}

}  // namespace mg::transformer
