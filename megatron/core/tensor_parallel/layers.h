// Tensor-parallel layers (Megatron's tensor_parallel/layers.py) with explicit forward/backward.
// The model's linear layers and word embedding ARE these classes (attention.h, mlp.h,
// gpt_model.cpp); on one rank (ctx.tp_group null or of size 1) they are plain layers with no
// communication.
//
//   ColumnParallelLinear   weight [out/TP, in] (rows of the full [out, in]), bias [out/TP].
//                          x -> copy into the TP region (or, sequence parallel, all-gather of the
//                          S shards) -> x W_r^T + b_r [S, B, out/TP] -> (gather_output: all-gather
//                          of the last dim). Used for linear_qkv, linear_fc1 and the output layer.
//   RowParallelLinear      weight [out, in/TP] (columns), bias [out] replicated.
//                          x [.., in/TP] (or split from a full x) -> x W_r^T -> all-reduce (or,
//                          sequence parallel, reduce-scatter to S shards) -> + b (unless
//                          skip_bias_add: the layer's bias-dropout-add adds it, as Megatron).
//                          Used for linear_proj and linear_fc2.
//   VocabParallelEmbedding weight [V_pad/TP, H] (rows [vocab_start, vocab_end)); lookup with 0
//                          for ids of other shards -> all-reduce (or reduce-scatter under SP).
//
// The TP group and sequence parallelism come from the ModuleContext (ctx.tp_group,
// ctx.sequence_parallel): the model's explicit parallel state. Activations are sequence-first
// [S, B, ...]; under sequence parallelism the non-TP regions hold [S/TP, B, H]. Parameters are
// declared through a ParamBuilder (weight, then bias: the order fixes the flat buffers' layout) as
// shards of the full tensor (Partition in sharding.h), so init and checkpoints see Megatron's
// global layouts. Under sequence parallelism the replicated row-parallel bias is marked
// sequence_parallel: its gradient is a partial sum on each rank and
// all_reduce_sequence_parallel_grads() must sum it over TP before the optimizer (PITFALLS #3).
//
// GEMM epilogues (ColumnParallelLinearConfig::gemm_bias_fusion): the bias in the forward GEMM
// (bias epilogue) and its gradient in the weight-gradient GEMM (bgrad epilogue); without it,
// bias_add and bias_grad ops. forward_bias_gelu / RowParallelLinear::backward_dgelu_bgrad are
// Megatron's bias-GELU fusion of an MLP (mlp.cpp). forward_split is the fused QKV of grouped-query
// attention: the output rows cut into parts computed as separate contiguous tensors.
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are written (=).
// Backward takes the layer's input `x` as the caller holds it; Saved keeps only what the caller
// does not have (the input gathered/copied into the TP region when TP > 1).
#pragma once

#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/transformer/module.h"
#include "megatron/core/transformer/parameter.h"

