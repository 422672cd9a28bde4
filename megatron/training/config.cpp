// validate() of the training loop's configs (config.h).
#include "megatron/training/config.h"

#include <cmath>

#include "megatron/core/common/error.h"

namespace mg::training {

void TrainingConfig::validate() const {
  MG_CHECK(micro_batch_size >= 1, "--micro-batch-size must be >= 1, got " << micro_batch_size);
  MG_CHECK(data_parallel_size >= 1, "data-parallel size must be >= 1, got " << data_parallel_size);
  MG_CHECK(global_batch_size >= 1, "--global-batch-size must be >= 1, got " << global_batch_size);
  MG_CHECK(global_batch_size % (micro_batch_size * data_parallel_size) == 0,
           "--global-batch-size " << global_batch_size << " is not divisible by "
                                  << "--micro-batch-size " << micro_batch_size
                                  << " x data-parallel size " << data_parallel_size);
  MG_CHECK(
      train_iters.has_value() != train_samples.has_value(),
      (train_iters ? "--train-iters " + std::to_string(*train_iters) + " and --train-samples " +
                         std::to_string(*train_samples) + " are both given; use one"
                   : std::string("one of --train-iters or --train-samples is required")));
  if (train_iters) MG_CHECK(*train_iters >= 0, "--train-iters must be >= 0, got " << *train_iters);
  if (train_samples)
    MG_CHECK(*train_samples >= 0, "--train-samples must be >= 0, got " << *train_samples);
  MG_CHECK(eval_interval >= 1, "--eval-interval must be >= 1, got " << eval_interval);
  MG_CHECK(eval_iters >= 0, "--eval-iters must be >= 0, got " << eval_iters);
  if (exit_interval)
    MG_CHECK(*exit_interval >= 1, "--exit-interval must be >= 1, got " << *exit_interval);
  if (exit_duration_in_mins)
    MG_CHECK(*exit_duration_in_mins > 0 && std::isfinite(*exit_duration_in_mins),
             "--exit-duration-in-mins must be > 0, got " << *exit_duration_in_mins);
  MG_CHECK(dataloader_type == "single" || dataloader_type == "cyclic",
           "--dataloader-type '" << dataloader_type << "' is not one of: single, cyclic");
  MG_CHECK(num_workers >= 0 && num_workers <= 64,
           "--num-workers must be in [0, 64], got " << num_workers);
}

int64_t TrainingConfig::total_iters() const {
  return train_iters ? *train_iters : *train_samples / global_batch_size;
}

void CheckpointConfig::validate() const {
  if (save_interval) {
    MG_CHECK(*save_interval >= 1, "--save-interval must be >= 1, got " << *save_interval);
    MG_CHECK(save.has_value(),
             "--save-interval " << *save_interval << " needs --save DIR (where to write)");
  }
  if (save) MG_CHECK(!save->empty(), "--save needs a directory");
  if (load) MG_CHECK(!load->empty(), "--load needs a directory");
  MG_CHECK(!finetune || load.has_value(), "--finetune needs --load DIR (the model to start from)");
  MG_CHECK(ckpt_format == "sharded" || ckpt_format == "legacy",
           "--ckpt-format " << ckpt_format << " is not supported (valid: sharded, legacy)");
  MG_CHECK(!async_save || ckpt_format == "sharded",
           "--async-save needs --ckpt-format sharded, got --ckpt-format " << ckpt_format);
}

void LoggingConfig::validate() const {
  MG_CHECK(log_interval >= 1, "--log-interval must be >= 1, got " << log_interval);
  if (peak_tflops)
    MG_CHECK(*peak_tflops > 0 && std::isfinite(*peak_tflops),
             "--peak-tflops must be > 0, got " << *peak_tflops);
  if (profiling()) {
    const char* flag = profile ? "--profile" : "--profile-op-table";
    MG_CHECK(profile_step_start >= 0,
             flag << ": --profile-step-start must be >= 0, got " << profile_step_start);
    MG_CHECK(profile_step_end > profile_step_start,
             flag << ": --profile-step-end (" << profile_step_end
                  << ") must be greater than --profile-step-start (" << profile_step_start
                  << "): the profiled iterations are [start, end)");
    MG_CHECK(!profile_ranks.empty(), flag << ": --profile-ranks names no rank");
    for (int64_t r : profile_ranks)
      MG_CHECK(r >= 0, flag << ": --profile-ranks " << r << " is not a rank (must be >= 0)");
  }
}

}  // namespace mg::training
