// MLP forward/backward over the gemm, bias and activation ops (mlp.h).
// Gradient rule: parameter gradients +=, activation gradients =.
#include "megatron/core/transformer/mlp.h"

namespace mg::transformer {

MLP::MLP(const ModuleContext& ctx, ParamBuilder& pb, const std::string& prefix, const MlpSpec&)
    : ctx_(ctx) {
  const TransformerConfig& c = *ctx.config;
  act_ = c.activation;
  gelu_ = c.bias_activation_fusion ? ops::GeluApprox::tanh : ops::GeluApprox::none;
  h_ = c.hidden_size;
  f_ = c.ffn_hidden_size;
  pb.add(fc1_w_, prefix + "linear_fc1.weight", {c.fc1_output_size(), h_}, InitRule::normal, 0);
  if (c.add_bias_linear)
    pb.add(fc1_b_, prefix + "linear_fc1.bias", {c.fc1_output_size()}, InitRule::zeros, 0);
  pb.add(fc2_w_, prefix + "linear_fc2.weight", {h_, f_}, InitRule::scaled_normal, 1);
  if (c.add_bias_linear) pb.add(fc2_b_, prefix + "linear_fc2.bias", {h_}, InitRule::zeros);
}

Tensor MLP::forward(const Tensor& x, Saved& saved) const {
  const Shape shape = x.shape();
  const int64_t n = x.numel() / h_;
  Tensor u = linear_fwd(ctx_, x.view({n, h_}), fc1_w_.value);  // [N, F] or [N, 2F]
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
  return z.view(shape);
}

Tensor MLP::backward(const Tensor& dy, const Tensor& x, Saved& saved) {
  const int64_t n = x.numel() / h_;
  Tensor da = ctx_.empty({n, f_});
  linear_bwd(ctx_, da, fc2_w_.grad, dy.view({n, h_}), saved.act_out, fc2_w_.value);
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
  linear_bwd(ctx_, dx, fc1_w_.grad, du, x.view({n, h_}), fc1_w_.value);
  saved = Saved{};
  return dx.view(x.shape());
}

}  // namespace mg::transformer
