// LayerNorm / RMSNorm module over the layernorm_* / rmsnorm_* ops (norm.h).
#include "megatron/core/transformer/norm.h"

#include "megatron/core/common/error.h"

namespace mg::transformer {

Norm::Norm(const ModuleContext& ctx, ParamBuilder& pb, NormImpl impl,
           const std::string& weight_name, const std::string& bias_name, int64_t h,
           bool sum_grads_over_tp)
    : ctx_(ctx), layernorm_(impl == NormImpl::layernorm) {
  MG_CHECK(impl != NormImpl::identity,
           "Norm " << weight_name << ": NormImpl::identity is no module (hold none)");
  args_.eps = static_cast<float>(ctx.config->norm_epsilon);
  args_.zero_centered_gamma = ctx.config->apply_layernorm_1p;
  const InitRule w_init = args_.zero_centered_gamma ? InitRule::zeros : InitRule::ones;
  const tensor_parallel::Partition replicated{};
  const bool sum = sum_grads_over_tp && ctx.tp_size() > 1;
  pb.add(weight_, weight_name, {h}, w_init, replicated, sum);
  if (layernorm_) pb.add(bias_, bias_name, {h}, InitRule::zeros, replicated, sum);
}

Tensor Norm::forward(const Tensor& x, Saved& saved) const {
  const int64_t h = x.size(-1), rows = x.numel() / h;
  Tensor y = ctx_.empty(x.shape());
  saved.rstd = Tensor::empty({rows}, ctx_.stat_dtype(), ctx_.device);
  if (layernorm_) {
    saved.mean = Tensor::empty({rows}, ctx_.stat_dtype(), ctx_.device);
    ctx_.op().layernorm_fwd(y, saved.mean, saved.rstd, x, weight_.value, bias_.value, args_);
  } else {
    ctx_.op().rmsnorm_fwd(y, saved.rstd, x, weight_.value, args_);
  }
  return y;
}

Tensor Norm::backward(const Tensor& dy, const Tensor& x, const Saved& saved) {
  Tensor dx = ctx_.empty(x.shape());
  if (layernorm_)
    ctx_.op().layernorm_bwd(dx, weight_.grad, bias_.grad, dy, x, saved.mean, saved.rstd,
                            weight_.value, args_);
  else
    ctx_.op().rmsnorm_bwd(dx, weight_.grad, dy, x, saved.rstd, weight_.value, args_);
  return dx;
}

Tensor Norm::forward_bda(const Tensor& x, const Tensor& bias, const Tensor& residual,
                         const ops::DropoutArgs& dropout, Tensor& sum, Saved& saved) const {
  const int64_t h = x.size(-1), rows = x.numel() / h;
  Tensor y = ctx_.empty(x.shape());
  sum = ctx_.empty(x.shape());
  saved.rstd = Tensor::empty({rows}, ctx_.stat_dtype(), ctx_.device);
  if (layernorm_) saved.mean = Tensor::empty({rows}, ctx_.stat_dtype(), ctx_.device);
  ctx_.op().bias_dropout_add_norm_fwd(y, sum, saved.mean, saved.rstd, x, bias, residual,
                                      weight_.value, layernorm_ ? bias_.value : Tensor(), dropout,
                                      args_, kind());
  return y;
}

fp8::Operand Norm::fp8_operand(const Tensor& x, Saved& saved, fp8::NormFusion& nf) const {
  const int64_t h = x.size(-1), rows = x.numel() / h;
  saved.rstd = Tensor::empty({rows}, ctx_.stat_dtype(), ctx_.device);
  if (layernorm_) saved.mean = Tensor::empty({rows}, ctx_.stat_dtype(), ctx_.device);
  nf = fp8::NormFusion{};
  nf.kind = kind();
  nf.args = args_;
  nf.gamma = weight_.value;
  if (layernorm_) nf.beta = bias_.value;
  nf.mean = saved.mean;
  nf.rstd = saved.rstd;
  return fp8::Operand::normed(x, &nf);
}

fp8::Operand Norm::fp8_operand_bda(const Tensor& x, const Tensor& bias, const Tensor& residual,
                                   const ops::DropoutArgs& dropout, Tensor& sum, Saved& saved,
                                   fp8::NormFusion& nf) const {
  fp8::Operand op = fp8_operand(x, saved, nf);
  sum = ctx_.empty(x.shape());
  nf.bias = bias;
  nf.residual = residual;
  nf.sum = sum;
  nf.dropout = dropout;
  return op;
}

Tensor Norm::backward_add(const Tensor& dy, const Tensor& dresidual, const Tensor& x,
                          const Saved& saved) {
  Tensor dx = ctx_.empty(x.shape());
  Tensor no_dbeta;
  ctx_.op().norm_bwd_add(dx, weight_.grad, layernorm_ ? bias_.grad : no_dbeta, dy, dresidual, x,
                         saved.mean, saved.rstd, weight_.value, args_, kind());
  return dx;
}

}  // namespace mg::transformer
