// Forward-backward schedules (megatron/core/pipeline_parallel/schedules.py), chosen like Megatron's
// get_forward_backward_func:
//   * no pipelining: every micro-batch runs forward then backward on the whole model, gradients
//     accumulate in the model's main_grad buffer;
//   * 1F1B (forward_backward_pipelining_without_interleaving): warm-up of PP - rank - 1 forwards,
//     steady state of one forward + one backward, cool-down of the remaining backwards; a stage
//     holds at most min(PP - rank, M) micro-batches of activations;
//   * interleaved 1F1B (forward_backward_pipelining_with_interleaving): each rank holds V model
//     chunks (virtual stages v * PP + rank); Megatron's schedule table (groups of PP micro-batches
//     per chunk), warm-up (PP - rank - 1) * 2 + (V - 1) * PP, then 1F1B over virtual
//     micro-batches; M must be a multiple of PP (Megatron's microbatch group rule).
// The order of each rank is a plain table (schedule_1f1b / schedule_interleaved: tests compare it
// with tables worked out by hand); run_pipeline_schedule executes one with p2p over the pipeline
// group (p2p_communication.h): hidden states [S(/TP under SP), B, H] forward, their gradients
// backward, receives posted one step ahead (overlapping the compute), sends non-blocking; a peer
// that never answers ends in the group's collective timeout, never a silent hang.
//
// The schedules take any model through the LanguageModule interface
// (models/common/language_module.h); they know nothing of GPT.
//
// Loss semantics are Megatron's, decided in one place (loss_backward_seed below):
//  * default: micro-batch i contributes loss_sum_i / num_tokens_i / num_microbatches to the
//    objective (its mean loss, averaged over micro-batches);
//  * calculate_per_token_loss: each micro-batch contributes loss_sum_i; the gradients are divided
//    by the global token count afterwards, once, by distributed::finalize_model_grads (Megatron's
//    finalize_model_grads(num_tokens)); the objective is the token mean of the whole batch.
//  * the reported "lm loss" is sum_i loss_sum_i / sum_i num_tokens_i in both cases (what
//    train_step logs). With pipelining the loss is computed on the last stage and its sums are
//    summed over the pipeline group, so every stage returns the same lm_loss / loss_sum /
//    num_tokens (microbatches is filled on the last stage only).
// loss_scale (the fp16 dynamic scale) multiplies every backward seed; unscaling is the optimizer's.
// The schedules never touch the gradients after backward: everything after the last backward
// (data-parallel reduction, tied-embedding and sequence-parallel sums, the per-token division) is
// finalize_model_grads'.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/common/timer_hook.h"
#include "megatron/core/models/common/language_module.h"

namespace mg::pipeline_parallel {

struct ForwardBackwardConfig {
  bool calculate_per_token_loss = false;
  double loss_scale = 1.0;    // multiplies the loss before backward (fp16 grad scaler)
  bool forward_only = false;  // evaluation: no backward, no dropout
  // Megatron's no_sync_func: called before each micro-batch's backward with whether it is the
  // last one (DDP then launches bucket reductions from the grad-ready hook only in that backward).
  // Not called by the pipelined schedules (the caller keeps DDP's launches for finish_grad_sync).
  std::function<void(bool is_last_microbatch)> set_is_last_microbatch;

