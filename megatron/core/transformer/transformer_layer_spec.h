// The layer spec: which implementation fills each slot of a transformer layer, chosen once when the
// model is built (Megatron-Core's ModuleSpec / TransformerLayerSubmodules /
// TransformerBlockSubmodules, without Python classes). Modules build what their spec names and
// refuse a value they do not implement (an error naming the slot), so a spec entry is never
// decoration; a new variant is a new enum value and the module that builds it.
//
//   x -> input_layernorm -> self_attention (linear_qkv -> [q/k layernorm] -> [rope] ->
//        core_attention -> linear_proj) -> self_attn_bda (bias-dropout-add, residual x)
//     -> pre_mlp_layernorm -> mlp (dense: linear_fc1 -> activation -> linear_fc2; or MoE: router,
//        experts, shared experts) -> mlp_bda
//
// A block spec holds one layer spec per decoder layer (Megatron's get_gpt_decoder_block_spec: MoE
// or dense per layer) and the final norm. Numbers (sizes, eps, dropout p, whether a bias exists)
// come from the TransformerConfig; the spec picks implementations and the naming scheme.
// check_block_spec refuses a spec that contradicts the config where other code reads the config
// (the norm kind, qk_layernorm, which layers are MoE: checkpoint conversion, FLOPs, MoE logging).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/transformer/transformer_config.h"

namespace mg::transformer {

// The norm module of a slot: none (no parameter), LayerNorm (weight + bias) or RMSNorm (weight).
enum class NormImpl : uint8_t { identity, layernorm, rmsnorm };
// Where a layer norm's parameters are named: its own module (input_layernorm.weight,
// pre_mlp_layernorm.weight), or Megatron's TE naming, where the norm belongs to the next linear
// (self_attention.linear_qkv.layer_norm_weight, mlp.linear_fc1.layer_norm_weight). Same math.
enum class NormNaming : uint8_t { separate, fused_into_linear };
struct NormSpec {
  NormImpl impl = NormImpl::identity;
  NormNaming naming = NormNaming::separate;
  bool operator==(const NormSpec&) const = default;
};
// The norm implementation of config.normalization.
NormImpl norm_impl(Normalization n);

// Linear slots: Megatron's ColumnParallelLinear / RowParallelLinear (tensor_parallel/layers.h;
// plain linears on one rank). linear_qkv and linear_fc1 are column-parallel, linear_proj and
// linear_fc2 row-parallel: the modules refuse any other choice.
enum class LinearImpl : uint8_t { column_parallel, row_parallel };

// The core attention slot: dot-product attention through the attention_fwd/bwd ops (flash-style:
// saves out and lse, not the probabilities), across the CP group when context parallelism is on.
enum class CoreAttentionImpl : uint8_t { dot_product };

// bias-dropout-add: the fused op (bias_dropout_add_fwd/bwd).
enum class BdaImpl : uint8_t { fused };

struct SelfAttentionSubmodules {
  LinearImpl linear_qkv = LinearImpl::column_parallel;
  CoreAttentionImpl core_attention = CoreAttentionImpl::dot_product;
  LinearImpl linear_proj = LinearImpl::row_parallel;
  NormSpec q_layernorm;  // identity, or a norm over each head (config.qk_layernorm)
  NormSpec k_layernorm;
};

struct MlpSubmodules {
  LinearImpl linear_fc1 = LinearImpl::column_parallel;
  LinearImpl linear_fc2 = LinearImpl::row_parallel;
};

// The mlp slot: the dense MLP (mlp.h), or Megatron's MoELayer (moe/moe_layer.h: router, experts,
// and shared experts built from `submodules` when config.moe_shared_expert_intermediate_size > 0).
enum class MlpImpl : uint8_t { dense, moe };
struct MlpSpec {
  MlpImpl impl = MlpImpl::dense;
  MlpSubmodules submodules;  // dense: its linears; moe: the shared experts' linears
};

struct TransformerLayerSpec {
  NormSpec input_layernorm;
  SelfAttentionSubmodules self_attention;
  BdaImpl self_attn_bda = BdaImpl::fused;
  NormSpec pre_mlp_layernorm;
  MlpSpec mlp;
  BdaImpl mlp_bda = BdaImpl::fused;
};

struct TransformerBlockSpec {
  std::vector<TransformerLayerSpec> layer_specs;  // one per decoder layer (global number)
  NormSpec final_layernorm;  // decoder.final_layernorm (always its own module), or identity
  const TransformerLayerSpec& layer(int64_t layer_number) const;
};

// Refuses a block spec the config contradicts: one layer spec per config.num_layers, the norms'
// kind (config.normalization), q/k layernorm iff config.qk_layernorm, MoE exactly on the layers
// config.is_moe_layer names. The error names the layer, the slot and both values.
void check_block_spec(const TransformerBlockSpec& spec, const TransformerConfig& config);

std::string norm_impl_name(NormImpl n);

}  // namespace mg::transformer
