// Forward-backward schedules (megatron/core/pipeline_parallel/schedules.py). Only the
// no-pipelining schedule today: every micro-batch runs forward then backward, gradients accumulate
// in the model's main_grad buffer.
//
// Loss semantics are Megatron's:
//  * default: micro-batch i contributes loss_sum_i / num_tokens_i / num_microbatches to the
//    objective (its mean loss, averaged over micro-batches);
//  * calculate_per_token_loss: each micro-batch contributes loss_sum_i, and at the end the
//    gradients are divided by the total token count sum_i num_tokens_i (Megatron's
//    finalize_model_grads(num_tokens)); the objective is the token mean of the whole batch.
//  * the reported "lm loss" is sum_i loss_sum_i / sum_i num_tokens_i in both cases (what
//    train_step logs).
// loss_scale (the fp16 dynamic scale) multiplies every backward seed; unscaling is the optimizer's.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "megatron/core/models/gpt/gpt_model.h"

namespace mg::pipeline_parallel {

struct ForwardBackwardConfig {
  bool calculate_per_token_loss = false;
  double loss_scale = 1.0;    // multiplies the loss before backward (fp16 grad scaler)
  bool forward_only = false;  // evaluation: no backward, no dropout
  // Divide the grads by the total token count at the end under calculate_per_token_loss. Turn it
  // off when the caller reduces token counts across data-parallel ranks first and scales itself.
  bool finalize_per_token_grads = true;
  // Megatron's no_sync_func: called before each micro-batch's backward with whether it is the
  // last one (DDP then launches bucket reductions from the grad-ready hook only in that backward).
  std::function<void(bool is_last_microbatch)> set_is_last_microbatch;
};

struct ForwardBackwardResult {
  double lm_loss = 0.0;     // sum of loss sums / sum of token counts (what Megatron logs)
  double loss_sum = 0.0;    // sum over micro-batches of sum(loss * mask)
  double num_tokens = 0.0;  // sum over micro-batches of sum(mask)
  std::vector<models::LossSums> microbatches;
};

// Returns the next micro-batch (called num_microbatches times, in order).
using NextBatchFn = std::function<models::GPTBatch()>;

// Runs num_microbatches micro-batches through `model`; micro-batch i uses StepRng{rng.seed,
// rng.iteration, i}. Gradients accumulate (+=) into the model's main_grad buffer: zero it first
// (model.zero_grad()) at the start of an iteration.
ForwardBackwardResult forward_backward_no_pipelining(models::GPTModel& model,
                                                     const NextBatchFn& next_batch,
                                                     int64_t num_microbatches,
                                                     const ForwardBackwardConfig& config,
                                                     const models::StepRng& rng);

}  // namespace mg::pipeline_parallel