namespace mg::tensor_parallel {

using transformer::InitRule;
using transformer::ModuleContext;
using transformer::ParamBuilder;
using transformer::Weight;

struct ColumnParallelLinearConfig {
  int64_t input_size = 0;   // in
  int64_t output_size = 0;  // out, the full (unsharded) output size
  bool bias = true;
  bool gather_output = false;  // all-gather the output's last dim (else [.., out/TP])
  int partition_stride = 1;    // 2 for SwiGLU's [gate; up] fc1 (FORMATS.md §6.3)
  InitRule init = InitRule::normal;
  // Bias in the GEMM epilogue (forward) and in the weight-gradient GEMM (bgrad); false: separate
  // bias_add / bias_grad ops. linear_qkv: always; linear_fc1: config.bias_activation_fusion.
  bool gemm_bias_fusion = true;
  // Megatron's skip_weight_param_allocation: no weight of its own; forward/backward are given
  // one (the output layer tied to the word embedding).
  bool skip_weight_param_allocation = false;
};

// The output rows of a ColumnParallelLinear cut into parts, each computed as its own contiguous
// [N, rows] tensor: part p is the concatenation, in order, of the blocks naming p. Local weight
// rows [offset, offset + rows) of each block; the blocks cover the local rows exactly once. The
// fused QKV of grouped-query attention (FORMATS.md §6.2: per KV group q rows, then k, then v)
// becomes q, k, v without permuting activations: the weight rows are regrouped (a weight-sized
// scratch copy) and each part is one GEMM.
struct OutputSplit {
  struct Block {
    int part = 0;
    int64_t offset = 0, rows = 0;
  };
  std::vector<int64_t> part_rows;
  std::vector<Block> blocks;
};

// FP8 linears (docs/fp8.md): a linear of a decoder layer that ctx.fp8 covers (TransformerConfig::
// fp8, first/last layers kept out by --first-last-layers-bf16) registers with the model's
// Fp8State and runs its three GEMMs as fp8_gemm: forward y = x_q w_q^T, data gradient dx = g_q
// (w_q^T)^T, weight gradient dW += (g_q^T) (x_q^T)^T (in high precision with --no-fp8-wgrad),
// the operands cast (with their transposes: fp8_cast_transpose) at the scales of the recipe, the
// outputs in the model dtype, dW in main_grad's. Biases and the bias-GELU of the fused paths run
// as separate ops there. What the backward needs of the forward's casts:
struct Fp8Saved {
  Tensor input_t, input_scale_inv;     // x_q^T [in, N]
  Tensor weight_t, weight_scale_inv;   // w_q^T [in, out]
  std::vector<Tensor> weight_parts_t;  // forward_split: each part's w_q^T [in, rows]
};

class ColumnParallelLinear {
 public:
  struct Saved {
    Tensor input;  // TP > 1: the input inside the TP region [S, B, in] (gathered along S under SP)
    Fp8Saved fp8;
  };
  // name_prefix: "decoder.layers.0.mlp.linear_fc1." -> ".weight", ".bias".
  ColumnParallelLinear(const ModuleContext& ctx, ParamBuilder& pb, const std::string& name_prefix,
                       const ColumnParallelLinearConfig& config);

  // x [S (or S/TP), B, in] -> x W^T + b [S, B, out/TP] (or [S, B, out] with gather_output).
  // weight: the weight to use instead of the layer's own (Megatron's forward(input, weight)): the
  // tied word embedding, or the rows of the output layer that produce logits; 0 rows: an empty
  // output.
  Tensor forward(const Tensor& x, Saved& saved, const Weight* weight = nullptr) const;
  // gelu_tanh(x W^T + b) [S, B, out/TP] in one GEMM (bias_gelu epilogue); pre_activation [N,
  // out/TP] = x W^T + b, kept for RowParallelLinear::backward_dgelu_bgrad. No gather_output.
  Tensor forward_bias_gelu(const Tensor& x, Saved& saved, Tensor& pre_activation) const;
  // x -> the parts of `split`, each [N, part_rows[p]] (+ its bias rows). No gather_output.
  std::vector<Tensor> forward_split(const Tensor& x, Saved& saved, const OutputSplit& split) const;
  // forward / forward_split of an input made inside the FP8 cast (fp8::Operand::normed: the norm
  // in front, docs/fp8.md "Fused casts"): the input is never written, and the backward takes an
  // undefined x (its dx is then [N, in], or like dy with the last dim in). Needs
  // fuses_input_operand(): an FP8 linear with FP8 weight gradients, no bias-GELU / gather and no
  // tensor-parallel region to enter (TP 1).
  Tensor forward(const fp8::Operand& x, Saved& saved) const;
  std::vector<Tensor> forward_split(const fp8::Operand& x, Saved& saved,
                                    const OutputSplit& split) const;
  bool fuses_input_operand() const;

  // dy like forward's output -> dx like x (written); accumulates the weight and bias grads.
  // x: the input forward was given. bias_grad_done: the bias gradient was already accumulated
  // (backward_dgelu_bgrad's epilogue), only the weight's is added here.
  Tensor backward(const Tensor& dy, const Tensor& x, Saved& saved, bool bias_grad_done = false,
                  Weight* weight = nullptr);
  // backward of the gradient swiglu_bwd(da, u) with SwiGLU's gradient fused into the FP8 cast
  // of the output gradient (docs/fp8.md "Fused casts"): da [.., out/TP / 2] the gradient of
  // swiglu's output, u [.., out/TP] this layer's output (gate | up); that gradient is never
  // written in the model dtype. Needs fuses_grad_cast(): an FP8 linear with FP8 weight gradients,
  // no bias (its gradient would need the written gradient) and no gather_output.
  Tensor backward_dswiglu(const Tensor& da, const Tensor& u, const Tensor& x, Saved& saved);
  bool fuses_grad_cast() const;
  // d(parts) [N, part_rows[p]] of forward_split -> dx like x (written).
  Tensor backward_split(const std::vector<Tensor>& dparts, const Tensor& x, Saved& saved,
                        const OutputSplit& split);

