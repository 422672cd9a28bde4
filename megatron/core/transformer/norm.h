// A norm slot: LayerNorm (weight + bias) or RMSNorm (weight) over the last dim, as the layer spec
// names it (NormImpl), with config.norm_epsilon and apply_layernorm_1p (zero-centred weight). Used
// for the layer norms, the final norm and q/k layernorm. forward_bda / backward_add are the
// residual-path fusions the transformer layer uses (norm.cpp's ops; bit-identical to the unfused
// sequences on the CPU).
#pragma once

#include <string>

#include "megatron/core/transformer/module.h"
#include "megatron/core/transformer/transformer_layer_spec.h"

namespace mg::transformer {

class Norm {
 public:
  struct Saved {
    Tensor mean, rstd;  // [rows] stat dtype (mean: LayerNorm only)
  };
  // impl: layernorm or rmsnorm (identity is no module: the caller holds none). Declares
  // `weight_name` [h] (and `bias_name` [h] for LayerNorm). sum_grads_over_tp: the
  // parameters are TP-replicated but each rank sees only part of the rows (sequence-parallel
  // shards, or q/k layernorm over this rank's heads): marked sequence_parallel, so
  // tensor_parallel::all_reduce_sequence_parallel_grads sums their grads over TP.
  Norm(const ModuleContext& ctx, ParamBuilder& pb, NormImpl impl, const std::string& weight_name,
       const std::string& bias_name, int64_t h, bool sum_grads_over_tp = false);

  // y [.., h] = norm(x [.., h]).
  Tensor forward(const Tensor& x, Saved& saved) const;
  // dx (written) from dy; accumulates the weight/bias grads.
  Tensor backward(const Tensor& dy, const Tensor& x, const Saved& saved);

  // Fused with the bias-dropout-add in front of the norm (op bias_dropout_add_norm_fwd): writes
  // sum [.., h] = residual + dropout(x + bias) (bias [h] optional) and returns norm(sum); the same
  // bits as bias_dropout_add_fwd followed by forward(sum) on the CPU.
  Tensor forward_bda(const Tensor& x, const Tensor& bias, const Tensor& residual,
                     const ops::DropoutArgs& dropout, Tensor& sum, Saved& saved) const;
  // dx = backward(dy) + dresidual in one pass (op norm_bwd_add; dresidual optional): the same
  // bits as backward followed by axpy(dx, dresidual, 1) on the CPU.
  Tensor backward_add(const Tensor& dy, const Tensor& dresidual, const Tensor& x,
                      const Saved& saved);

  // forward / forward_bda fused into the next linear's FP8 input cast (Fp8Config::
  // norm_cast_fusion; docs/fp8.md "Fused casts"): the operand that linear casts (its cast runs
  // fp8_norm_cast_transpose, which writes saved's statistics and, for the bda form, sum), the
  // output never written. nf holds the fusion's arguments and must outlive the cast.
  fp8::Operand fp8_operand(const Tensor& x, Saved& saved, fp8::NormFusion& nf) const;
  fp8::Operand fp8_operand_bda(const Tensor& x, const Tensor& bias, const Tensor& residual,
                               const ops::DropoutArgs& dropout, Tensor& sum, Saved& saved,
                               fp8::NormFusion& nf) const;

 private:
  ops::NormKind kind() const {
    return layernorm_ ? ops::NormKind::layernorm : ops::NormKind::rmsnorm;
  }

  const ModuleContext& ctx_;
  bool layernorm_;
  ops::NormArgs args_;
  Weight weight_, bias_;
};

}  // namespace mg::transformer
