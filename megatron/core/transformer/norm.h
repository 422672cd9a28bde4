// A norm slot: LayerNorm (weight + bias) or RMSNorm (weight) over the last dim, per
// config.normalization, eps and apply_layernorm_1p (zero-centred weight). Used for the layer norms,
// the final norm and q/k layernorm.
#pragma once

#include <string>

#include "megatron/core/transformer/module.h"

namespace mg::transformer {

class Norm {
 public:
  struct Saved {
    Tensor mean, rstd;  // [rows] stat dtype (mean: LayerNorm only)
  };
  // Declares `weight_name` [h] (and `bias_name` [h] for LayerNorm). sum_grads_over_tp: the
  // parameters are TP-replicated but each rank sees only part of the rows (sequence-parallel
  // shards, or q/k layernorm over this rank's heads): marked sequence_parallel, so
  // tensor_parallel::all_reduce_sequence_parallel_grads sums their grads over TP.
  Norm(const ModuleContext& ctx, ParamBuilder& pb, const std::string& weight_name,
       const std::string& bias_name, int64_t h, bool sum_grads_over_tp = false);

  // y [.., h] = norm(x [.., h]).
  Tensor forward(const Tensor& x, Saved& saved) const;
  // dx (written) from dy; accumulates the weight/bias grads.
  Tensor backward(const Tensor& dy, const Tensor& x, const Saved& saved);

 private:
  const ModuleContext& ctx_;
  bool layernorm_;
  ops::NormArgs args_;
  Weight weight_, bias_;
};

}  // namespace mg::transformer
