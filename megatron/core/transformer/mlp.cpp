// MLP forward/backward over the gemm, gemm_epilogue, bias and activation ops (mlp.h).
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
#include "megatron/core/transformer/mlp.h"

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

MLP::MLP(const ModuleContext& ctx, ParamBuilder& pb, const std::string& prefix, const MlpSpec&,
         int64_t ffn_hidden_size)
    : ctx_(ctx) {
  const TransformerConfig& c = *ctx.config;
  act_ = c.activation;
  fused_ = c.bias_activation_fusion;
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
  const Tensor x2 = xt.view({n, h_});
  Tensor u, a;
  if (fused_ && act_ == Activation::gelu) {
    u = ctx_.empty({n, f_});  // the pre-activation x W1^T + b1, kept for the backward
    a = ctx_.empty({n, f_});
    Tensor none;
    ctx_.op().gemm_epilogue(
        a, u, none, x2, fc1_w_.value, fc1_b_.value,
        ops::GemmEpilogueArgs{.trans_b = true, .epilogue = ops::GemmEpilogue::bias_gelu});
  } else {
    if (fused_ && fc1_b_.defined()) {
      u = ctx_.empty({n, fc1_w_.value.size(0)});  // [N, F] or [N, 2F] (per rank)
      Tensor none, none2;
      ctx_.op().gemm_epilogue(
          u, none, none2, x2, fc1_w_.value, fc1_b_.value,
          ops::GemmEpilogueArgs{.trans_b = true, .epilogue = ops::GemmEpilogue::bias});
    } else {
      u = linear_fwd(ctx_, x2, fc1_w_.value);  // [N, F] or [N, 2F] (per rank)
      if (fc1_b_.defined()) ctx_.op().bias_add(u, fc1_b_.value);
    }
    a = ctx_.empty({n, f_});  // [N, F]
    activation_fwd(ctx_, act_, gelu_, a, u);
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
  const Tensor dy2 = dyt.view({n, h_});
  Tensor du = ctx_.empty(saved.fc1_out.shape());
  Tensor none;
  if (fused_ && act_ == Activation::gelu) {
    // d(pre-act) = gelu'(u) * (dy W2) and dbias1 += its column sums, in one GEMM.
    Tensor& db1 = fc1_b_.defined() ? fc1_b_.grad : none;
    ctx_.op().gemm_epilogue(du, saved.fc1_out, db1, dy2, fc2_w_.value, Tensor(),
                            ops::GemmEpilogueArgs{.epilogue = ops::GemmEpilogue::dgelu_bgrad});
    ctx_.op().gemm(fc2_w_.grad, dy2, saved.act_out,
                   ops::GemmArgs{.trans_a = true, .beta = 1.0f});  // dW2 += dy^T a
  } else {
    Tensor da = ctx_.empty({n, f_});
    linear_bwd(ctx_, da, fc2_w_.grad, dy2, saved.act_out, fc2_w_.value);
    activation_bwd(ctx_, act_, gelu_, du, da, saved.fc1_out);
  }
  Tensor dx = ctx_.empty({n, h_});
  if (fused_ && act_ != Activation::gelu && fc1_b_.defined()) {
    // dW1 += du^T x with dbias1 += sum_n du on the weight-gradient GEMM.
    ctx_.op().gemm_epilogue(
        fc1_w_.grad, none, fc1_b_.grad, du, xt.view({n, h_}), Tensor(),
        ops::GemmEpilogueArgs{.trans_a = true, .epilogue = ops::GemmEpilogue::bgrad, .beta = 1.0f});
    ctx_.op().gemm(dx, du, fc1_w_.value, ops::GemmArgs{});
  } else {
    if (!fused_ && fc1_b_.defined()) ctx_.op().bias_grad(fc1_b_.grad, du);
    linear_bwd(ctx_, dx, fc1_w_.grad, du, xt.view({n, h_}), fc1_w_.value);
  }
  saved = Saved{};
  return tp_region_enter_bwd(ctx_, dx.view(xt.shape()));
}

}  // namespace mg::transformer