  const Weight& weight() const { return w_; }
  Weight& weight() { return w_; }
  const Weight& bias() const { return b_; }
  Weight& bias() { return b_; }
  int64_t output_size_per_partition() const { return out_local_; }
  bool fp8() const { return fp8_id_ >= 0; }  // runs its GEMMs in FP8

 private:
  // The input inside the TP region (saved when TP > 1).
  Tensor enter(const Tensor& x, Saved& saved) const;
  // forward_split's FP8 path on the operand x2 (the input viewed [N, in]).
  std::vector<Tensor> fp8_forward_split(const fp8::Operand& x2, Saved& saved,
                                        const OutputSplit& split) const;
  // Rows of `full` [out/TP, ..] regrouped into the parts of `split`, one scratch tensor.
  Tensor regroup(const Tensor& full, const OutputSplit& split) const;
  // grad [out/TP, ..] += the rows of `parts` (regrouped as regroup() lays them out) moved back to
  // their blocks.
  void add_ungrouped(Tensor& grad, const Tensor& parts, const OutputSplit& split) const;
  // The row maps of `split` on the model's device (built once per split): regroup's gather index
  // (part-major row i <- row index[i]) and its inverse. Empty when the split is one block per part
  // in order (regroup is then a copy).
  struct RowMaps {
    std::vector<OutputSplit::Block> blocks;  // the split they were built for
    Tensor to_parts, from_parts;             // i64 [out/TP]
  };
  const RowMaps& row_maps(const OutputSplit& split) const;

  const ModuleContext& ctx_;
  ColumnParallelLinearConfig cfg_;
  int64_t out_local_;
  Weight w_, b_;
  int fp8_id_ = -1;  // the Fp8State id, -1: not an FP8 linear
  mutable RowMaps row_maps_;
};

struct RowParallelLinearConfig {
  int64_t input_size = 0;   // in, the full (unsharded) input size
  int64_t output_size = 0;  // out
  bool bias = true;
  bool input_is_parallel = true;  // x is already [.., in/TP] (else split from a full x)
  bool skip_bias_add = false;     // leave the bias to the caller (bias-dropout-add)
  InitRule init = InitRule::scaled_normal;
};

class RowParallelLinear {
 public:
  struct Saved {
    Fp8Saved fp8;  // an FP8 linear's casts (empty otherwise)
  };
  RowParallelLinear(const ModuleContext& ctx, ParamBuilder& pb, const std::string& name_prefix,
                    const RowParallelLinearConfig& config);

