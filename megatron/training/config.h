// The training loop's own configs: TrainingConfig (batches, iterations, evaluation, exit
// conditions, seed), CheckpointConfig (save/load flags) and LoggingConfig (log interval, peak
// FLOP/s for MFU). Plain structs with Megatron's flag names and defaults; validate() throws naming
// the offending values. The model, optimizer, scheduler, data and tokenizer configs are their
// components' own (see arguments.h, which parses flags into all of them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mg::training {

struct TrainingConfig {
  int64_t micro_batch_size = 0;   // --micro-batch-size, required (samples per micro-batch)
  int64_t global_batch_size = 0;  // --global-batch-size; 0 -> micro_batch_size * dp
  int64_t data_parallel_size =
      1;  // world / (tp * pp * cp), set by complete_arguments (initialize.h)
  // Exactly one of --train-iters / --train-samples (samples: iterations = samples / gbs).
  std::optional<int64_t> train_iters;
  std::optional<int64_t> train_samples;
  int64_t eval_interval = 1000;          // --eval-interval (iterations); evaluate every this many
  int64_t eval_iters = 100;              // --eval-iters (iterations of gbs samples per evaluation)
  bool skip_train = false;               // --skip-train: evaluate only
  std::optional<int64_t> exit_interval;  // --exit-interval: stop when iteration % N == 0
  std::optional<double> exit_duration_in_mins;  // --exit-duration-in-mins: stop after this time
  uint64_t seed = 1234;                         // --seed (data order, init, dropout)
  // --no-check-for-nan-in-loss-and-grad clears it: a NaN loss (bf16/fp32) then skips the step
  // and counts a nan iteration instead of stopping the run.
  bool check_for_nan_in_loss_and_grad = true;
  // --dataloader-type: "single" (Megatron's MegatronPretrainingSampler: one pass in order) or
  // "cyclic" (MegatronPretrainingRandomSampler: a per-epoch permutation, endless); train split.
  std::string dataloader_type = "single";
  // --num-workers: data-loader threads collating micro-batches ahead of the training thread
  // (Megatron's DataLoader workers); 0 collates on the training thread. Megatron's default 2.
  int64_t num_workers = 2;

  void validate() const;
  // gbs / (mbs * dp); validate() guarantees it divides.
  int64_t num_microbatches() const {
    return global_batch_size / (micro_batch_size * data_parallel_size);
  }
  // --train-iters, or --train-samples / gbs.
  int64_t total_iters() const;
};

struct CheckpointConfig {
  std::optional<std::string> save;       // --save DIR
  std::optional<int64_t> save_interval;  // --save-interval N (iterations)
  std::optional<std::string> load;       // --load DIR
  bool no_save_optim = false;            // --no-save-optim: no optimizer state, no scheduler
  bool no_save_rng = false;              // --no-save-rng
  bool no_load_optim = false;            // --no-load-optim
  bool no_load_rng = false;              // --no-load-rng
  bool finetune = false;                 // --finetune: load the model only; iteration starts at 0
  bool exit_on_missing_checkpoint = false;  // --exit-on-missing-checkpoint
  // Checkpoint format (checkpointing.h): --ckpt-format sharded (resharding, default) | legacy
  // (the previous same-layout files); --auto-detect-ckpt-format loads either; --async-save writes
  // from a background thread after a host copy (sharded only).
  std::string ckpt_format = "sharded";
  bool auto_detect_ckpt_format = false;
  bool async_save = false;
  // Per-tensor XXH3-64 checksums written at save and verified at load (--no-ckpt-checksum: off).
  bool ckpt_checksum = true;
  // --allow-ckpt-model-mismatch: a --load whose recorded model flags differ from this run's only
  // warns (default: an error naming both values; reliability.h checkpoint_model_mismatches).
  bool allow_ckpt_model_mismatch = false;

  void validate() const;
};

struct LoggingConfig {
  int64_t log_interval = 100;         // --log-interval (iterations)
  std::optional<double> peak_tflops;  // --peak-tflops: MFU denominator per device; unset ->
                                      // 989 on H100/H200 (dense bf16), none elsewhere
  bool log_params_norm = false;       // --log-params-norm
  // Megatron's --profile: on the ranks of --profile-ranks, iterations [profile_step_start,
  // profile_step_end) (0-based: the steps numbered start + 1 .. end in the log) run inside the
  // platform's capture range with a named range around every op (CUDA: cudaProfilerStart / Stop
  // and NVTX, for nsys --capture-range=cudaProfilerApi). --profile-op-table (ours) times every op
  // of the same steps and prints the table (docs/profiling.md).
  bool profile = false;
  bool profile_op_table = false;
  int64_t profile_step_start = 10;
  int64_t profile_step_end = 12;
  std::vector<int64_t> profile_ranks{0};
  bool profiling() const { return profile || profile_op_table; }
  // --moe-per-layer-logging: each MoE layer's load-balancing / z loss and tokens per expert on the
  // log line's following lines, and Megatron's moe/<name>_layer_<l> TensorBoard scalars.
  bool moe_per_layer_logging = false;
  void validate() const;
};

}  // namespace mg::training
