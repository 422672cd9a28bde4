// MLP: linear_fc1 (+ bias) -> activation -> linear_fc2 (its bias left to the layer's
// bias-dropout-add); linear_fc1 a tensor_parallel::ColumnParallelLinear, linear_fc2 a
// RowParallelLinear (layers.h), as the spec (MlpSubmodules) names them. SwiGLU's linear_fc1.weight
// is [2F, H] = [gate; up] (FORMATS.md §6.3), so the fc1 output [N, 2F] is [gate | up] along its
// last dim, which is the swiglu op's input layout. GELU is the exact erf form, or the tanh
// approximation under config.bias_activation_fusion, which also fuses fc1's bias (and GELU) into
// its GEMM and the bias gradient into a backward GEMM (gemm_epilogue; mlp.cpp says which). Tensor
// parallelism (ctx.tp_group): fc1 column-parallel (SwiGLU rank r holds [gate_r; up_r],
// partition_stride 2), fc2 row-parallel; F below is this rank's F/TP. The input enters the TP
// region in fc1 (copy, or SP all-gather), the output leaves it in fc2 (all-reduce, or SP
// reduce-scatter).
#pragma once

#include <memory>
#include <string>

#include "megatron/core/tensor_parallel/layers.h"
#include "megatron/core/transformer/module.h"
#include "megatron/core/transformer/transformer_layer_spec.h"

namespace mg::transformer {

class MLP {
 public:
  struct Saved {
    Tensor fc1_out;  // [N, F] or [N, 2F], after bias (activation input)
    Tensor act_out;  // [N, F] (not written when SwiGLU is fused into fc2's FP8 cast)
    tensor_parallel::ColumnParallelLinear::Saved fc1;  // TP > 1: the input in the TP region
    tensor_parallel::RowParallelLinear::Saved fc2;     // FP8: the forward's casts
  };
  // prefix: "decoder.layers.N.mlp." (MoE shared experts: "decoder.layers.N.mlp.shared_experts.");
  // ffn_hidden_size: F (0: config.ffn_hidden_size).
  MLP(const ModuleContext& ctx, ParamBuilder& pb, const std::string& prefix,
      const MlpSubmodules& spec, int64_t ffn_hidden_size = 0);

  // x [S, B, H] (normalised) -> linear_fc2 output without its bias [S, B, H].
  Tensor forward(const Tensor& x, Saved& saved) const;
  // forward with fc1's input made inside its FP8 cast (the norm in front, fp8::Operand::normed;
  // docs/fp8.md "Fused casts"): x never written; the backward then takes an undefined x. Needs
  // fuses_input_norm().
  Tensor forward(const fp8::Operand& x, Saved& saved) const;
  bool fuses_input_norm() const;
  // dy [S, B, H] -> dx (written); accumulates fc1/fc2 grads (not fc2's bias: the bda's).
  Tensor backward(const Tensor& dy, const Tensor& x, Saved& saved);

  Weight& fc2_bias() { return linear_fc2_->bias(); }

 private:
  const ModuleContext& ctx_;
  Activation act_;
  bool fused_;  // config.bias_activation_fusion: gemm_epilogue paths (mlp.cpp)
  // SwiGLU fused into fc2's FP8 input cast / into fc1's FP8 output-gradient cast (mlp.cpp).
  bool swiglu_cast_fwd_ = false, swiglu_cast_bwd_ = false;
  Tensor forward_impl(const Tensor& x, const fp8::Operand* xop, Saved& saved) const;
  ops::GeluApprox gelu_;
  int64_t h_, f_;
  std::unique_ptr<tensor_parallel::ColumnParallelLinear> linear_fc1_;
  std::unique_ptr<tensor_parallel::RowParallelLinear> linear_fc2_;
};

// The MLP activation on u [N, F] ([N, 2F] = [gate | up] for SwiGLU) -> a [N, F], and its backward
// du = act'(u) * da (written). GELU uses `approx` (tanh under bias_activation_fusion). Shared by
// the MLP and the MoE experts.
void activation_fwd(const ModuleContext& ctx, Activation act, ops::GeluApprox approx, Tensor& a,
                    const Tensor& u);
void activation_bwd(const ModuleContext& ctx, Activation act, ops::GeluApprox approx, Tensor& du,
                    const Tensor& da, const Tensor& u);

}  // namespace mg::transformer