  // Pipelining: the pipeline group (null or size 1: no pipelining) and the micro-batch's
  // sequence length and size (the p2p shapes are known ahead, as in Megatron).
  comm::ProcessGroup* pp_group = nullptr;
  int64_t seq_length = 0;
  int64_t micro_batch_size = 0;
  // Optional: bytes in use on the model's device (the allocator's), sampled after every forward
  // to report the peak activation memory of this stage (ForwardBackwardResult).
  std::function<int64_t()> memory_in_use;
  // Optional: Megatron's timers 'forward-compute' and 'backward-compute' (level 2) around each
  // chunk's forward and backward (common/timer_hook.h).
  TimerHook* timers = nullptr;
};

struct ForwardBackwardResult {
  double lm_loss = 0.0;     // sum of loss sums / sum of token counts (what Megatron logs)
  double loss_sum = 0.0;    // sum over micro-batches of sum(loss * mask)
  double num_tokens = 0.0;  // sum over micro-batches of sum(mask)
  std::vector<models::LossSums> microbatches;
  // Pipelined schedules: the most micro-batches (of any chunk) whose activations this rank held
  // at once, and the peak of memory_in_use() above its value at the start (0 without it).
  int64_t max_in_flight = 0;
  int64_t peak_activation_bytes = 0;
};

// Returns the next micro-batch (called num_microbatches times, in order).
using NextBatchFn = std::function<models::Batch()>;

// Megatron's loss normalisation, the one place it is decided: the weight backward gives every
// masked token's loss of a micro-batch with num_tokens unmasked tokens: loss_scale, divided by
// num_tokens * num_microbatches unless calculate_per_token_loss (throws when that micro-batch has
// no unmasked token).
double loss_backward_seed(const ForwardBackwardConfig& config, double num_tokens,
                          int64_t num_microbatches, int64_t microbatch);
// The scale of the MoE auxiliary losses' gradients (Megatron's MoEAuxLossAutoScaler): the seed
// without the token division, loss_scale * cp_size / num_microbatches (loss_scale under per-token
// loss). cp_size (--context-parallel-size): the gradients are averaged over dp-cp while each CP
// rank's aux-loss gradient is already its share of the whole sequence's (Megatron's fix of
// NVIDIA/Megatron-LM#2217).
double aux_loss_scale(const ForwardBackwardConfig& config, int64_t num_microbatches,
                      int64_t cp_size = 1);

// Runs num_microbatches micro-batches through `model` (one chunk holding the whole model);
// micro-batch i uses StepRng{rng.seed, rng.iteration, i}. Gradients accumulate (+=) into the
// model's main_grad buffer: zero it first at the start of an iteration.
ForwardBackwardResult forward_backward_no_pipelining(models::LanguageModule& model,
                                                     const NextBatchFn& next_batch,
                                                     int64_t num_microbatches,
                                                     const ForwardBackwardConfig& config,
                                                     const models::StepRng& rng);

// 1F1B over config.pp_group; `model` holds this rank's one chunk. Every rank of the pipeline
// calls next_batch num_microbatches times (the first stage uses the tokens, the last the labels,
// every stage the position and document ids).
ForwardBackwardResult forward_backward_pipelining_without_interleaving(
    models::LanguageModule& model, const NextBatchFn& next_batch, int64_t num_microbatches,
    const ForwardBackwardConfig& config, const models::StepRng& rng);

// Interleaved 1F1B; `model` holds this rank's model.num_chunks() >= 2 chunks.
ForwardBackwardResult forward_backward_pipelining_with_interleaving(
    models::LanguageModule& model, const NextBatchFn& next_batch, int64_t num_microbatches,
    const ForwardBackwardConfig& config, const models::StepRng& rng);

using ForwardBackwardFunc = ForwardBackwardResult (*)(models::LanguageModule&, const NextBatchFn&,
                                                      int64_t, const ForwardBackwardConfig&,
                                                      const models::StepRng&);
// Megatron's get_forward_backward_func: PP 1 -> no pipelining; PP > 1 with a virtual pipeline
// size > 1 -> interleaved; else 1F1B.
ForwardBackwardFunc get_forward_backward_func(int pipeline_model_parallel_size,
                                              int virtual_pipeline_model_parallel_size);

// ---- Schedule tables -----------------------------------------------------------------------

enum class Pass : uint8_t { forward, backward };
struct ScheduleStep {
  Pass pass;
  int64_t microbatch;
  int chunk;  // model chunk (virtual stage chunk * PP + rank); 0 without interleaving
  bool operator==(const ScheduleStep&) const = default;
};
// "F0 F1 B0 ..." (1F1B) or "F0.0 F1.0 ..." (microbatch.chunk) when with_chunks.
std::string schedule_str(const std::vector<ScheduleStep>& steps, bool with_chunks);

// The order in which pipeline rank pp_rank of pp_size runs its forward and backward passes in
// Megatron's 1F1B schedule (forward_only: all forwards).
std::vector<ScheduleStep> schedule_1f1b(int pp_size, int pp_rank, int64_t num_microbatches,
                                        bool forward_only);
// The same for the interleaved schedule with vp_size chunks per rank (Megatron's schedule table
// with microbatch_group_size_per_vp_stage = pp_size). Validates num_microbatches
// (check_interleaved_microbatches).
std::vector<ScheduleStep> schedule_interleaved(int pp_size, int pp_rank, int vp_size,
                                               int64_t num_microbatches, bool forward_only);
// Megatron's rule for interleaving: num_microbatches must be a multiple of the pipeline size
// (groups of PP contiguous micro-batches per virtual stage). Throws naming the values.
void check_interleaved_microbatches(int pp_size, int64_t num_microbatches);

// ---- Execution ------------------------------------------------------------------------------

// What a schedule step runs on this rank. forward(chunk, microbatch, input) returns the chunk's
// output hidden states (undefined on the last virtual stage); input is undefined on the first
// virtual stage. backward(chunk, microbatch, output_grad) returns the input gradient (undefined on
// the first virtual stage); output_grad is undefined on the last virtual stage.
struct StageFunctions {
  std::function<Tensor(int chunk, int64_t microbatch, const Tensor& input)> forward;
  std::function<Tensor(int chunk, int64_t microbatch, const Tensor& output_grad)> backward;
};

struct PipelineRunStats {
  int64_t max_in_flight = 0;  // micro-batches forwarded and not yet backwarded, at most
  int64_t peak_bytes = 0;     // memory_in_use peak above its start value
};

// Runs `steps` (this rank's table) with num_chunks chunks per rank over pp_group (size > 1):
// receives hidden states / gradients of `shape` and `dtype` from the neighbouring stages, sends
// the outputs on. Every rank of the group runs its own table of the same schedule.
PipelineRunStats run_pipeline_schedule(const std::vector<ScheduleStep>& steps, int num_chunks,
                                       comm::ProcessGroup& pp_group, const Shape& shape,
                                       DType dtype, Device device, const StageFunctions& fns,
                                       const std::function<int64_t()>& memory_in_use = {});

}  // namespace mg::pipeline_parallel
