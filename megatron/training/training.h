// The training loop: Megatron's pretrain / train / train_step / evaluate
// (megatron/training/training.py).
//
// pretrain(args) runs the stages of a run, each its own seam:
//   1. initialize_model_parallel (initialize.h): the run's communicator, Megatron's process groups
//      and pipeline layout; complete_arguments: the flags that depend on the data-parallel size;
//      the runtime and platform (mg::init);
//   2. model_provider (model_provider.h): the model of the flags, this rank's share of it,
//      initialised from --seed;
//   3. distributed::parallelize (core/distributed/parallelize.h): DDP over the gradient buffer,
//      its hooks, the distributed optimizer's shard;
//   4. the optimizer (MegatronOptimizer) and the LR scheduler;
//   5. --load (model; optimizer, scheduler, RNG unless --no-load-optim / --no-load-rng /
//      --finetune; the data position), the start-up summary (parameters, config, platform, layout,
//      op table), train/valid/test datasets (BlendedMegatronDatasetBuilder) and iterators starting
//      at the checkpoint's consumed samples -> train -> validation and test evaluation -> final
//      save.
//
// train_step: zero grads -> get_forward_backward_func's schedule (no pipelining, 1F1B or
// interleaved) over gbs / (mbs * dp) micro-batches (dropout from StepRng{seed, iteration,
// microbatch}; the loss normalisation is the schedules') -> distributed::finalize_model_grads
// (tied-embedding sum, DP reduce, SP sums, the global loss sums, the per-token division) -> NaN
// check -> optimizer step at the scheduler's lr / wd -> scheduler.step(gbs) when the step
// succeeded. A non-finite loss is a nan iteration (Megatron's rule): under fp16 the loss scaler
// skips the step (counted as skipped); in bf16/fp32 the run stops with a message (Megatron's
// --check-for-nan-in-loss-and-grad), or with --no-check-for-nan-in-loss-and-grad the step is
// skipped and counted.
// Exit conditions: --train-iters / --train-samples reached, --exit-interval, --exit-duration-in-
// mins (each saves first when --save is set). Evaluation every --eval-interval iterations on
// --eval-iters batches of the validation split: lm loss and perplexity.
// Determinism: on the CPU a run of N iterations equals N/2 + save + load + N/2 bit for bit.
// --deterministic-mode: the run's Runtime resolves its op table without non-deterministic
// providers (RuntimeOptions::deterministic; no built-in kernel is one), and its NCCL check
// (check_deterministic_mode) runs before any work; two runs are bit-identical
// (docs/architecture.md, "Deterministic mode").
#pragma once

#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/core/models/common/language_module.h"
#include "megatron/training/arguments.h"

namespace mg::training {

// Test hooks (none needed in normal use).
struct PretrainHooks {
  // Called after forward-backward, before the NaN check and the optimizer step; may alter the
  // reported loss and the model's gradients (a test injects NaN here).
  std::function<void(int64_t iteration, double& lm_loss, models::LanguageModule& model)>
      after_forward_backward;
};

struct PretrainResult {
  int64_t iteration = 0;  // the last finished iteration
  int64_t consumed_train_samples = 0;
  std::vector<double> train_losses;  // lm loss of every iteration run by this call
  std::vector<double> grad_norms;    // pre-clip grad norm of every iteration (0 when skipped)
  std::optional<double> valid_loss;  // the last validation lm loss
  std::optional<double> test_loss;
  int64_t skipped_iters = 0;  // over this call
  int64_t nan_iters = 0;
  double train_seconds = 0.0;              // wall time of the training loop
  std::string exit_reason;                 // "train-iters", "exit-interval", "exit-duration", ...
  std::optional<int64_t> saved_iteration;  // the last checkpoint written
};

// Runs everything; writes the log to `log`. Throws mg::Error on any failure.
PretrainResult pretrain(const Arguments& args, std::ostream& log = std::cout,
                        const PretrainHooks& hooks = {});

// --deterministic-mode's check (Megatron's validate_args): with the nccl backend and more than one
// rank, nccl_algo (the NCCL_ALGO variable; null when unset) must be one of Tree, Ring,
// CollnetDirect, CollnetChain or ^NVLS, a fixed algorithm without NVLS's in-switch reductions.
// MPI and the single-rank backend reduce in a fixed order and need nothing.
void check_deterministic_mode(std::string_view backend, int world_size, const char* nccl_algo);

// --attention-backend's choice for one run: the providers of attention_fwd / attention_bwd to
// prefer (RuntimeOptions::op_providers) and the start-up line saying what runs. `fwd` / `bwd`:
// every provider the run's platform has for the two slots; `env`: MG_OP_PROVIDERS' entries, which
// win over the backend for the slots they name. fused needs the cuDNN providers ("cuda:cudnn",
// and "cuda:cudnn-deterministic" for the backward under --deterministic-mode) and is an error
// naming the platform's providers without them; auto prefers them when present; local prefers
// nothing (our kernels rank first); unfused prefers "cuda:attention-rows" where it exists.
struct AttentionBackendChoice {
  std::map<std::string, std::string> providers;
  std::string summary;
};
AttentionBackendChoice choose_attention_backend(const std::string& backend,
                                                std::string_view platform,
                                                const std::vector<std::string>& fwd,
                                                const std::vector<std::string>& bwd,
                                                bool deterministic,
                                                const std::map<std::string, std::string>& env);

}  // namespace mg::training
