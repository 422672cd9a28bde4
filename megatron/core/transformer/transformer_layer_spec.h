// The layer spec: which implementation fills each slot of a transformer layer, chosen once when the
// model is built (Megatron-Core's ModuleSpec / TransformerLayerSubmodules, without Python classes).
//
//   x -> input_layernorm -> self_attention (linear_qkv -> [q/k layernorm] -> [rope] ->
//        core_attention -> linear_proj) -> self_attn_bda (bias-dropout-add, residual x)
//     -> pre_mlp_layernorm -> mlp (linear_fc1 -> activation -> linear_fc2) -> mlp_bda
//
// Numbers (sizes, eps, dropout p, whether a bias exists) come from the TransformerConfig; the spec
// only picks implementations and the naming scheme. Modules resolve their op-table entries from the
// spec at construction; forward never branches on the platform.
#pragma once

#include <cstdint>

#include "megatron/core/transformer/transformer_config.h"

namespace mg::transformer {

// A norm slot. identity: no norm (and no parameter). The layernorm/rmsnorm choice follows
// config.normalization; `fused` is Megatron's TE naming, where the norm weight belongs to the next
// linear (self_attention.linear_qkv.layer_norm_weight, mlp.linear_fc1.layer_norm_weight) instead of
// a separate module (input_layernorm.weight, pre_mlp_layernorm.weight). Same math either way.
enum class NormSlot : uint8_t { identity, norm, fused_into_linear };

// The core attention slot: dot-product attention through the attention_fwd/bwd ops (flash-style:
// saves out and lse, not the probabilities).
enum class CoreAttentionSlot : uint8_t { dot_product };

// Linear slots: plain local (single-rank) linear layers; the tensor-parallel issue adds
// column/row-parallel implementations here.
enum class LinearSlot : uint8_t { local };

// bias-dropout-add: the fused op (bias_dropout_add_fwd/bwd).
enum class BdaSlot : uint8_t { fused };

struct SelfAttentionSpec {
  LinearSlot linear_qkv = LinearSlot::local;
  CoreAttentionSlot core_attention = CoreAttentionSlot::dot_product;
  LinearSlot linear_proj = LinearSlot::local;
  NormSlot q_layernorm = NormSlot::identity;  // norm when config.qk_layernorm
  NormSlot k_layernorm = NormSlot::identity;
};

struct MlpSpec {
  LinearSlot linear_fc1 = LinearSlot::local;
  LinearSlot linear_fc2 = LinearSlot::local;
};

struct TransformerLayerSpec {
  NormSlot input_layernorm = NormSlot::fused_into_linear;
  SelfAttentionSpec self_attention;
  BdaSlot self_attn_bda = BdaSlot::fused;
  NormSlot pre_mlp_layernorm = NormSlot::fused_into_linear;
  MlpSpec mlp;
  BdaSlot mlp_bda = BdaSlot::fused;
  // decoder.final_layernorm: norm (always separate in Megatron), or identity (post-LN models).
  NormSlot final_layernorm = NormSlot::norm;
};

}  // namespace mg::transformer