  // x [S, B, in/TP] (or [S, B, in]) -> [S (or S/TP under SP), B, out].
  Tensor forward(const Tensor& x, Saved& saved) const;
  Tensor forward(const Tensor& x) const;  // no backward to follow (inference)
  // dy like forward's output -> dx like x (written); accumulates weight (and bias) grads. x: the
  // input forward was given; saved: what that forward filled (consumed).
  Tensor backward(const Tensor& dy, const Tensor& x, Saved& saved);
  Tensor backward(const Tensor& dy, const Tensor& x);  // not for an FP8 linear
  // forward(swiglu(u)) with SwiGLU fused into the FP8 cast of the input (docs/fp8.md "Fused
  // casts"): u [.., 2 in/TP] (gate | up), the activation never written; its backward takes an
  // undefined x. Needs fuses_input_cast(): an FP8 linear with FP8 weight gradients (which read
  // the FP8 input, not x) and a parallel input.
  Tensor forward_swiglu(const Tensor& u, Saved& saved) const;
  bool fuses_input_cast() const;
  // --fp8-multi-head-attention (docs/fp8.md, Transformer Engine's fp8_mha): forward on an input
  // already in FP8, xq [.., in/TP] fp8_e4m3 with its scale_inv (f32 [1]; the FP8 attention's O at
  // scale_O): no cast and no input amax (this linear's input slot stays unused, as TE's input
  // quantizer under fp8_mha). Its backward takes xq as x: with FP8 weight gradients the transpose
  // they read is made from it then (fp8_transpose); --no-fp8-wgrad needs the model-dtype input
  // instead. Needs an FP8 linear with a parallel input.
  Tensor forward_fp8_input(const Tensor& xq, const Tensor& x_scale_inv, Saved& saved) const;
  // backward() with the data gradient out in FP8 (TE's fp8_grad under fp8_mha): dx [.., in/TP]
  // of dtype dx_scaling.dtype, the dgrad GEMM's f32 result cast at dx_scaling.scale, its amax
  // into dx_scaling.amax (one rounding where backward() rounds to the model dtype first).
  Tensor backward_fp8_dgrad(const Tensor& dy, const Tensor& x, Saved& saved,
                            const fp8::Scaling& dx_scaling);
  // The bias-GELU fusion of an MLP (input_is_parallel, no own bias term in play): x =
  // gelu(pre_activation) of the previous ColumnParallelLinear::forward_bias_gelu. Returns
  // d(pre_activation) = gelu'(pre) * (dy W) [N, in/TP] from the data-gradient GEMM's dgelu_bgrad
  // epilogue, which also accumulates its column sums into dbias_prev (that layer's bias grad;
  // undefined: none); dW += dy^T x.
  Tensor backward_dgelu_bgrad(const Tensor& dy, const Tensor& x, const Tensor& pre_activation,
                              Tensor& dbias_prev, Saved& saved);
  Tensor backward_dgelu_bgrad(const Tensor& dy, const Tensor& x, const Tensor& pre_activation,
                              Tensor& dbias_prev);  // not for an FP8 linear

  const Weight& weight() const { return w_; }
  const Weight& bias() const { return b_; }
  Weight& bias() { return b_; }
  bool fp8() const { return fp8_id_ >= 0; }

 private:
  const ModuleContext& ctx_;
  RowParallelLinearConfig cfg_;
  int64_t in_local_;
  Weight w_, b_;
  int fp8_id_ = -1;
  Tensor backward_impl(const Tensor& dy, const Tensor& x, Saved& saved,
                       const fp8::Scaling* dx_scaling);
};

class VocabParallelEmbedding {
 public:
  // padded_vocab: V_pad, a multiple of TP (TransformerConfig::padded_vocab_size(vocab, TP)).
  // reduce_scatter_embeddings: the output goes to sequence-parallel shards [S/TP, B, H] (needs
  // ctx.sequence_parallel); else it is all-reduced to the full [S, B, H].
  VocabParallelEmbedding(const ModuleContext& ctx, ParamBuilder& pb, const std::string& name,
                         int64_t padded_vocab, int64_t hidden,
                         bool reduce_scatter_embeddings = false);

  // ids [N] i32/i64 in sequence-first order (row n = s B + b), s and b its [S, B] ->
  // [S, B, H] (or [S/TP, B, H]).
  Tensor forward(const Tensor& ids, int64_t s, int64_t b) const;
  // dy like forward's output; accumulates into the weight grad rows of this shard.
  void backward(const Tensor& dy, const Tensor& ids);

  int64_t vocab_start() const { return vocab_start_; }
  int64_t vocab_end() const { return vocab_end_; }
  const Weight& weight() const { return w_; }
  Weight& weight() { return w_; }

 private:
  const ModuleContext& ctx_;
  bool reduce_scatter_;
  int64_t h_, vocab_start_, vocab_end_;
  Weight w_;
};

// Sums over TP the gradients of the parameters marked sequence_parallel (norm weights and
// replicated biases inside sequence-parallel regions), in one coalesced all-reduce. Megatron's
// _allreduce_non_tensor_model_parallel_grads; call once after the last micro-batch's backward.
void all_reduce_sequence_parallel_grads(std::vector<transformer::Parameter>& params,
                                        comm::ProcessGroup& tp);

}  // namespace mg::tensor_parallel
