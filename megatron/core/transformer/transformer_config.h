// TransformerConfig: the model-shape and numerics config of a Megatron-Core transformer, with
// Megatron's field names and defaults (megatron/core/transformer/transformer_config.py).
//
// A field left 0 means "Megatron's default, derived from the others": finalize() fills it in
// (ffn_hidden_size = 4*hidden_size, num_query_groups = num_attention_heads, kv_channels =
// hidden_size/num_attention_heads, max_position_embeddings = seq_length) and then validate()s, as
// Megatron's __post_init__ does. validate() rejects impossible combinations naming the values.
// Not here: parallel layout (ParallelDims), optimizer and training settings (their own configs),
// and the flag-level defaults of megatron/training/arguments.py (e.g. --swiglu's ffn size
// rounding).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/fp8/fp8_config.h"
#include "megatron/core/ops/op_args.h"
#include "megatron/core/tensor/dtype.h"

namespace mg::transformer {

enum class Normalization : uint8_t { layernorm, rmsnorm };
// gelu: exact erf form (torch.nn.functional.gelu, Megatron's unfused default), or the tanh
// approximation (GPT-2's gelu_new, Megatron's fused bias_gelu) when bias_activation_fusion is set.
enum class Activation : uint8_t { gelu, swiglu, squared_relu };
enum class PositionEmbeddingType : uint8_t { learned_absolute, rope, none };
enum class RecomputeGranularity : uint8_t { none, full, selective };
enum class RecomputeMethod : uint8_t { none, uniform, block };
// Mixture of Experts (megatron/core/transformer/moe/, Megatron's --moe-* flags).
enum class MoeLoadBalancingType : uint8_t { aux_loss, seq_aux_loss, none };
enum class MoeScoreFunction : uint8_t { softmax, sigmoid };
enum class MoeTokenDropPolicy : uint8_t { probs, position };
enum class MoeTokenDispatcherType : uint8_t { allgather, alltoall };

std::string to_string(Normalization v);
std::string to_string(Activation v);
std::string to_string(PositionEmbeddingType v);
std::string to_string(RecomputeGranularity v);
std::string to_string(RecomputeMethod v);
std::string to_string(MoeLoadBalancingType v);
std::string to_string(MoeScoreFunction v);
std::string to_string(MoeTokenDropPolicy v);
std::string to_string(MoeTokenDispatcherType v);

struct TransformerConfig {
  // ---- shape ----
  int64_t num_layers = 0;               // L, >= 1
  int64_t hidden_size = 0;              // H
  int64_t ffn_hidden_size = 0;          // F; 0 -> 4 * hidden_size
  int64_t num_attention_heads = 0;      // NH
  int64_t num_query_groups = 0;         // NG (GQA KV heads); 0 -> num_attention_heads
  int64_t kv_channels = 0;              // HD; 0 -> hidden_size / num_attention_heads
  int64_t seq_length = 0;               // S of a training sample
  int64_t max_position_embeddings = 0;  // learned positions table rows; 0 -> seq_length
  int64_t make_vocab_size_divisible_by = 128;

  // ---- architecture ----
  Normalization normalization = Normalization::layernorm;
  double norm_epsilon = 1e-5;
  bool apply_layernorm_1p = false;  // norm weights stored as gamma - 1 (zero-centred), init 0
  Activation activation = Activation::gelu;
  bool bias_activation_fusion = false;  // gelu: tanh approximation (Megatron's fused bias_gelu)
  // SwiGLU under FP8: the activation (and its gradient) fused into the FP8 casts of linear_fc2's
  // input (linear_fc1's output gradient), the same numbers (docs/fp8.md "Fused casts");
  // --no-bias-swiglu-fusion turns it off.
  bool bias_swiglu_fusion = true;
  bool add_bias_linear = true;  // biases on linear_qkv/proj/fc1/fc2
  bool add_qkv_bias = false;    // bias on linear_qkv only (Qwen2), with !add_bias_linear
  bool qk_layernorm = false;    // q_layernorm / k_layernorm over HD (Qwen3-style)
  PositionEmbeddingType position_embedding_type = PositionEmbeddingType::learned_absolute;
  double rotary_base = 10000.0;
  double rotary_percent = 1.0;
  bool rotary_interleaved = false;  // false: rotate-half (NeoX/HF), Megatron's default
  // Frequency scaling (ops/rope_scaling.h): --rotary-seq-len-interpolation-factor (linear),
  // --use-rope-scaling / --rope-scaling-factor (llama3), --position-embedding-type yarn (yarn).
  ops::RopeScaling rope_scaling;
  bool untie_embeddings_and_output_weights = false;

  // ---- regularisation and init ----
  double hidden_dropout = 0.1;     // embedding output, after linear_proj and after linear_fc2
  double attention_dropout = 0.1;  // on the attention probabilities
  double init_method_std = 0.02;   // normal(0, std); linear_proj/linear_fc2: std / sqrt(2 L)

  // ---- precision ----
  DType params_dtype = DType::f32;  // f32 | bf16 | f16 | f64; grads f32 under bf16/f16

  // ---- activation recomputation ----
  RecomputeGranularity recompute_granularity = RecomputeGranularity::none;
  RecomputeMethod recompute_method = RecomputeMethod::none;
  int64_t recompute_num_layers = 0;  // full: layers per chunk (uniform) / first N layers (block)

