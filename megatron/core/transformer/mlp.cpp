// MLP forward/backward over the gemm, bias and activation ops (mlp.h).
// Gradient rule: parameter gradients +=, activation gradients =.
#include "megatron/core/transformer/mlp.h"

namespace mg::transformer {

MLP::MLP(const ModuleContext& ctx, ParamBuilder& pb, const std::string& prefix, const MlpSpec&,
         int64_t ffn_hidden_size)
    : ctx_(ctx) {
  const TransformerConfig& c = *ctx.config;
  act_ = c.activation;
  gelu_ = c.bias_activation_fusion ? ops::GeluApprox::tanh : ops::GeluApprox::none;
  h_ = c.hidden_size;
  const int64_t ffn = ffn_hidden_size > 0 ? ffn_hidden_size : c.ffn_hidden_size;
  const int64_t fc1_rows = c.gated_linear_unit() ? 2 * ffn : ffn;
  f_ = tensor_parallel::divide_exact(ffn, ctx.tp_size(),
                                     "ffn_hidden_size over tensor_model_parallel_size");
  // Column-parallel fc1 (SwiGLU: partition_stride 2, each rank [gate_r; up_r], FORMATS.md §6.3),
  // row-parallel fc2 with its replicated bias left to the layer's bias-dropout-add.
  const int stride = c.gated_linear_unit() ? 2 : 1;
  pb.add(fc1_w_, prefix + "linear_fc1.weight", {fc1_rows, h_}, InitRule::normal,
         ctx.tp_partition(0, stride));
  if (c.add_bias_linear)
    pb.add(fc1_b_, prefix + "linear_fc1.bias", {fc1_rows}, InitRule::zeros,
           ctx.tp_partition(0, stride));
  pb.add(fc2_w_, prefix + "linear_fc2.weight", {h_, ffn}, InitRule::scaled_normal,
         ctx.tp_partition(1));
  if (c.add_bias_linear)
    pb.add(fc2_b_, prefix + "linear_fc2.bias", {h_}, InitRule::zeros, tensor_parallel::Partition{},
           ctx.sequence_parallel && ctx.tp_size() > 1);
}

Tensor MLP::forward(const Tensor& x, Saved& saved) const {
  const Tensor xt = tp_region_enter(ctx_, x);  // [S, B, H] on every TP rank
  if (ctx_.tp_size() > 1) saved.input = xt;
  const Shape shape = xt.shape();
  const int64_t n = xt.numel() / h_;
  Tensor u = linear_fwd(ctx_, xt.view({n, h_}), fc1_w_.value);  // [N, F] or [N, 2F] (per rank)
  if (fc1_b_.defined()) ctx_.op().bias_add(u, fc1_b_.value);
  Tensor a = ctx_.empty({n, f_});  // [N, F]
  switch (act_) {
    case Activation::gelu:
      ctx_.op().gelu_fwd(a, u, gelu_);
      break;
    case Activation::swiglu:
      ctx_.op().swiglu_fwd(a, u);
      break;
    case Activation::squared_relu:
      ctx_.op().squared_relu_fwd(a, u);
      break;
  }
  Tensor z = linear_fwd(ctx_, a, fc2_w_.value);  // [N, H]
  saved.fc1_out = u;
  saved.act_out = a;
  return tp_region_exit(ctx_, z.view(shape));
}

Tensor MLP::backward(const Tensor& dy, const Tensor& x, Saved& saved) {
  const Tensor dyt = tp_region_exit_bwd(ctx_, dy);  // [S, B, H]
  const Tensor xt = saved.input.defined() ? saved.input : x;
  const int64_t n = xt.numel() / h_;
  Tensor da = ctx_.empty({n, f_});
  linear_bwd(ctx_, da, fc2_w_.grad, dyt.view({n, h_}), saved.act_out, fc2_w_.value);
  Tensor du = ctx_.empty(saved.fc1_out.shape());
  switch (act_) {
    case Activation::gelu:
      ctx_.op().gelu_bwd(du, da, saved.fc1_out, gelu_);
      break;
    case Activation::swiglu:
      ctx_.op().swiglu_bwd(du, da, saved.fc1_out);
      break;
    case Activation::squared_relu:
      ctx_.op().squared_relu_bwd(du, da, saved.fc1_out);
      break;
  }
  if (fc1_b_.defined()) ctx_.op().bias_grad(fc1_b_.grad, du);
  Tensor dx = ctx_.empty({n, h_});
  linear_bwd(ctx_, dx, fc1_w_.grad, du, xt.view({n, h_}), fc1_w_.value);
  saved = Saved{};
  return tp_region_enter_bwd(ctx_, dx.view(xt.shape()));
}

}  // namespace mg::transformer
