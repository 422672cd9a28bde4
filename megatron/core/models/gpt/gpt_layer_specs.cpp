// GPT-family layer and block specs and architecture presets (gpt_layer_specs.h).
#include "megatron/core/models/gpt/gpt_layer_specs.h"

namespace mg::models {

using transformer::MlpImpl;
using transformer::NormImpl;
using transformer::NormNaming;
using transformer::NormSpec;
using transformer::TransformerBlockSpec;
using transformer::TransformerConfig;
using transformer::TransformerLayerSpec;

namespace {

// A layer spec of the GPT family: `norm` in every norm slot (q/k too when qk_norm), TE or local
// naming, dense or MoE mlp; column/row-parallel linears and the op-table core attention.
TransformerLayerSpec layer_spec(NormImpl norm, bool te_naming, bool qk_norm, bool moe) {
  const NormNaming naming = te_naming ? NormNaming::fused_into_linear : NormNaming::separate;
  TransformerLayerSpec spec;
  spec.input_layernorm = {norm, naming};
  spec.pre_mlp_layernorm = {norm, naming};
  const NormSpec qk = qk_norm ? NormSpec{norm, NormNaming::separate} : NormSpec{};
  spec.self_attention.q_layernorm = qk;
  spec.self_attention.k_layernorm = qk;
  spec.mlp.impl = moe ? MlpImpl::moe : MlpImpl::dense;
  return spec;
}

// One layer spec per layer, MoE where is_moe(l); the final norm of kind `norm`.
template <typename IsMoe>
TransformerBlockSpec block_spec(const TransformerConfig& c, NormImpl norm, bool te_naming,
                                bool qk_norm, IsMoe is_moe) {
  TransformerBlockSpec block;
  for (int64_t l = 0; l < c.num_layers; ++l)
    block.layer_specs.push_back(layer_spec(norm, te_naming, qk_norm, is_moe(l)));
  block.final_layernorm = {norm, NormNaming::separate};
  return block;
}

}  // namespace

TransformerLayerSpec get_gpt_layer_with_transformer_engine_spec(const TransformerConfig& config,
                                                                bool moe) {
  return layer_spec(transformer::norm_impl(config.normalization), true, config.qk_layernorm, moe);
}

TransformerLayerSpec get_gpt_layer_local_spec(const TransformerConfig& config, bool moe) {
  return layer_spec(transformer::norm_impl(config.normalization), false, config.qk_layernorm, moe);
}

TransformerBlockSpec get_gpt_decoder_block_spec(const TransformerConfig& config,
                                                bool use_transformer_engine) {
  return block_spec(config, transformer::norm_impl(config.normalization), use_transformer_engine,
                    config.qk_layernorm, [&](int64_t l) { return config.is_moe_layer(l); });
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

TransformerBlockSpec gpt2_block_spec(const TransformerConfig& config) {
  return block_spec(config, NormImpl::layernorm, true, false, [](int64_t) { return false; });
}

TransformerBlockSpec llama_block_spec(const TransformerConfig& config) {
  return block_spec(config, NormImpl::rmsnorm, true, false, [](int64_t) { return false; });
}

TransformerBlockSpec qwen2_block_spec(const TransformerConfig& config) {
  return block_spec(config, NormImpl::rmsnorm, true, false, [](int64_t) { return false; });
}

TransformerBlockSpec mixtral_block_spec(const TransformerConfig& config) {
  return block_spec(config, NormImpl::rmsnorm, true, false, [](int64_t) { return true; });
}

TransformerBlockSpec deepseek_moe_block_spec(const TransformerConfig& config) {
  return block_spec(config, NormImpl::rmsnorm, true, false,
                    [&](int64_t l) { return config.is_moe_layer(l); });
}

}  // namespace mg::models