  // ---- loss ----
  // false: each micro-batch's loss is its mean over its masked tokens, divided by the number of
  // micro-batches; true: the sum, with gradients divided by the global number of tokens.
  bool calculate_per_token_loss = false;

  // ---- mixture of experts (moe/moe_layer.h); Megatron's defaults ----
  int64_t num_moe_experts = 0;      // --num-experts E; 0: a dense MLP in every layer
  int64_t moe_ffn_hidden_size = 0;  // --moe-ffn-hidden-size; 0 -> ffn_hidden_size
  int64_t moe_router_topk = 2;      // --moe-router-topk k, in [1, E]
  MoeLoadBalancingType moe_router_load_balancing_type = MoeLoadBalancingType::aux_loss;
  double moe_aux_loss_coeff = 0.0;  // --moe-aux-loss-coeff (0: the aux loss adds nothing)
  double moe_z_loss_coeff = 0.0;    // --moe-z-loss-coeff (0: none)
  MoeScoreFunction moe_router_score_function = MoeScoreFunction::softmax;
  bool moe_router_pre_softmax = false;  // softmax over all E before top-k (else over the top k)
  // --moe-expert-capacity-factor: each expert keeps at most ceil(T k / E * factor) of a
  // micro-batch's T local tokens, choosing by --moe-token-drop-policy; nullopt: dropless.
  std::optional<double> moe_expert_capacity_factor;
  MoeTokenDropPolicy moe_token_drop_policy = MoeTokenDropPolicy::probs;
  // DeepSeek-style routing (moe_utils.h topk_routing): --moe-router-num-groups G and
  // --moe-router-group-topk g (0: off) route each token within its g best groups of E / G experts;
  // --moe-router-topk-scaling-factor multiplies the routing probabilities (nullopt: none);
  // --moe-router-enable-expert-bias adds a per-expert bias (sigmoid scores only) to the scores for
  // the top-k choice, moved by --moe-router-bias-update-rate after each step (aux-loss-free
  // load balancing).
  int64_t moe_router_num_groups = 0;
  int64_t moe_router_group_topk = 0;
  std::optional<double> moe_router_topk_scaling_factor;
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  // --moe-router-dtype fp32|fp64 ("": unset). The router logits here are computed in fp32 (fp64
  // for an fp64 model) whatever the flag: fp32 is accepted, fp64 only for an fp64 model.
  std::string moe_router_dtype;
  MoeTokenDispatcherType moe_token_dispatcher_type = MoeTokenDispatcherType::allgather;
  int64_t moe_shared_expert_intermediate_size = 0;  // 0: no shared experts
  bool moe_shared_expert_gate = false;  // --moe-shared-expert-gate: sigmoid gate on their output
  // --moe-layer-freq: layer l (0-based) is MoE iff l % moe_layer_freq == 0, or, when
  // moe_layer_pattern is given ("[1,0,1,1]"), iff moe_layer_pattern[l] == 1 (one per layer).
  int64_t moe_layer_freq = 1;
  std::vector<int> moe_layer_pattern;
  bool moe_grouped_gemm = false;  // --moe-grouped-gemm (same math and names here: moe_layer.h)

  // FP8 training (--fp8-format and the other --fp8-* flags; docs/fp8.md): the decoder layers'
  // linears (per first_last_layers_bf16) run FP8 GEMMs; embeddings, output layer, norms, softmax,
  // attention and routed experts stay in the model dtype.
  fp8::Fp8Config fp8;

  // Fills the 0-valued derived fields with Megatron's defaults, then validate()s.
  void finalize();
  // Throws mg::Error naming the offending values. Expects a finalized config.
  void validate() const;

  // Megatron's padded vocabulary: vocab rounded up to a multiple of
  // make_vocab_size_divisible_by*tp.
  int64_t padded_vocab_size(int64_t vocab_size, int64_t tensor_model_parallel_size = 1) const;

  // Derived sizes (finalized config).
  int64_t query_projection_size() const { return kv_channels * num_attention_heads; }
  int64_t kv_projection_size() const { return kv_channels * num_query_groups; }
  // Rows of linear_qkv.weight: (NH + 2 NG) * HD.
  int64_t qkv_projection_size() const { return query_projection_size() + 2 * kv_projection_size(); }
  // Rows of linear_fc1.weight: 2F when gated (swiglu), else F.
  int64_t fc1_output_size() const {
    return activation == Activation::swiglu ? 2 * ffn_hidden_size : ffn_hidden_size;
  }
  bool gated_linear_unit() const { return activation == Activation::swiglu; }
  // The grad (main_grad) dtype: f32 under bf16/f16 mixed precision, else params_dtype.
  DType grad_dtype() const {
    return params_dtype == DType::bf16 || params_dtype == DType::f16 ? DType::f32 : params_dtype;
  }
  // Whether layer l (0-based) runs under full recompute (keeps only its input in forward).
  bool layer_recomputed(int64_t layer) const;
  // Whether layer l (0-based, global) has an MoE MLP.
  bool is_moe_layer(int64_t layer) const;
  // The routed experts' FFN size (moe_ffn_hidden_size, or ffn_hidden_size).
  int64_t expert_ffn_hidden_size() const {
    return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn_hidden_size;
  }

  // One line per field, for the start-up summary.
  std::string str() const;
};

}  // namespace mg::transformer
