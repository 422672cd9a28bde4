// Layer and block specs and architecture presets for the GPT family (megatron/core/models/gpt/
// gpt_layer_specs.py): the spec picks each slot's implementation (transformer_layer_spec.h); the
// presets set the architecture fields of a TransformerConfig (sizes are left to the caller).
//
//   family   norm       mlp                                 q/k norm  (config preset)
//   GPT-2  : LayerNorm  dense (GELU tanh, biases)            none      learned positions, tied
//   LLaMA  : RMSNorm    dense (SwiGLU, no biases)            none      RoPE, GQA, untied, no
//   dropout Qwen2  : RMSNorm    dense (SwiGLU)                       none      LLaMA + qkv bias,
//   base 1e6 Mixtral: RMSNorm    MoE in every layer (SwiGLU experts)  none      top-2 softmax, aux
//   loss DeepSeek-style MoE: RMSNorm, MoE where moe_layer_freq says, sigmoid top-k, shared experts
// The block spec holds one layer spec per layer: Megatron's get_gpt_decoder_block_spec makes a
// layer MoE exactly where config.is_moe_layer(l) (moe_layer_freq); GPTModel checks the spec
// against the config (check_block_spec).
#pragma once

#include "megatron/core/transformer/transformer_config.h"
#include "megatron/core/transformer/transformer_layer_spec.h"

namespace mg::models {

// One layer with Megatron's TE spec naming (norms fused into linear_qkv / linear_fc1), the
// default: parameter names are then those of torch_dist checkpoints (FORMATS.md §6.1). The norm
// kind follows config.normalization, q/k layernorm config.qk_layernorm; moe: the mlp slot is an
// MoE layer (Megatron: num_experts given).
transformer::TransformerLayerSpec get_gpt_layer_with_transformer_engine_spec(
    const transformer::TransformerConfig& config, bool moe = false);
// Megatron's local spec naming: separate input_layernorm / pre_mlp_layernorm modules.
transformer::TransformerLayerSpec get_gpt_layer_local_spec(
    const transformer::TransformerConfig& config, bool moe = false);
// Megatron's get_gpt_decoder_block_spec: the TE (or local) layer spec for every layer, MoE where
// config.is_moe_layer(l), dense elsewhere; the final norm of config.normalization.
transformer::TransformerBlockSpec get_gpt_decoder_block_spec(
    const transformer::TransformerConfig& config, bool use_transformer_engine = true);

// Architecture presets: set normalization, activation, biases, positions, tying and dropout as the
// named model family does; the shape fields of `config` are kept.
void apply_gpt2_architecture(transformer::TransformerConfig& config);
void apply_llama_architecture(transformer::TransformerConfig& config);
void apply_qwen2_architecture(transformer::TransformerConfig& config);
// Mixtral: num_experts experts (8) in every layer, top-2 softmax, aux_loss (coeff 1e-2).
void apply_mixtral_architecture(transformer::TransformerConfig& config, int64_t num_experts = 8);
// DeepSeek-style: sigmoid router scores with top-k (normalised over the k), seq_aux_loss,
// shared experts of shared_expert_size (0: none).
void apply_deepseek_moe_architecture(transformer::TransformerConfig& config, int64_t num_experts,
                                     int64_t topk, int64_t shared_expert_size);

// The block specs of the families (TE naming), each stating the family's choices of the table
// above (not read from the config); config gives num_layers and, for DeepSeek, the MoE layers.
// Pair each with its apply_*_architecture: GPTModel refuses a spec the config contradicts.
transformer::TransformerBlockSpec gpt2_block_spec(const transformer::TransformerConfig& config);
transformer::TransformerBlockSpec llama_block_spec(const transformer::TransformerConfig& config);
transformer::TransformerBlockSpec qwen2_block_spec(const transformer::TransformerConfig& config);
transformer::TransformerBlockSpec mixtral_block_spec(const transformer::TransformerConfig& config);
transformer::TransformerBlockSpec deepseek_moe_block_spec(
    const transformer::TransformerConfig& config);

}  // namespace mg::models
