// OptimizerParamScheduler: Megatron's optimizer_param_scheduler.py, exactly: learning-rate warmup
// and decay, weight-decay increment, and its checkpoint (override / use-checkpoint) semantics.
//
// Steps are whatever the caller increments by: Megatron counts SAMPLES in both modes (iteration
// mode: steps = iters * global_batch_size, step(global_batch_size) per iteration), which
// scheduler_config_from_args() reproduces. The scheduler holds no optimizer: after each
// optimizer.step(lr(), weight_decay()) the loop calls step(increment), as Megatron's train_step.
//   lr: warmup (num_steps <= warmup): init + (max - init) * n / warmup; constant: max; past
//   decay_steps: min; inverse-square-root: max(min, max * sqrt(max(warmup,1)) / sqrt(max(n,1)));
//   else ratio = (n - warmup) / (decay - warmup) and lr = min + coeff * (max - min) with linear
//   1 - ratio, cosine (cos(pi ratio) + 1) / 2, WSD 1 until decay - wsd_decay then the
//   --lr-wsd-decay-style of (n - anneal_start) / wsd_decay.
//   wd: past wd_incr_steps end_wd; constant end_wd; linear / cosine from start_wd to end_wd.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "megatron/core/optimizer/state_dict.h"

namespace mg::optimizer {

enum class LrDecayStyle { constant, linear, cosine, inverse_square_root, wsd };
enum class WsdDecayStyle { linear, cosine, exponential, minus_sqrt };
enum class WdIncrStyle { constant, linear, cosine };

// Megatron's spellings ("inverse-square-root", "WSD", "minus_sqrt", ...); unknown names throw
// listing the valid ones.
LrDecayStyle parse_lr_decay_style(const std::string& s);
WsdDecayStyle parse_wsd_decay_style(const std::string& s);
WdIncrStyle parse_wd_incr_style(const std::string& s);
std::string to_string(LrDecayStyle s);
std::string to_string(WsdDecayStyle s);
std::string to_string(WdIncrStyle s);

// The constructor arguments of Megatron's OptimizerParamScheduler.
struct OptimizerParamSchedulerConfig {
  double init_lr = 0.0;          // --lr-warmup-init
  double max_lr = 0.0;           // --lr
  double min_lr = 0.0;           // --min-lr
  double lr_warmup_steps = 0.0;  // may be fractional (--lr-warmup-fraction * lr_decay_steps)
  int64_t lr_decay_steps = 1;
  LrDecayStyle lr_decay_style = LrDecayStyle::linear;
  double start_wd = 0.01;
  double end_wd = 0.01;
  int64_t wd_incr_steps = 1;
  WdIncrStyle wd_incr_style = WdIncrStyle::constant;
  bool use_checkpoint_opt_param_scheduler = false;
  bool override_opt_param_scheduler = false;
  std::optional<int64_t> wsd_decay_steps;  // required for WSD
  WsdDecayStyle lr_wsd_decay_style = WsdDecayStyle::exponential;

  // Megatron's asserts, with the values: 0 <= min_lr <= max_lr, init_lr <= max_lr,
  // lr_decay_steps > 0, warmup < decay, WSD needs wsd_decay_steps, 0 <= start_wd <= end_wd,
  // constant wd needs start == end, not both override and use-checkpoint.
  void validate() const;
};

// The Megatron flags behind the scheduler (training.py get_optimizer_param_scheduler and the
// arguments.py checks). Exactly one of train_iters / train_samples.
struct SchedulerArgs {
  double lr = 0.0;
  double min_lr = 0.0;
  double lr_warmup_init = 0.0;
  std::string lr_decay_style = "linear";
  std::optional<int64_t> train_iters, train_samples;
  int64_t global_batch_size = 1;
  std::optional<int64_t> lr_decay_iters, lr_decay_samples;
  int64_t lr_warmup_iters = 0, lr_warmup_samples = 0;
  std::optional<double> lr_warmup_fraction;
  std::optional<int64_t> lr_wsd_decay_iters, lr_wsd_decay_samples;
  std::string lr_wsd_decay_style = "exponential";
  double weight_decay = 0.01;
  std::optional<double> start_weight_decay, end_weight_decay;
  std::string weight_decay_incr_style = "constant";
  bool use_checkpoint_opt_param_scheduler = false;
  bool override_opt_param_scheduler = false;
};
// Steps in samples: iteration mode multiplies iteration counts by global_batch_size.
OptimizerParamSchedulerConfig scheduler_config_from_args(const SchedulerArgs& args);

class OptimizerParamScheduler {
 public:
  explicit OptimizerParamScheduler(const OptimizerParamSchedulerConfig& config);  // then step(0)

  // num_steps += increment; recomputes lr() and weight_decay().
  void step(int64_t increment);
  double lr() const { return lr_; }
  double weight_decay() const { return wd_; }
  int64_t num_steps() const { return num_steps_; }
  // The formulas at the current num_steps; get_lr(max, min) for a group with its own max/min lr.
  double get_lr() const { return get_lr(cfg_.max_lr, cfg_.min_lr); }
  double get_lr(double max_lr, double min_lr) const;
  double get_wd() const;
  const OptimizerParamSchedulerConfig& config() const { return cfg_; }

  // numbers max_lr, min_lr, lr_warmup_steps, lr_decay_steps, num_steps, start_wd, end_wd,
  // wd_incr_steps; strings lr_decay_style, wd_incr_style (Megatron's keys and spellings).
  StateDict state_dict() const;
  // Megatron's load: each value is taken from the checkpoint (use-checkpoint), kept from the config
  // (override), or else must match (throws naming both); accepts the legacy keys (start_lr,
  // warmup_iter/warmup_steps, end_iter/decay_steps, decay_style, num_iters); then
  // step(checkpoint num_steps) from the current count.
  void load_state_dict(const StateDict& sd);

 private:
  OptimizerParamSchedulerConfig cfg_;
  int64_t num_steps_ = 0;
  double lr_ = 0.0;
  double wd_ = 0.0;
};

}  // namespace mg::optimizer
