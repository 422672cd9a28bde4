// Flags and checks of MonitoringConfig (monitoring_config.h).
#include "megatron/training/monitoring_config.h"

#include "megatron/core/common/error.h"
#include "megatron/training/arg_parser.h"

namespace mg::training {

void add_monitoring_flags(ArgParser& p, MonitoringConfig& c) {
  p.add("--tensorboard-dir", c.tensorboard_dir,
        "write TensorBoard event files (scalars) into this directory (last rank)");
  p.add("--tensorboard-log-interval", c.tensorboard_log_interval,
        "iterations between TensorBoard scalars (1)");
  p.add("--tensorboard-queue-size", c.tensorboard_queue_size,
        "TensorBoard events queued for the writer thread before add_scalar waits (1000)");
  p.add_switch("--log-timers-to-tensorboard", c.log_timers_to_tensorboard, true,
               "write the timers (--timing-log-level) to TensorBoard as '<name>-time'");
  p.add_switch("--no-log-learning-rate-to-tensorboard", c.log_learning_rate_to_tensorboard, false,
               "do not write learning-rate to TensorBoard");
  p.add_switch("--no-log-loss-scale-to-tensorboard", c.log_loss_scale_to_tensorboard, false,
               "do not write loss-scale to TensorBoard");
  p.add_switch("--log-batch-size-to-tensorboard", c.log_batch_size_to_tensorboard, true,
               "write batch-size to TensorBoard");
  p.add_switch("--log-validation-ppl-to-tensorboard", c.log_validation_ppl_to_tensorboard, true,
               "write the validation perplexity to TensorBoard");
  p.add_switch("--log-memory-to-tensorboard", c.log_memory_to_tensorboard, true,
               "write the device memory statistics (mem-*) to TensorBoard");
  p.add_switch("--log-world-size-to-tensorboard", c.log_world_size_to_tensorboard, true,
               "write world-size to TensorBoard");
  for (const char* f :
       {"--wandb-project", "--wandb-exp-name", "--wandb-save-dir", "--wandb-entity"})
    p.add(
        f, ArgParser::Nargs::one,
        [f](const std::vector<std::string>& v) {
          MG_THROW(f << " " << v[0]
                     << ": Weights & Biases logging is not available in Megatron-CPP (there is no "
                        "wandb client and no service to reach); use --tensorboard-dir DIR, whose "
                        "event files TensorBoard reads");
        },
        "refused: no Weights & Biases client here (use --tensorboard-dir)");
  p.add("--timing-log-level", c.timing_log_level,
        "timers to measure: 0 (iteration time), 1 (+ forward-backward, grads sync, optimizer), "
        "2 (+ forward/backward compute, batch generator, pipeline p2p)");
  p.add_choice(
      "--timing-log-option", {"max", "minmax", "all"},
      [&c](const std::string& v) { c.timing_log_option = v; },
      "timer report across ranks: max, minmax (default) or all");
  p.add_switch("--no-barrier-with-level-1-timing", c.barrier_with_l1_time, false,
               "no barrier before the level-1 timers start");
  p.add_switch("--exit-signal-handler", c.exit_signal_handler, true,
               "on SIGTERM/SIGINT finish the iteration, save a checkpoint and exit 0 (all ranks)");
  p.add_switch("--log-straggler", c.log_straggler, true,
               "gather every rank's step time and throughput at the log interval; name the "
               "slowest");
  p.add_switch("--enable-straggler-detection", c.log_straggler, true, "same as --log-straggler");
  p.add_switch("--disable-straggler-on-startup", c.disable_straggler_on_startup, true,
               "start the straggler report off (--log-straggler)");
  p.add("--straggler-ctrlr-port", c.straggler_ctrlr_port,
        "port of Megatron's straggler on/off HTTP toggle (65535; not served here)");
  p.add("--straggler-minmax-count", c.straggler_minmax_count,
        "slowest and fastest ranks to name (1)");
}

void MonitoringConfig::validate() const {
  if (tensorboard_dir) MG_CHECK(!tensorboard_dir->empty(), "--tensorboard-dir is empty");
  MG_CHECK(tensorboard_log_interval >= 1,
           "--tensorboard-log-interval must be >= 1, got " << tensorboard_log_interval);
  MG_CHECK(tensorboard_queue_size >= 1,
           "--tensorboard-queue-size must be >= 1, got " << tensorboard_queue_size);
  MG_CHECK(timing_log_level >= 0 && timing_log_level <= 2,
           "--timing-log-level must be 0, 1 or 2, got " << timing_log_level);
  MG_CHECK(straggler_minmax_count >= 1,
           "--straggler-minmax-count must be >= 1, got " << straggler_minmax_count);
  MG_CHECK(straggler_ctrlr_port >= 1 && straggler_ctrlr_port <= 65535,
           "--straggler-ctrlr-port must be in 1..65535, got " << straggler_ctrlr_port);
}

std::vector<std::string> MonitoringConfig::tensorboard_switches_without_dir() const {
  std::vector<std::string> out;
  if (tensorboard_dir) return out;
  if (log_timers_to_tensorboard) out.emplace_back("--log-timers-to-tensorboard");
  if (log_batch_size_to_tensorboard) out.emplace_back("--log-batch-size-to-tensorboard");
  if (log_validation_ppl_to_tensorboard) out.emplace_back("--log-validation-ppl-to-tensorboard");
  if (log_memory_to_tensorboard) out.emplace_back("--log-memory-to-tensorboard");
  if (log_world_size_to_tensorboard) out.emplace_back("--log-world-size-to-tensorboard");
  return out;
}

}  // namespace mg::training
