// TransformerConfig defaults, validation and the padded vocabulary (see transformer_config.h).
#include "megatron/core/transformer/transformer_config.h"

#include <cmath>
#include <sstream>

#include "megatron/core/common/error.h"
#include "megatron/core/ops/rope_scaling.h"

namespace mg::transformer {

std::string to_string(Normalization v) {
  return v == Normalization::layernorm ? "LayerNorm" : "RMSNorm";
}

std::string to_string(Activation v) {
  switch (v) {
    case Activation::gelu:
      return "gelu";
    case Activation::swiglu:
      return "swiglu";
    case Activation::squared_relu:
      return "squared_relu";
  }
  return "?";
}

std::string to_string(PositionEmbeddingType v) {
  switch (v) {
    case PositionEmbeddingType::learned_absolute:
      return "learned_absolute";
    case PositionEmbeddingType::rope:
      return "rope";
    case PositionEmbeddingType::none:
      return "none";
  }
  return "?";
}

std::string to_string(RecomputeGranularity v) {
  switch (v) {
    case RecomputeGranularity::none:
      return "none";
    case RecomputeGranularity::full:
      return "full";
    case RecomputeGranularity::selective:
      return "selective";
  }
  return "?";
}

std::string to_string(RecomputeMethod v) {
  switch (v) {
    case RecomputeMethod::none:
      return "none";
    case RecomputeMethod::uniform:
      return "uniform";
    case RecomputeMethod::block:
      return "block";
  }
  return "?";
}

std::string to_string(MoeLoadBalancingType v) {
  switch (v) {
    case MoeLoadBalancingType::aux_loss:
      return "aux_loss";
    case MoeLoadBalancingType::seq_aux_loss:
      return "seq_aux_loss";
    case MoeLoadBalancingType::none:
      return "none";
  }
  return "?";
}

std::string to_string(MoeScoreFunction v) {
  return v == MoeScoreFunction::softmax ? "softmax" : "sigmoid";
}

std::string to_string(MoeTokenDropPolicy v) {
  return v == MoeTokenDropPolicy::probs ? "probs" : "position";
}

std::string to_string(MoeTokenDispatcherType v) {
  return v == MoeTokenDispatcherType::allgather ? "allgather" : "alltoall";
}

void TransformerConfig::finalize() {
  // The sizes the defaults below derive from, checked first (a negative --hidden-size is refused
  // as such, not as a divisibility problem).
  MG_CHECK(hidden_size >= 1, "hidden_size (--hidden-size) must be >= 1, got " << hidden_size);
  MG_CHECK(num_attention_heads >= 1,
           "num_attention_heads (--num-attention-heads) must be >= 1, got " << num_attention_heads);
  MG_CHECK(ffn_hidden_size >= 0,
           "ffn_hidden_size (--ffn-hidden-size) must be >= 1 (or unset), got " << ffn_hidden_size);
  MG_CHECK(kv_channels >= 0,
           "kv_channels (--kv-channels) must be >= 1 (or unset), got " << kv_channels);
  MG_CHECK(num_query_groups >= 0,
           "num_query_groups (--num-query-groups) must be >= 1 (or unset), "
           "got "
               << num_query_groups);
  if (ffn_hidden_size == 0) ffn_hidden_size = 4 * hidden_size;
  if (num_query_groups == 0) num_query_groups = num_attention_heads;
  if (kv_channels == 0 && num_attention_heads > 0) {
    MG_CHECK(hidden_size % num_attention_heads == 0,
             "hidden_size " << hidden_size << " is not divisible by num_attention_heads "
                            << num_attention_heads << " (set kv_channels explicitly)");
    kv_channels = hidden_size / num_attention_heads;
  }
  if (max_position_embeddings == 0) max_position_embeddings = seq_length;
  validate();
}

void TransformerConfig::validate() const {
  MG_CHECK(num_layers >= 1, "num_layers must be >= 1, got " << num_layers);
  fp8.validate(num_layers);
  MG_CHECK(!fp8.enabled() || recompute_granularity != RecomputeGranularity::full,
           "--fp8-format with --recompute-granularity full: not built yet (the recomputed "
           "forward would record its amaxes twice); use selective recompute or none");
  MG_CHECK(hidden_size >= 1, "hidden_size must be >= 1, got " << hidden_size);
  MG_CHECK(num_attention_heads >= 1,
           "num_attention_heads must be >= 1, got " << num_attention_heads);
  MG_CHECK(ffn_hidden_size >= 1,
           "ffn_hidden_size must be >= 1 (0 before finalize() means 4*hidden_size), got "
               << ffn_hidden_size);
  MG_CHECK(kv_channels >= 1, "kv_channels must be >= 1, got "
                                 << kv_channels << " (hidden_size " << hidden_size
                                 << " / num_attention_heads " << num_attention_heads << ")");
  MG_CHECK(num_query_groups >= 1 && num_query_groups <= num_attention_heads &&
               num_attention_heads % num_query_groups == 0,
           "num_attention_heads " << num_attention_heads
                                  << " must be a multiple of num_query_groups " << num_query_groups
                                  << " (GQA: each KV group serves NH/NG query heads)");
  MG_CHECK(seq_length >= 1, "seq_length must be >= 1, got " << seq_length);
  MG_CHECK(make_vocab_size_divisible_by >= 1,
           "make_vocab_size_divisible_by must be >= 1, got " << make_vocab_size_divisible_by);
  MG_CHECK(norm_epsilon >= 0.0 && std::isfinite(norm_epsilon),
           "norm_epsilon must be finite and >= 0, got " << norm_epsilon);
  MG_CHECK(hidden_dropout >= 0.0 && hidden_dropout < 1.0,
           "hidden_dropout must be in [0, 1), got " << hidden_dropout);
  MG_CHECK(attention_dropout >= 0.0 && attention_dropout < 1.0,
           "attention_dropout must be in [0, 1), got " << attention_dropout);
  MG_CHECK(init_method_std >= 0.0 && std::isfinite(init_method_std),
           "init_method_std must be finite and >= 0, got " << init_method_std);
  MG_CHECK(params_dtype == DType::f32 || params_dtype == DType::bf16 ||
               params_dtype == DType::f16 || params_dtype == DType::f64,
           "params_dtype must be f32, bf16, f16 or f64, got " << dtype_name(params_dtype));
  if (position_embedding_type == PositionEmbeddingType::learned_absolute) {
    MG_CHECK(max_position_embeddings >= seq_length,
             "learned_absolute position embeddings: max_position_embeddings "
                 << max_position_embeddings << " is smaller than seq_length " << seq_length);
  }
  if (position_embedding_type == PositionEmbeddingType::rope) {
    MG_CHECK(rotary_percent > 0.0 && rotary_percent <= 1.0,
             "rotary_percent must be in (0, 1], got " << rotary_percent);
    MG_CHECK(rotary_base > 0.0, "rotary_base must be > 0, got " << rotary_base);
    const auto rot = static_cast<int64_t>(static_cast<double>(kv_channels) * rotary_percent);
    MG_CHECK(rot > 0 && rot % 2 == 0, "rope: kv_channels * rotary_percent = "
                                          << kv_channels << " * " << rotary_percent << " = " << rot
                                          << " rotary dims; must be even and > 0");
    ops::validate_rope_scaling(rope_scaling, "TransformerConfig");
  } else {
    MG_CHECK(rope_scaling.type == ops::RopeScalingType::none,
             ops::to_string(rope_scaling.type) << " RoPE scaling needs rotary position embeddings");
  }
  // Mixture of Experts, as Megatron's __post_init__ / validate_args check it.
  MG_CHECK(num_moe_experts >= 0,
           "num_moe_experts (--num-experts) must be >= 0, got " << num_moe_experts);
  MG_CHECK(num_moe_experts > 0 || !moe_shared_expert_gate,
           "--moe-shared-expert-gate needs --num-experts");
  if (num_moe_experts > 0) {
    MG_CHECK(moe_router_topk >= 1 && moe_router_topk <= num_moe_experts,
             "--moe-router-topk " << moe_router_topk << " must be in [1, --num-experts "
                                  << num_moe_experts << "]");
    MG_CHECK(
        moe_ffn_hidden_size >= 0,
        "--moe-ffn-hidden-size must be >= 1 (0: ffn_hidden_size), got " << moe_ffn_hidden_size);
    MG_CHECK(moe_shared_expert_intermediate_size >= 0,
             "--moe-shared-expert-intermediate-size must be >= 0, got "
                 << moe_shared_expert_intermediate_size);
    MG_CHECK(!moe_shared_expert_gate || moe_shared_expert_intermediate_size > 0,
             "--moe-shared-expert-gate needs --moe-shared-expert-intermediate-size");
    MG_CHECK(moe_aux_loss_coeff >= 0.0 && std::isfinite(moe_aux_loss_coeff),
             "--moe-aux-loss-coeff must be finite and >= 0, got " << moe_aux_loss_coeff);
    MG_CHECK(moe_z_loss_coeff >= 0.0 && std::isfinite(moe_z_loss_coeff),
             "--moe-z-loss-coeff must be finite and >= 0, got " << moe_z_loss_coeff);
    if (moe_expert_capacity_factor) {
      MG_CHECK(*moe_expert_capacity_factor > 0.0,
               "--moe-expert-capacity-factor must be > 0, got " << *moe_expert_capacity_factor);
      MG_CHECK(moe_token_dispatcher_type == MoeTokenDispatcherType::alltoall,
               "--moe-expert-capacity-factor works with --moe-token-dispatcher-type alltoall only "
               "(Megatron's rule), got "
                   << to_string(moe_token_dispatcher_type));
    }
    if (moe_router_group_topk > 0 || moe_router_num_groups > 0) {
      MG_CHECK(moe_router_num_groups > 0 && moe_router_group_topk > 0,
               "group-limited routing needs both --moe-router-num-groups and "
               "--moe-router-group-topk, got "
                   << moe_router_num_groups << " and " << moe_router_group_topk);
      MG_CHECK(num_moe_experts % moe_router_num_groups == 0,
               "--num-experts " << num_moe_experts
                                << " must be divisible by --moe-router-num-groups "
                                << moe_router_num_groups);
      MG_CHECK(moe_router_group_topk <= moe_router_num_groups,
               "--moe-router-group-topk " << moe_router_group_topk
                                          << " must be <= --moe-router-num-groups "
                                          << moe_router_num_groups);
      MG_CHECK(moe_router_topk % moe_router_group_topk == 0 &&
                   moe_router_topk / moe_router_group_topk <=
                       num_moe_experts / moe_router_num_groups,
               "--moe-router-topk "
                   << moe_router_topk << " must be a multiple of --moe-router-group-topk "
                   << moe_router_group_topk << " with at most "
                   << num_moe_experts / moe_router_num_groups << " (experts per group) per group");
    }
    if (moe_router_topk_scaling_factor)
      MG_CHECK(
          *moe_router_topk_scaling_factor > 0.0 && std::isfinite(*moe_router_topk_scaling_factor),
          "--moe-router-topk-scaling-factor must be finite and > 0, got "
              << *moe_router_topk_scaling_factor);
    MG_CHECK(
        !moe_router_enable_expert_bias || moe_router_score_function == MoeScoreFunction::sigmoid,
        "--moe-router-enable-expert-bias (aux-loss-free routing) needs "
        "--moe-router-score-function sigmoid (Megatron's rule), got "
            << to_string(moe_router_score_function));
    MG_CHECK(moe_router_dtype.empty() || moe_router_dtype == "fp32" ||
                 (moe_router_dtype == "fp64" && params_dtype == DType::f64),
             "--moe-router-dtype " << moe_router_dtype
                                   << ": the router logits are computed in fp32 here (fp64 for an "
                                      "fp64 model); valid: fp32, or fp64 with an fp64 model");
    MG_CHECK(moe_router_bias_update_rate >= 0.0 && std::isfinite(moe_router_bias_update_rate),
             "--moe-router-bias-update-rate must be finite and >= 0, got "
                 << moe_router_bias_update_rate);
    MG_CHECK(!add_bias_linear || !moe_grouped_gemm,
             "--moe-grouped-gemm: bias in the expert layer is not supported by the grouped GEMM "
             "(Megatron's rule); pass --disable-bias-linear, or drop --moe-grouped-gemm to run the "
             "sequential experts with biases");
    MG_CHECK(!add_bias_linear || moe_shared_expert_intermediate_size == 0,
             "--moe-shared-expert-intermediate-size "
                 << moe_shared_expert_intermediate_size
                 << ": bias is not supported in the shared experts (Megatron's rule); pass "
                    "--disable-bias-linear");
    MG_CHECK(moe_layer_freq >= 1, "--moe-layer-freq must be >= 1, got " << moe_layer_freq);
    if (!moe_layer_pattern.empty()) {
      MG_CHECK(static_cast<int64_t>(moe_layer_pattern.size()) == num_layers,
               "--moe-layer-freq pattern has " << moe_layer_pattern.size()
                                               << " entries; it needs one per layer (num_layers "
                                               << num_layers << ")");
      for (int v : moe_layer_pattern)
        MG_CHECK(v == 0 || v == 1, "--moe-layer-freq pattern entries must be 0 or 1, got " << v);
    }
  }

  // Recomputation, as Megatron's __post_init__ checks it.
  switch (recompute_granularity) {
    case RecomputeGranularity::none:
      MG_CHECK(recompute_method == RecomputeMethod::none,
               "recompute_method " << to_string(recompute_method)
                                   << " is set but recompute_granularity is none");
      MG_CHECK(recompute_num_layers == 0, "recompute_num_layers "
                                              << recompute_num_layers
                                              << " is set but recompute_granularity is none");
      break;
    case RecomputeGranularity::selective:
      MG_CHECK(recompute_method == RecomputeMethod::none,
               "recompute_granularity selective recomputes core attention only; recompute_method "
                   << to_string(recompute_method) << " applies to full recompute");
      MG_CHECK(recompute_num_layers == 0,
               "recompute_granularity selective does not take recompute_num_layers (got "
                   << recompute_num_layers << ")");
      break;
    case RecomputeGranularity::full:
      MG_CHECK(recompute_method != RecomputeMethod::none,
               "recompute_granularity full needs recompute_method uniform or block");
      MG_CHECK(recompute_num_layers >= 1 && recompute_num_layers <= num_layers,
               "recompute_granularity full needs recompute_num_layers in [1, num_layers = "
                   << num_layers << "], got " << recompute_num_layers);
      break;
  }
}

int64_t TransformerConfig::padded_vocab_size(int64_t vocab_size,
                                             int64_t tensor_model_parallel_size) const {
  MG_CHECK(vocab_size >= 1, "vocab size must be >= 1, got " << vocab_size);
  MG_CHECK(tensor_model_parallel_size >= 1,
           "tensor_model_parallel_size must be >= 1, got " << tensor_model_parallel_size);
  MG_CHECK(make_vocab_size_divisible_by >= 1,
           "make_vocab_size_divisible_by must be >= 1, got " << make_vocab_size_divisible_by);
  const int64_t multiple = make_vocab_size_divisible_by * tensor_model_parallel_size;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

bool TransformerConfig::layer_recomputed(int64_t layer) const {
  if (recompute_granularity != RecomputeGranularity::full) return false;
  if (recompute_method == RecomputeMethod::uniform) return true;
  return layer < recompute_num_layers;  // block: the first N layers
}

bool TransformerConfig::is_moe_layer(int64_t layer) const {
  if (num_moe_experts <= 0) return false;
  if (!moe_layer_pattern.empty())
    return layer >= 0 && layer < static_cast<int64_t>(moe_layer_pattern.size()) &&
           moe_layer_pattern[static_cast<std::size_t>(layer)] == 1;
  return layer % moe_layer_freq == 0;
}

std::string TransformerConfig::str() const {
  std::ostringstream os;
  os << "num_layers " << num_layers << "\nhidden_size " << hidden_size << "\nffn_hidden_size "
     << ffn_hidden_size << "\nnum_attention_heads " << num_attention_heads << "\nnum_query_groups "
     << num_query_groups << "\nkv_channels " << kv_channels << "\nseq_length " << seq_length
     << "\nmax_position_embeddings " << max_position_embeddings << "\nmake_vocab_size_divisible_by "
     << make_vocab_size_divisible_by << "\nnormalization " << to_string(normalization)
     << "\nnorm_epsilon " << norm_epsilon << "\napply_layernorm_1p " << apply_layernorm_1p
     << "\nactivation " << to_string(activation)
     << (activation == Activation::gelu ? (bias_activation_fusion ? " (tanh)" : " (erf)") : "")
     << "\nadd_bias_linear " << add_bias_linear << "\nadd_qkv_bias " << add_qkv_bias
     << "\nqk_layernorm " << qk_layernorm << "\nposition_embedding_type "
     << to_string(position_embedding_type) << "\nrotary_base " << rotary_base << "\nrotary_percent "
     << rotary_percent << "\nuntie_embeddings_and_output_weights "
     << untie_embeddings_and_output_weights << "\nhidden_dropout " << hidden_dropout
     << "\nattention_dropout " << attention_dropout << "\ninit_method_std " << init_method_std
     << "\nparams_dtype " << dtype_name(params_dtype) << "\nrecompute_granularity "
     << to_string(recompute_granularity) << "\nrecompute_method " << to_string(recompute_method)
     << "\nrecompute_num_layers " << recompute_num_layers << "\ncalculate_per_token_loss "
     << calculate_per_token_loss;
  if (rope_scaling.type != ops::RopeScalingType::none) {
    const ops::RopeScaling& r = rope_scaling;
    os << "\nrope_scaling " << ops::to_string(r.type) << "\nrope_scaling_factor " << r.factor;
    if (r.type == ops::RopeScalingType::llama3)
      os << "\nrope_scaling_low_freq_factor " << r.low_freq_factor
         << "\nrope_scaling_high_freq_factor " << r.high_freq_factor;
    if (r.type != ops::RopeScalingType::linear)
      os << "\nrope_scaling_original_max_position_embeddings "
         << r.original_max_position_embeddings;
    if (r.type == ops::RopeScalingType::yarn)
      os << "\nyarn_beta_fast " << r.beta_fast << "\nyarn_beta_slow " << r.beta_slow
         << "\nyarn_mscale " << r.mscale << "\nyarn_mscale_all_dim " << r.mscale_all_dim
         << "\nyarn_correction_range_round_to_int " << r.correction_range_round_to_int;
  }
  if (num_moe_experts > 0) {
    os << "\nnum_moe_experts " << num_moe_experts << "\nmoe_ffn_hidden_size "
       << expert_ffn_hidden_size() << "\nmoe_router_topk " << moe_router_topk
       << "\nmoe_router_load_balancing_type " << to_string(moe_router_load_balancing_type)
       << "\nmoe_aux_loss_coeff " << moe_aux_loss_coeff << "\nmoe_z_loss_coeff " << moe_z_loss_coeff
       << "\nmoe_router_score_function " << to_string(moe_router_score_function)
       << "\nmoe_router_pre_softmax " << moe_router_pre_softmax << "\nmoe_expert_capacity_factor "
       << (moe_expert_capacity_factor ? std::to_string(*moe_expert_capacity_factor) : "None")
       << "\nmoe_token_drop_policy " << to_string(moe_token_drop_policy)
       << "\nmoe_token_dispatcher_type " << to_string(moe_token_dispatcher_type)
       << "\nmoe_shared_expert_intermediate_size " << moe_shared_expert_intermediate_size
       << "\nmoe_layer_freq " << moe_layer_freq << "\nmoe_grouped_gemm " << moe_grouped_gemm;
    if (moe_router_group_topk > 0)
      os << "\nmoe_router_num_groups " << moe_router_num_groups << "\nmoe_router_group_topk "
         << moe_router_group_topk;
    if (moe_router_topk_scaling_factor)
      os << "\nmoe_router_topk_scaling_factor " << *moe_router_topk_scaling_factor;
    if (moe_router_enable_expert_bias)
      os << "\nmoe_router_enable_expert_bias 1\nmoe_router_bias_update_rate "
         << moe_router_bias_update_rate;
  }
  return os.str();
}

}  // namespace mg::transformer
