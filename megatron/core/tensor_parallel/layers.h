// Tensor-parallel layers (Megatron's tensor_parallel/layers.py) with explicit forward/backward:
//
//   ColumnParallelLinear   weight [out/TP, in] (rows of the full [out, in]), bias [out/TP].
//                          x -> copy_to_tp (or, sequence parallel, all-gather of the S shards) ->
//                          x W_r^T + b_r [S, B, out/TP] -> (gather_output: all-gather last dim)
//   RowParallelLinear      weight [out, in/TP] (columns), bias [out] replicated.
//                          x [.., in/TP] (or split from a full x) -> x W_r^T -> all-reduce (or,
//                          sequence parallel, reduce-scatter to S shards) -> + b
//   VocabParallelEmbedding weight [V_pad/TP, H] (rows [vocab_start, vocab_end)); lookup with 0
//                          for ids of other shards -> all-reduce (or reduce-scatter under SP)
//
// Activations are sequence-first [S, B, ...]; under sequence parallelism the non-TP regions hold
// [S/TP, B, H]. Parameters are declared through a ParamBuilder as shards of the full tensor
// (Partition in sharding.h; global_shape, tensor_parallel_dim, partition_stride recorded), so init
// and checkpoints see Megatron's global layouts. Under sequence parallelism the replicated
// row-parallel bias is marked sequence_parallel: its gradient is a partial sum on each rank and
// all_reduce_sequence_parallel_grads() must sum it over TP before the optimizer (PITFALLS #3).
//
// Gradient rule: parameter gradients accumulate (+=), activation gradients are written (=).
// Each layer's Saved holds the (gathered) input it needs for the weight gradient.
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
  bool gather_output = false;      // all-gather the output's last dim (else [.., out/TP])
  bool sequence_parallel = false;  // input is [S/TP, B, in]: all-gathered along S first
  int partition_stride = 1;        // 2 for SwiGLU's [gate; up] fc1 (FORMATS.md §6.3)
  InitRule init = InitRule::normal;
};

class ColumnParallelLinear {
 public:
  struct Saved {
    Tensor input;  // [N, in], gathered along S under sequence parallelism
  };
  // name_prefix: "decoder.layers.0.mlp.linear_fc1." -> ".weight", ".bias".
  ColumnParallelLinear(const ModuleContext& ctx, ParamBuilder& pb, const std::string& name_prefix,
                       const ColumnParallelLinearConfig& config, comm::ProcessGroup& tp);

  // x [S (or S/TP), B, in] -> [S, B, out/TP] (or [S, B, out] with gather_output).
  Tensor forward(const Tensor& x, Saved& saved) const;
  // dy like forward's output -> dx like x (written); accumulates weight and bias grads.
  Tensor backward(const Tensor& dy, Saved& saved);

  const Weight& weight() const { return w_; }
  const Weight& bias() const { return b_; }
  int64_t output_size_per_partition() const { return out_local_; }

 private:
  const ModuleContext& ctx_;
  ColumnParallelLinearConfig cfg_;
  comm::ProcessGroup& tp_;
  int64_t out_local_;
  Weight w_, b_;
};

struct RowParallelLinearConfig {
  int64_t input_size = 0;   // in, the full (unsharded) input size
  int64_t output_size = 0;  // out
  bool bias = true;
  bool input_is_parallel = true;   // x is already [.., in/TP] (else split from a full x)
  bool sequence_parallel = false;  // output reduce-scattered to [S/TP, B, out]
  bool skip_bias_add = false;      // leave the bias to the caller (bias-dropout-add)
  InitRule init = InitRule::scaled_normal;
};

class RowParallelLinear {
 public:
  struct Saved {
    Tensor input;  // [N, in/TP]
  };
  RowParallelLinear(const ModuleContext& ctx, ParamBuilder& pb, const std::string& name_prefix,
                    const RowParallelLinearConfig& config, comm::ProcessGroup& tp);

  // x [S, B, in/TP] (or [S, B, in]) -> [S (or S/TP under SP), B, out].
  Tensor forward(const Tensor& x, Saved& saved) const;
  // dy like forward's output -> dx like x (written); accumulates weight (and bias) grads.
  Tensor backward(const Tensor& dy, Saved& saved);

  const Weight& weight() const { return w_; }
  const Weight& bias() const { return b_; }
  Weight& bias() { return b_; }

 private:
  const ModuleContext& ctx_;
  RowParallelLinearConfig cfg_;
  comm::ProcessGroup& tp_;
  int64_t in_local_;
  Weight w_, b_;
};

class VocabParallelEmbedding {
 public:
  // padded_vocab: V_pad, a multiple of TP (TransformerConfig::padded_vocab_size(vocab, TP)).
  // reduce_scatter_embeddings: the output goes to sequence-parallel shards [S/TP, B, H].
  VocabParallelEmbedding(const ModuleContext& ctx, ParamBuilder& pb, const std::string& name,
                         int64_t padded_vocab, int64_t hidden, comm::ProcessGroup& tp,
                         bool reduce_scatter_embeddings = false);

  // ids [N] i32/i64 in sequence-first order (row n = s B + b), s and b its [S, B] ->
  // [S, B, H] (or [S/TP, B, H]).
  Tensor forward(const Tensor& ids, int64_t s, int64_t b) const;
  // dy like forward's output; accumulates into the weight grad rows of this shard.
  void backward(const Tensor& dy, const Tensor& ids);

  int64_t vocab_start() const { return vocab_start_; }
  int64_t vocab_end() const { return vocab_end_; }
  const Weight& weight() const { return w_; }

 private:
  const ModuleContext& ctx_;
  comm::ProcessGroup& tp_;
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
