// MLP forward/backward over the tensor-parallel linears (layers.h) and the activation ops (mlp.h).
// Gradient rule: parameter gradients +=, activation gradients =.
// Under config.bias_activation_fusion (Megatron's default; --no-bias-gelu-fusion turns it off):
//   GELU: fc1 is one gemm_epilogue bias_gelu (bias + tanh GELU, the pre-activation kept as aux);
//         backward runs dgelu_bgrad on the fc2 data-gradient GEMM: d(pre-act) = gelu'(u) * (dy W2)
//         and dbias1 += its column sums in one call. That is correct under TP and SP: dy is the
//         full [S, B, H] inside the TP region (all-gathered under SP), W2 this rank's [H, F/TP]
//         columns, so d(pre-act) is this rank's [N, F/TP] over all N tokens and its column sums are
//         exactly this rank's shard of the column-parallel fc1 bias gradient (no reduction).
//   SwiGLU / squared ReLU with a bias: fc1 uses the bias epilogue, and the fc1 weight-gradient GEMM
//         the bgrad epilogue (dW1 += du^T x, dbias1 += sum_n du).
// Without the flag: gemm, bias_add, the activation, bias_grad, as separate ops (exact erf GELU).
// SwiGLU with FP8 linears (config.bias_swiglu_fusion, Megatron's default; --no-bias-swiglu-fusion
// turns it off; docs/fp8.md "Fused casts"): the activation is fused into the FP8 cast of fc2's
// input (RowParallelLinear::forward_swiglu: swiglu(u) never written; fc2's FP8 weight gradient
// reads the FP8 input, not the activation) and its gradient into the FP8 cast of fc1's output
// gradient (ColumnParallelLinear::backward_dswiglu), each where that linear allows it
// (fuses_input_cast / fuses_grad_cast: FP8 weight gradients, no fc1 bias). The same bytes as
// the separate ops.
#include "megatron/core/transformer/mlp.h"

#include "megatron/core/common/error.h"

