// finalize_model_grads (Megatron-Core's megatron/core/distributed/finalize_model_grads.py): every
// step between the last micro-batch's backward and the optimizer, in one place, in this order:
//   1. pipelining with tied embeddings: the first stage's word embedding and the last stage's copy
//      get the sum of both gradients over the embedding group (Megatron's
//      _allreduce_word_embedding_grads). Before the data-parallel reduce, unlike Megatron: after a
//      ZeRO reduce-scatter each copy's valid shard lies at a different offset (PITFALLS #4);
//   2. DDP: every bucket's reduction launched and waited for (finish_grad_sync; with
//      --overlap-grad-reduce most were launched during backward);
//   3. sequence parallelism: the gradients of parameters replicated over TP inside the
//      sequence-parallel regions (norms, row-parallel biases) summed over TP (Megatron's
//      _allreduce_non_tensor_model_parallel_grads);
//   4. the loss sums (loss, unmasked tokens) summed over the data-parallel group: the global
//      batch's lm loss for the log, and its token count;
//   5. calculate_per_token_loss: every gradient divided by that global token count (Megatron's
//      scale_gradients(1 / num_tokens)).
// Numerics: each step is the same op as before this function existed; the order above is the order
// the reductions run in.
#pragma once

#include "megatron/core/comm/process_group.h"
#include "megatron/core/common/timer_hook.h"
#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/models/common/language_module.h"

namespace mg::distributed {

// The groups and switches of a layout that finalize_model_grads needs (null / false: absent).
struct FinalizeModelGradsConfig {
  DistributedDataParallel* ddp = nullptr;  // null: no data-parallel wrapping (one rank)
  comm::ProcessGroup* dp_group = nullptr;  // the loss sums' group (dp-cp); null: one rank
  comm::ProcessGroup* tp_group = nullptr;  // with sequence_parallel: step 3
  bool sequence_parallel = false;
  comm::ProcessGroup* embedding_group = nullptr;  // first and last pipeline stage (tied)
  bool calculate_per_token_loss = false;
  // Optional: Megatron's level-1 timers 'embedding-grads-all-reduce' (step 1), 'all-grads-sync'
  // (step 2), 'layernorm-grads-all-reduce' (step 3) (common/timer_hook.h).
  TimerHook* timers = nullptr;
};

// The local loss sums of this rank's micro-batches (the schedule's) summed over `dp_group` (one
// all-reduce of two f64; nothing with one rank).
models::LossSums reduce_loss_sums(const models::LossSums& local, comm::ProcessGroup* dp_group);

// Steps 1-5 above; returns the global batch's loss sums (step 4). Throws under per-token loss when
// the global batch has no unmasked token.
models::LossSums finalize_model_grads(models::LanguageModule& model,
                                      const FinalizeModelGradsConfig& config,
                                      const models::LossSums& local);

}  // namespace mg::distributed
