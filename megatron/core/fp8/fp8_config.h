// FP8 training settings (Megatron's --fp8-* flags; TransformerConfig::fp8), the recipe's formats
// and the per-tensor format rule. docs/fp8.md has the formulas.
#pragma once

#include <cstdint>
#include <string>

#include "megatron/core/tensor/dtype.h"

namespace mg::fp8 {

enum class Fp8Format : uint8_t {
  none,    // FP8 off
  e4m3,    // every GEMM operand in E4M3
  hybrid,  // activations and weights E4M3, gradients E5M2 (Transformer Engine's HYBRID)
};
enum class Fp8Recipe : uint8_t {
  delayed,     // DelayedScaling: scales from a rolling amax history, updated after each pass
  tensorwise,  // Float8CurrentScaling: the scale from this tensor's own amax, just before the cast
};
enum class AmaxComputeAlgo : uint8_t { max, most_recent };

struct Fp8Config {
  Fp8Format format = Fp8Format::none;     // --fp8-format (--fp8-e4m3 / --fp8-hybrid)
  Fp8Recipe recipe = Fp8Recipe::delayed;  // --fp8-recipe
  int64_t margin = 0;                     // --fp8-margin: scale /= 2^margin
  int64_t amax_history_len = 1;           // --fp8-amax-history-len
  AmaxComputeAlgo amax_compute_algo = AmaxComputeAlgo::most_recent;  // --fp8-amax-compute-algo
  bool wgrad = true;  // --no-fp8-wgrad: weight-gradient GEMM in high precision
  // Megatron-Core's TransformerConfig.disable_parameter_transpose_cache (no flag): cast the weights
  // in every micro-batch instead of once per forward-backward call.
  bool disable_parameter_transpose_cache = false;
  bool tp_only_amax_red = false;  // --tp-only-amax-red: amax over TP(-CP) only
  // --fp8-param-gather: the FP8 linears' weights are FP8 model parameters (Fp8State's param
  // storage), cast from the distributed optimizer's master shards and all-gathered as FP8.
  bool param_gather = false;
  // --fp8-dot-product-attention: the decoder layers' core attention in FP8 (Transformer Engine's
  // fp8_dpa; docs/fp8.md "FP8 attention"): q, k, v, the softmax output and O in the forward
  // format, dO, dP and dQ/dK/dV in the gradient format, each with its own delayed scaling.
  bool dot_product_attention = false;
  // Transformer Engine's NVTE_FP8_DPA_BWD (default 1): 0 runs the FP8 attention's backward in the
  // model dtype (attention_bwd on the saved q, k, v and the dequantised out), as TE does; cuDNN's
  // FP8 backward on Hopper takes head dim 128 only.
  bool dot_product_attention_fp8_backward = true;
  // --fp8-multi-head-attention (Transformer Engine's fp8_mha; implies dot_product_attention, as TE
  // forces fp8_dpa): no casts at the FP8 attention's boundaries with linear_proj -- its O (FP8)
  // is linear_proj's FP8 input, and linear_proj's data-gradient GEMM writes dO in FP8 at the dO
  // scale. q, k, v are still cast after the rotary embedding (TE's QKV GEMM gives FP8 only without
  // one) and dQ, dK, dV dequantised for it.
  bool multi_head_attention = false;
  // The norm in front of a linear made inside the linear's FP8 input cast (docs/fp8.md "Fused
  // casts", Transformer Engine's LayerNormLinear): the norm's output is never written in the model
  // dtype. No flag (TE always fuses); off only to compare (the same bytes either way). Applies
  // where the linear enters no tensor-parallel region (TP 1) and has FP8 weight gradients.
  bool norm_cast_fusion = true;
  bool first_last_layers_bf16 = false;      // --first-last-layers-bf16
  int64_t num_layers_at_start_in_bf16 = 1;  // --num-layers-at-start-in-bf16
  int64_t num_layers_at_end_in_bf16 = 1;    // --num-layers-at-end-in-bf16

  bool enabled() const { return format != Fp8Format::none; }
  // The FP8 dtype of a forward operand (input, weight) and of a gradient.
  DType forward_dtype() const { return DType::fp8_e4m3; }
  DType backward_dtype() const {
    return format == Fp8Format::hybrid ? DType::fp8_e5m2 : DType::fp8_e4m3;
  }
  // Whether decoder layer `layer` (0-based) of `num_layers` runs its linears in FP8.
  bool layer_in_fp8(int64_t layer, int64_t num_layers) const;
  // Throws naming the values (history length >= 1, margin >= 0, layer counts in range).
  void validate(int64_t num_layers) const;
};

const char* format_name(Fp8Format f);           // "none", "e4m3", "hybrid"
const char* recipe_name(Fp8Recipe r);           // "delayed", "tensorwise"
const char* amax_algo_name(AmaxComputeAlgo a);  // "max", "most_recent"
// The largest finite value of an FP8 dtype: 448 (e4m3), 57344 (e5m2).
float fp8_max(DType t);

}  // namespace mg::fp8
