// Model parameters as Megatron-Core names them, and the flat buffers that hold them.
//
// Every parameter is a view into one contiguous value buffer (the model dtype: f32, bf16, f16 or
// f64) and its gradient a view into one contiguous gradient buffer ("main_grad": f32 under
// bf16/fp16 mixed precision, else the param dtype). Parameters are laid out in the buffers in
// REVERSE order of first use in forward, so the buffer fills front to back as backward runs (DDP
// buckets later). Optimizers, grad-norm, checkpoints and ZeRO sharding are offset arithmetic over
// these buffers.
//
// Invariants: names are unique and equal Megatron-Core's (FORMATS.md §6, e.g.
// "decoder.layers.3.self_attention.linear_qkv.weight"); `param` and `main_grad` have the same
// shape; a tied output layer has no Parameter of its own (it reads
// embedding.word_embeddings.weight), except on a last pipeline stage without the embedding, which
// holds a replica of it (`shared`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/tensor/tensor.h"

namespace mg::transformer {

struct Parameter {
  std::string name;  // Megatron-Core's name
  Tensor param;      // model weight, a view into ParamAndGradBuffer::params
  Tensor main_grad;  // its gradient, a view into ParamAndGradBuffer::grads (kernels accumulate +=)
  // Megatron's no-weight-decay rule: biases and norm weights (1-D parameters) get no decay.
  bool no_weight_decay = false;
  // Tensor-parallel sharding metadata for later layouts: the partitioned dim of the full tensor
  // (-1: replicated across TP), Megatron's partition_stride, and whether its grad must be summed
  // over the TP group under sequence parallelism (norm weights / biases in SP regions).
  int tensor_parallel_dim = -1;
  int partition_stride = 1;
  bool sequence_parallel = false;
  Shape global_shape;         // the full (unsharded) shape; equals param.shape() on one rank
  int64_t buffer_offset = 0;  // element offset of param (and main_grad) in the flat buffers
  // Megatron's param.shared: a replica of a parameter another pipeline stage owns (the last
  // stage's copy of the tied word embedding, kept equal by summing grads over the embedding
  // group). Skipped by the grad norm and zero counts (counted once, on its owner) and by
  // checkpoints (the owner's copy is the tensor).
  bool shared = false;
  // A routed expert's parameter (Megatron's allreduce = False): its gradient is reduced over the
  // expert-data-parallel group, and the grad norm counts it on every rank of the expert model
  // parallel group (each holds other experts). Its name carries the GLOBAL expert index.
  bool is_expert = false;
  // An expert parameter's shard over the expert-tensor-parallel group (the group its
  // tensor_parallel_dim refers to, instead of the dense TP group): this rank's index and the
  // group's size. A replicated one (linear_fc2.bias) is counted by the grad norm on ETP rank 0.
  int64_t expert_tp_rank = 0;
  int64_t expert_tp_size = 1;
};

// The flat value and gradient buffers (1-D tensors) every Parameter views into.
struct ParamAndGradBuffer {
  Tensor params;  // [P] model dtype
  Tensor grads;   // [P] grad dtype
};

}  // namespace mg::transformer
