// Layer specs and architecture presets for the GPT family (megatron/core/models/gpt/
// gpt_layer_specs.py): the spec picks each slot's implementation; the presets set the
// architecture fields of a TransformerConfig (sizes are left to the caller).
//
//   GPT-2 : LayerNorm, GELU (tanh, gelu_new), learned absolute positions, biases, tied embeddings
//   LLaMA : RMSNorm, SwiGLU, RoPE, GQA (num_query_groups), no biases, untied, no dropout
//   Qwen2 : LLaMA + qkv bias (add_qkv_bias), rotary_base 1e6
//   Mixtral: LLaMA + an MoE MLP in every layer (SwiGLU experts, top-2 softmax router, aux loss)
//   DeepSeek-style MoE: LLaMA + MoE with sigmoid scores and top-k, shared experts
// The MoE layers (transformer/moe/moe_layer.h) fill the spec's mlp slot wherever
// config.is_moe_layer(l); the spec itself is the same.
#pragma once

#include "megatron/core/transformer/transformer_config.h"
#include "megatron/core/transformer/transformer_layer_spec.h"

namespace mg::models {

// Megatron's TE spec naming (norms fused into linear_qkv / linear_fc1), the default: parameter
// names are then those of torch_dist checkpoints (FORMATS.md §6.1).
transformer::TransformerLayerSpec get_gpt_layer_with_transformer_engine_spec(
    const transformer::TransformerConfig& config);
// Megatron's local spec naming: separate input_layernorm / pre_mlp_layernorm modules.
transformer::TransformerLayerSpec get_gpt_layer_local_spec(
    const transformer::TransformerConfig& config);

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

// The specs of the three families (all use the TE naming spec).
transformer::TransformerLayerSpec gpt2_layer_spec(const transformer::TransformerConfig& config);
transformer::TransformerLayerSpec llama_layer_spec(const transformer::TransformerConfig& config);
transformer::TransformerLayerSpec qwen2_layer_spec(const transformer::TransformerConfig& config);
transformer::TransformerLayerSpec mixtral_layer_spec(const transformer::TransformerConfig& config);
transformer::TransformerLayerSpec deepseek_moe_layer_spec(
    const transformer::TransformerConfig& config);

}  // namespace mg::models
