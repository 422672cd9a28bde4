// The training loop's monitoring, in one object so that training.cpp only calls hooks: the
// TensorBoard writer (tensorboard.h; the last rank, as Megatron's get_tensorboard_writer),
// Megatron's timers (timers.h), the exit-signal handler (signal_handler.h) and the straggler report
// (straggler.h), set up from MonitoringConfig (monitoring_config.h).
//
// TensorBoard scalars (Megatron's training_log / evaluate_and_print_results names; "<x> vs samples"
// is the same value against consumed samples): every --tensorboard-log-interval iterations
// learning-rate (unless --no-log-learning-rate-to-tensorboard), batch-size
// (--log-batch-size-to-tensorboard), lm loss (this iteration's), loss-scale (unless
// --no-log-loss-scale-to-tensorboard), world-size (--log-world-size-to-tensorboard), grad-norm,
// num-zeros (--log-num-zeros-in-grad), mem-reserved-bytes / mem-allocated-bytes /
// mem-max-allocated-bytes / mem-allocated-count (--log-memory-to-tensorboard), '<timer>-time'
// (--log-timers-to-tensorboard: the max over ranks of seconds per iteration since the last log
// line); at the log interval iteration-time (--log-timers-to-tensorboard); after each evaluation
// 'lm loss validation' / 'lm loss test' and, with --log-validation-ppl-to-tensorboard,
// 'lm loss validation ppl' / 'lm loss test ppl'. At start-up the flags as text (one tag per flag,
// Megatron's write_args_to_tensorboard).
#pragma once

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "megatron/training/arguments.h"
#include "megatron/training/signal_handler.h"
#include "megatron/training/straggler.h"
#include "megatron/training/tensorboard.h"
#include "megatron/training/timers.h"

namespace mg {
struct Runtime;
}  // namespace mg

namespace mg::training {

// One iteration's values for TensorBoard.
struct IterationScalars {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  double learning_rate = 0.0;
  int64_t batch_size = 0;
  double lm_loss = 0.0;
  double loss_scale = 1.0;
  std::optional<double> grad_norm;
  std::optional<int64_t> num_zeros;
};

class Monitoring {
 public:
  // Collective-free. Prints its start-up lines to `log` (rank 0's). world: the run's world group.
  Monitoring(const Arguments& args, comm::ProcessGroupPtr world, Runtime& rt, std::ostream& log);
  ~Monitoring();

  MegatronTimers& timers() { return *timers_; }
  StragglerDetector& straggler() { return *straggler_; }
  // The forward-backward timer (level 1; a world barrier first with --barrier-with-L1-time).
  void start_forward_backward();

  // After every iteration, all ranks (timers to TensorBoard are a collective).
  // iters_since_log: iterations since the last log line (the timers' normalizer).
  void after_iteration(const IterationScalars& s, int64_t iters_since_log);
  // At the log interval, all ranks: writes Megatron's timer report and the straggler report to
  // `out_last` / `out_first` (the last rank's and rank 0's streams) and iteration-time to TB.
  void at_log_interval(int64_t iteration, int64_t iters, double seconds_per_iteration,
                       double flops_per_iteration, std::ostream& out_last, std::ostream& out_first);
  // After an evaluation ("validation" or "test").
  void evaluation(const std::string& split, int64_t iteration, int64_t consumed_samples,
                  double lm_loss);
  // Collective: the signal any rank received (--exit-signal-handler), 0 if none or no handler.
  int signal_received();
  // Megatron's MoE TensorBoard scalars (moe_utils.h MoELogLines::scalars) at `iteration`.
  void moe_scalars(int64_t iteration, const std::vector<std::pair<std::string, double>>& scalars);
  void flush();

 private:
  const Arguments& args_;
  comm::ProcessGroupPtr world_;
  Runtime& rt_;
  std::unique_ptr<tensorboard::SummaryWriter> tb_;
  std::unique_ptr<MegatronTimers> timers_;
  std::unique_ptr<DistributedSignalHandler> signals_;
  std::unique_ptr<StragglerDetector> straggler_;
};

}  // namespace mg::training