namespace mg::transformer {

void activation_fwd(const ModuleContext& ctx, Activation act, ops::GeluApprox approx, Tensor& a,
                    const Tensor& u) {
  switch (act) {
    case Activation::gelu:
      ctx.op().gelu_fwd(a, u, approx);
      return;
    case Activation::swiglu:
      ctx.op().swiglu_fwd(a, u);
      return;
    case Activation::squared_relu:
      ctx.op().squared_relu_fwd(a, u);
      return;
  }
}

void activation_bwd(const ModuleContext& ctx, Activation act, ops::GeluApprox approx, Tensor& du,
                    const Tensor& da, const Tensor& u) {
  switch (act) {
    case Activation::gelu:
      ctx.op().gelu_bwd(du, da, u, approx);
      return;
    case Activation::swiglu:
      ctx.op().swiglu_bwd(du, da, u);
      return;
    case Activation::squared_relu:
      ctx.op().squared_relu_bwd(du, da, u);
      return;
  }
}

MLP::MLP(const ModuleContext& ctx, ParamBuilder& pb, const std::string& prefix,
         const MlpSubmodules& spec, int64_t ffn_hidden_size)
    : ctx_(ctx) {
  MG_CHECK(spec.linear_fc1 == LinearImpl::column_parallel,
           prefix << "linear_fc1: column-parallel only (LinearImpl::column_parallel)");
  MG_CHECK(spec.linear_fc2 == LinearImpl::row_parallel,
           prefix << "linear_fc2: row-parallel only (LinearImpl::row_parallel)");
  const TransformerConfig& c = *ctx.config;
  act_ = c.activation;
  fused_ = c.bias_activation_fusion;
  gelu_ = c.bias_activation_fusion ? ops::GeluApprox::tanh : ops::GeluApprox::none;
  h_ = c.hidden_size;
  const int64_t ffn = ffn_hidden_size > 0 ? ffn_hidden_size : c.ffn_hidden_size;
  f_ = tensor_parallel::divide_exact(ffn, ctx.tp_size(),
                                     "ffn_hidden_size over tensor_model_parallel_size");
  // Column-parallel fc1 (SwiGLU: partition_stride 2, each rank [gate_r; up_r], FORMATS.md §6.3),
  // row-parallel fc2 with its replicated bias left to the layer's bias-dropout-add.
  linear_fc1_ = std::make_unique<tensor_parallel::ColumnParallelLinear>(
      ctx, pb, prefix + "linear_fc1.",
      tensor_parallel::ColumnParallelLinearConfig{
          .input_size = h_,
          .output_size = c.gated_linear_unit() ? 2 * ffn : ffn,
          .bias = c.add_bias_linear,
          .partition_stride = c.gated_linear_unit() ? 2 : 1,
          .init = InitRule::normal,
          .gemm_bias_fusion = fused_});
  linear_fc2_ = std::make_unique<tensor_parallel::RowParallelLinear>(
      ctx, pb, prefix + "linear_fc2.",
      tensor_parallel::RowParallelLinearConfig{.input_size = ffn,
                                               .output_size = h_,
                                               .bias = c.add_bias_linear,
                                               .input_is_parallel = true,
                                               .skip_bias_add = true,
                                               .init = InitRule::scaled_normal});
  const bool swiglu_fusion = act_ == Activation::swiglu && c.bias_swiglu_fusion;
  swiglu_cast_fwd_ = swiglu_fusion && linear_fc2_->fuses_input_cast();
  swiglu_cast_bwd_ = swiglu_fusion && linear_fc1_->fuses_grad_cast();
}

bool MLP::fuses_input_norm() const {
  return !(fused_ && act_ == Activation::gelu) && linear_fc1_->fuses_input_operand();
}

Tensor MLP::forward(const fp8::Operand& x, Saved& saved) const {
  MG_CHECK(fuses_input_norm(),
           "MLP::forward(Operand): fc1 does not take a fused input "
           "(fuses_input_norm: FP8, FP8 wgrad, TP 1, no bias-GELU)");
  return forward_impl(Tensor(), &x, saved);
}

Tensor MLP::forward(const Tensor& x, Saved& saved) const {
  return forward_impl(x, nullptr, saved);
}

Tensor MLP::forward_impl(const Tensor& x, const fp8::Operand* xop, Saved& saved) const {
  // fc1 enters the TP region: [S(/TP), B, H] -> [S, B, F] on every TP rank.
  Tensor u, a;  // [N, F] ([N, 2F] for u under SwiGLU), per rank
  Shape shape;  // [S, B, F]
  if (fused_ && act_ == Activation::gelu) {
    a = linear_fc1_->forward_bias_gelu(x, saved.fc1, u);  // bias + GELU in the GEMM, u kept
    shape = a.shape();
    a = a.view({u.size(0), f_});
  } else {
    const Tensor y = xop ? linear_fc1_->forward(*xop, saved.fc1)
                         : linear_fc1_->forward(x, saved.fc1);  // [S, B, F or 2F] (+ bias)
    u = y.view({y.numel() / y.size(-1), y.size(-1)});
    if (swiglu_cast_fwd_) {  // fc2(swiglu(u)), the activation made inside fc2's FP8 cast
      saved.fc1_out = u;
      return linear_fc2_->forward_swiglu(y, saved.fc2);
    }
    shape = y.shape();
    shape.back() = f_;
    a = ctx_.empty({u.size(0), f_});  // [N, F]
    activation_fwd(ctx_, act_, gelu_, a, u);
  }
  saved.fc1_out = u;
  saved.act_out = a;
  return linear_fc2_->forward(a.view(shape), saved.fc2);  // leaves the TP region
}

Tensor MLP::backward(const Tensor& dy, const Tensor& x, Saved& saved) {
  const Tensor a = saved.act_out;  // undefined under swiglu_cast_fwd_
  const int64_t n = saved.fc1_out.size(0);
  if (swiglu_cast_bwd_) {  // fc1's output gradient swiglu_bwd(da, u) made inside its FP8 cast
    const Tensor da = linear_fc2_->backward(dy, a, saved.fc2);
    const Tensor dx = linear_fc1_->backward_dswiglu(da.view({n, f_}), saved.fc1_out, x, saved.fc1);
    saved = Saved{};
    return dx;
  }
  Tensor du;
  if (fused_ && act_ == Activation::gelu) {
    // d(pre-act) = gelu'(u) * (dy W2) and dbias1 += its column sums, in one GEMM; dW2 += dy^T a.
    Tensor none;
    Tensor& db1 = linear_fc1_->bias().defined() ? linear_fc1_->bias().grad : none;
    du = linear_fc2_->backward_dgelu_bgrad(dy, a, saved.fc1_out, db1, saved.fc2);
  } else {
    const Tensor da = linear_fc2_->backward(dy, a, saved.fc2);
    du = ctx_.empty(saved.fc1_out.shape());
    activation_bwd(ctx_, act_, gelu_, du, da.view({n, f_}), saved.fc1_out);
  }
  // fc1: dW1 += du^T x (with the bias gradient unless the dgelu_bgrad epilogue took it), dx
  // summed over TP (or reduce-scattered) back to x's shape.
  const bool bias_grad_done = fused_ && act_ == Activation::gelu;
  const Tensor dx = linear_fc1_->backward(du, x, saved.fc1, bias_grad_done);
  saved = Saved{};
  return dx;
}

}  // namespace mg::transformer
