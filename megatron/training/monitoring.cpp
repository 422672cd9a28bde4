// The training loop's monitoring hooks: TensorBoard, timers, signals, stragglers (monitoring.h).
#include "megatron/training/monitoring.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "megatron/core/common/error.h"
#include "megatron/runtime.h"

namespace mg::training {
namespace {

// "--log-interval" -> "log_interval" (Megatron's args attribute names).
std::string arg_name(const std::string& flag) {
  std::string s = flag.substr(flag.rfind("--", 0) == 0 ? 2 : 0);
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

}  // namespace

Monitoring::Monitoring(const Arguments& args, comm::ProcessGroupPtr world, Runtime& rt,
                       std::ostream& log)
    : args_(args), world_(std::move(world)), rt_(rt) {
  const MonitoringConfig& m = args.monitoring;
  const int rank = world_ ? world_->rank() : 0;
  const int size = world_ ? world_->size() : 1;
  plugin::Platform* platform = rt.platform;
  const int device = rt.device.index;
  timers_ = std::make_unique<MegatronTimers>(m.timing_log_level, m.timing_log_option,
                                             [platform, device] { platform->synchronize(device); });
  straggler_ = std::make_unique<StragglerDetector>(
      m.log_straggler && !m.disable_straggler_on_startup, m.straggler_minmax_count, rank);
  if (m.exit_signal_handler) signals_ = std::make_unique<DistributedSignalHandler>();
  const auto unused = m.tensorboard_switches_without_dir();
  for (const auto& f : unused)
    log << "WARNING: " << f << " has no effect without --tensorboard-dir" << std::endl;
  if (m.tensorboard_dir) {
    // Megatron's writer lives on the last rank only.
    if (rank == size - 1) {
      tb_ = std::make_unique<tensorboard::SummaryWriter>(*m.tensorboard_dir,
                                                         m.tensorboard_queue_size);
      // write_args_to_tensorboard: the flags as text, at the start iteration (0 here; a resumed
      // run writes them again at its own start, which TensorBoard shows as a later step).
      for (const auto& [flag, values] : args.given) {
        std::string text;
        for (const auto& v : values) text += (text.empty() ? "" : " ") + v;
        tb_->add_text(arg_name(flag), values.empty() ? "True" : text, 0);
      }
    }
    log << "tensorboard: writing to " << *m.tensorboard_dir << " (rank " << size - 1 << "), every "
        << m.tensorboard_log_interval << " iteration(s)" << std::endl;
  }
  if (m.timing_log_level > 0)
    log << "timers: --timing-log-level " << m.timing_log_level << ", --timing-log-option "
        << m.timing_log_option << std::endl;
  if (m.exit_signal_handler)
    log << "exit signal handler: on SIGTERM or SIGINT the ranks finish the iteration, "
        << (args.checkpoint.save ? "save to " + *args.checkpoint.save + ", " : std::string())
        << "and exit 0" << std::endl;
  for (const auto& [flag, values] : args.given)
    if (flag == "--straggler-ctrlr-port")
      log << "--straggler-ctrlr-port " << m.straggler_ctrlr_port
          << ": no effect here (Megatron's HTTP on/off toggle of the straggler report is not "
             "served; the report follows --log-straggler / --disable-straggler-on-startup)"
          << std::endl;
  if (m.log_straggler) {
    if (m.disable_straggler_on_startup)
      log << "straggler detection: off (--disable-straggler-on-startup); Megatron turns it on "
             "through its HTTP toggle (--straggler-ctrlr-port), which is not served here, so "
             "this run prints no straggler report"
          << std::endl;
    else
      log << "straggler detection: every rank's compute time and throughput at each log "
             "interval; the "
          << m.straggler_minmax_count << " slowest named" << std::endl;
  }
}

Monitoring::~Monitoring() = default;

void Monitoring::start_forward_backward() {
  if (timers_->active(1) && args_.monitoring.barrier_with_l1_time && world_ && world_->size() > 1)
    world_->barrier();
  timers_->start("forward-backward", 1);
}

void Monitoring::after_iteration(const IterationScalars& s, int64_t iters_since_log) {
  const MonitoringConfig& m = args_.monitoring;
  if (!m.tensorboard_dir || s.iteration % m.tensorboard_log_interval != 0) return;
  // Megatron's timers.write: every rank takes part; the writer (last rank) records.
  std::vector<std::pair<std::string, double>> timer_values;
  if (m.log_timers_to_tensorboard)
    timer_values = timers_->max_times(megatron_timers_to_log(),
                                      static_cast<double>(std::max<int64_t>(1, iters_since_log)),
                                      world_.get(), /*reset=*/false);
  if (!tb_) return;
  const int64_t it = s.iteration, smp = s.consumed_samples;
  for (const auto& [name, v] : timer_values) tb_->add_scalar(name + "-time", v, it);
  auto both = [&](const std::string& tag, double v) {
    tb_->add_scalar(tag, v, it);
    tb_->add_scalar(tag + " vs samples", v, smp);
  };
  if (m.log_learning_rate_to_tensorboard) both("learning-rate", s.learning_rate);
  if (m.log_batch_size_to_tensorboard) both("batch-size", static_cast<double>(s.batch_size));
  both("lm loss", s.lm_loss);
  if (m.log_loss_scale_to_tensorboard) both("loss-scale", s.loss_scale);
  if (m.log_world_size_to_tensorboard)
    both("world-size", static_cast<double>(world_ ? world_->size() : 1));
  if (s.grad_norm) both("grad-norm", *s.grad_norm);
  if (s.num_zeros) both("num-zeros", static_cast<double>(*s.num_zeros));
  if (m.log_memory_to_tensorboard) {
    const auto st = rt_.platform->memory_stats(rt_.device.index);
    tb_->add_scalar("mem-reserved-bytes", static_cast<double>(st.reserved_bytes), it);
    tb_->add_scalar("mem-allocated-bytes", static_cast<double>(st.allocated_bytes), it);
    tb_->add_scalar("mem-max-allocated-bytes", static_cast<double>(st.peak_allocated_bytes), it);
    tb_->add_scalar("mem-allocated-count", static_cast<double>(st.num_allocs - st.num_frees), it);
  }
}

void Monitoring::at_log_interval(int64_t iteration, int64_t iters, double seconds_per_iteration,
                                 double flops_per_iteration, std::ostream& out_last,
                                 std::ostream& out_first) {
  const MonitoringConfig& m = args_.monitoring;
  if (tb_ && m.log_timers_to_tensorboard)
    tb_->add_scalar("iteration-time", seconds_per_iteration, iteration);
  // Megatron's timers.log(timers_to_log, normalizer=log_interval): printed by the last rank.
  if (m.timing_log_level > 0) {  // every timer of the list has level >= 1
    const auto report =
        timers_->log(megatron_timers_to_log(), static_cast<double>(std::max<int64_t>(1, iters)),
                     world_.get(), /*reset=*/true);
    if (report) out_last << *report << std::endl;
  }
  const int size = world_ ? world_->size() : 1;
  const std::string s = straggler_->report(world_.get(), flops_per_iteration / size, iters);
  if (!s.empty()) out_first << s << std::flush;
}

void Monitoring::evaluation(const std::string& split, int64_t iteration, int64_t consumed_samples,
                            double lm_loss) {
  if (!tb_) return;
  const std::string tag = "lm loss " + split;
  tb_->add_scalar(tag, lm_loss, iteration);
  tb_->add_scalar(tag + " vs samples", lm_loss, consumed_samples);
  if (args_.monitoring.log_validation_ppl_to_tensorboard) {
    const double ppl = std::exp(std::min(20.0, lm_loss));
    tb_->add_scalar(tag + " ppl", ppl, iteration);
    tb_->add_scalar(tag + " ppl vs samples", ppl, consumed_samples);
  }
}

int Monitoring::signal_received() {
  return signals_ ? signals_->received_any(world_.get()) : 0;
}

void Monitoring::moe_scalars(int64_t iteration,
                             const std::vector<std::pair<std::string, double>>& scalars) {
  if (!tb_) return;
  for (const auto& [name, v] : scalars) tb_->add_scalar(name, v, iteration);
}

void Monitoring::flush() {
  if (tb_) tb_->flush();
}

}  // namespace mg::training
