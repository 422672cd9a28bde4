// One transformer layer built from its spec's slots (Megatron's TransformerLayer, pre-norm):
//
//   h   = x + dropout(linear_proj(attention(input_layernorm(x))) + proj_bias)     self_attn_bda
//   out = h + dropout(linear_fc2(act(linear_fc1(pre_mlp_layernorm(h)))) + fc2_bias)  mlp_bda
//
// self_attn_bda + pre_mlp_layernorm run fused (Norm::forward_bda), and backward adds each norm's
// dx to the residual gradient in the norm's own pass (Norm::backward_add); identity norms fall back
// to the separate ops. Tensors [S, B, H]. Dropout seeds come from (iteration, micro-batch, layer,
// site), so a recomputed forward replays the same masks. Tensor parallelism (ctx.tp_group):
// attention and MLP are TP regions (heads and F split across ranks); under sequence parallelism the
// layer's input, output, norms and bias-dropout-adds work on [S/TP, B, H] shards, hidden dropout
// drawing at the shard's offset so SP on/off drop the same elements; attention-probability dropout
// uses Megatron's model-parallel seed when TP > 1. Every slot is built as the layer's spec names it
// (transformer_layer_spec.h): the norms (layernorm, rmsnorm or none; separate or TE naming), the
// attention, and the mlp slot: the dense MLP or an moe::MoELayer (router, experts, shared experts;
// moe/moe_layer.h), whose mlp_bda then has no bias.
#pragma once

#include <memory>
#include <string>

#include "megatron/core/transformer/attention.h"
#include "megatron/core/transformer/mlp.h"
#include "megatron/core/transformer/module.h"
#include "megatron/core/transformer/moe/moe_layer.h"
#include "megatron/core/transformer/norm.h"
#include "megatron/core/transformer/transformer_layer_spec.h"

namespace mg::transformer {

class TransformerLayer {
 public:
  struct Saved {
    Tensor x;  // layer input [S, B, H]
    Tensor ln1;
    Norm::Saved norm1;
    SelfAttention::Saved attn;
    Tensor h;  // after the attention residual
    Tensor ln2;
    Norm::Saved norm2;
    MLP::Saved mlp;
    moe::MoELayer::Saved moe;
    bool complete = false;  // false: only x is held (recompute before backward)
  };

  // layer_number: 0-based index in the decoder; names "decoder.layers.<layer_number>.".
  TransformerLayer(const ModuleContext& ctx, ParamBuilder& pb, const TransformerLayerSpec& spec,
                   int64_t layer_number);

  // x [S, B, H] -> out [S, B, H]; fills `saved` (complete). keep_core_attention = false drops the
  // core attention output (selective recompute: recomputed in backward).
  Tensor forward(const Tensor& x, Saved& saved, const AttentionInputs& in, const DropoutCtx& rng,
                 bool keep_core_attention) const;
  // dout -> dx (written); needs a complete `saved` and clears it.
  Tensor backward(const Tensor& dout, Saved& saved, const AttentionInputs& in,
                  const DropoutCtx& rng);

  int64_t layer_number() const { return layer_; }

  // ---- inference with a KV cache (megatron/core/inference/; inference_forward.cpp) ----
  // x [Sq, B, H] -> out [Sq, B, H] for the next Sq tokens (SelfAttention::infer), no dropout.
  Tensor infer(const Tensor& x, inference::StaticInferenceContext& ic) const;

 private:
  const ModuleContext& ctx_;
  int64_t layer_;
  std::unique_ptr<Norm> norm1_, norm2_;  // null: identity
  std::unique_ptr<SelfAttention> attn_;
  std::unique_ptr<MLP> mlp_;            // dense layers
  std::unique_ptr<moe::MoELayer> moe_;  // MoE layers
  // Fp8Config::norm_cast_fusion where the linear after the norm takes it (docs/fp8.md "Fused
  // casts"): input_layernorm inside linear_qkv's FP8 cast, pre_mlp_layernorm (with the attention's
  // bias-dropout-add) inside linear_fc1's; ln1 / ln2 are then never written.
  bool fuse_norm1_ = false, fuse_norm2_ = false;
};

}  // namespace mg::transformer
