// GPT-family layer specs and architecture presets (gpt_layer_specs.h).
#include "megatron/core/models/gpt/gpt_layer_specs.h"

namespace mg::models {

using transformer::NormSlot;
using transformer::TransformerConfig;
using transformer::TransformerLayerSpec;

TransformerLayerSpec get_gpt_layer_with_transformer_engine_spec(const TransformerConfig& config) {
  TransformerLayerSpec spec;
  spec.input_layernorm = NormSlot::fused_into_linear;
  spec.pre_mlp_layernorm = NormSlot::fused_into_linear;
  spec.self_attention.q_layernorm = config.qk_layernorm ? NormSlot::norm : NormSlot::identity;
  spec.self_attention.k_layernorm = spec.self_attention.q_layernorm;
  spec.final_layernorm = NormSlot::norm;
  return spec;
}

TransformerLayerSpec get_gpt_layer_local_spec(const TransformerConfig& config) {
  TransformerLayerSpec spec = get_gpt_layer_with_transformer_engine_spec(config);
  spec.input_layernorm = NormSlot::norm;
  spec.pre_mlp_layernorm = NormSlot::norm;
  return spec;
}

void apply_gpt2_architecture(TransformerConfig& c) {
  c.normalization = transformer::Normalization::layernorm;
  c.activation = transformer::Activation::gelu;
  c.bias_activation_fusion = true;  // gelu_new: the tanh approximation
  c.add_bias_linear = true;
  c.add_qkv_bias = false;
  c.qk_layernorm = false;
  c.position_embedding_type = transformer::PositionEmbeddingType::learned_absolute;
  c.untie_embeddings_and_output_weights = false;
}

void apply_llama_architecture(TransformerConfig& c) {
  c.normalization = transformer::Normalization::rmsnorm;
  c.activation = transformer::Activation::swiglu;
  c.bias_activation_fusion = false;
  c.add_bias_linear = false;
  c.add_qkv_bias = false;
  c.qk_layernorm = false;
  c.position_embedding_type = transformer::PositionEmbeddingType::rope;
  c.untie_embeddings_and_output_weights = true;
  c.hidden_dropout = 0.0;
  c.attention_dropout = 0.0;
}

void apply_qwen2_architecture(TransformerConfig& c) {
  apply_llama_architecture(c);
  c.add_qkv_bias = true;
  c.rotary_base = 1000000.0;
}

void apply_mixtral_architecture(TransformerConfig& c, int64_t num_experts) {
  apply_llama_architecture(c);
  c.num_moe_experts = num_experts;
  c.moe_router_topk = 2;
  c.moe_router_score_function = transformer::MoeScoreFunction::softmax;
  c.moe_router_pre_softmax = false;
  c.moe_router_load_balancing_type = transformer::MoeLoadBalancingType::aux_loss;
  c.moe_aux_loss_coeff = 1e-2;
  c.moe_layer_freq = 1;
  c.moe_layer_pattern.clear();
  c.moe_shared_expert_intermediate_size = 0;
}

void apply_deepseek_moe_architecture(TransformerConfig& c, int64_t num_experts, int64_t topk,
                                     int64_t shared_expert_size) {
  apply_llama_architecture(c);
  c.num_moe_experts = num_experts;
  c.moe_router_topk = topk;
  c.moe_router_score_function = transformer::MoeScoreFunction::sigmoid;
  c.moe_router_load_balancing_type = transformer::MoeLoadBalancingType::seq_aux_loss;
  c.moe_aux_loss_coeff = 1e-4;
  c.moe_shared_expert_intermediate_size = shared_expert_size;
}

TransformerLayerSpec gpt2_layer_spec(const TransformerConfig& config) {
  return get_gpt_layer_with_transformer_engine_spec(config);
}

TransformerLayerSpec llama_layer_spec(const TransformerConfig& config) {
  return get_gpt_layer_with_transformer_engine_spec(config);
}

TransformerLayerSpec qwen2_layer_spec(const TransformerConfig& config) {
  return get_gpt_layer_with_transformer_engine_spec(config);
}

TransformerLayerSpec mixtral_layer_spec(const TransformerConfig& config) {
  return get_gpt_layer_with_transformer_engine_spec(config);
}

TransformerLayerSpec deepseek_moe_layer_spec(const TransformerConfig& config) {
  return get_gpt_layer_with_transformer_engine_spec(config);
}

}  // namespace mg::models
