// What a run reports about itself beyond the log line: TensorBoard event files, Megatron's named
// timers, the exit-on-signal handler and the straggler report. Megatron's flag names and defaults
// (megatron/training/arguments.py: _add_logging_args, _add_training_args); add_monitoring_flags
// declares them, validate() names bad values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mg::training {

class ArgParser;

struct MonitoringConfig {
  // ---- TensorBoard (tensorboard.h), written by the last rank ----
  std::optional<std::string> tensorboard_dir;      // --tensorboard-dir: none -> no event file
  int64_t tensorboard_log_interval = 1;            // --tensorboard-log-interval (iterations)
  int64_t tensorboard_queue_size = 1000;           // --tensorboard-queue-size: events in flight
  bool log_timers_to_tensorboard = false;          // --log-timers-to-tensorboard: "<timer>-time"
  bool log_learning_rate_to_tensorboard = true;    // --no-log-learning-rate-to-tensorboard clears
  bool log_loss_scale_to_tensorboard = true;       // --no-log-loss-scale-to-tensorboard clears
  bool log_batch_size_to_tensorboard = false;      // --log-batch-size-to-tensorboard
  bool log_validation_ppl_to_tensorboard = false;  // --log-validation-ppl-to-tensorboard
  bool log_memory_to_tensorboard = false;          // --log-memory-to-tensorboard: mem-*
  bool log_world_size_to_tensorboard = false;      // --log-world-size-to-tensorboard

  // ---- Megatron's timers (timers.h) ----
  int32_t timing_log_level = 0;              // --timing-log-level 0|1|2
  std::string timing_log_option = "minmax";  // --timing-log-option max|minmax|all
  bool barrier_with_l1_time = true;          // --no-barrier-with-level-1-timing clears

  // ---- --exit-signal-handler (signal_handler.h) ----
  bool exit_signal_handler = false;

  // ---- stragglers (straggler.h) ----
  bool log_straggler = false;                 // --log-straggler / --enable-straggler-detection
  bool disable_straggler_on_startup = false;  // --disable-straggler-on-startup
  int32_t straggler_ctrlr_port = 65535;       // --straggler-ctrlr-port (see straggler.h)
  int32_t straggler_minmax_count = 1;         // --straggler-minmax-count

  void validate() const;
  // The TensorBoard switches given without --tensorboard-dir (Megatron ignores them silently; the
  // run prints a warning naming them).
  std::vector<std::string> tensorboard_switches_without_dir() const;
};

// Declares the flags above on `p`, bound to `c`; also the --wandb-* flags, which are refused.
void add_monitoring_flags(ArgParser& p, MonitoringConfig& c);

}  // namespace mg::training
