// OptimizerParamScheduler: a line-by-line port of Megatron's optimizer_param_scheduler.py (and the
// step arithmetic of training.py's get_optimizer_param_scheduler). Doubles throughout, as Python.
#include "megatron/core/optimizer/optimizer_param_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "megatron/core/common/error.h"

namespace mg::optimizer {

// ---- style names -------------------------------------------------------------------------------

LrDecayStyle parse_lr_decay_style(const std::string& s) {
  if (s == "constant") return LrDecayStyle::constant;
  if (s == "linear") return LrDecayStyle::linear;
  if (s == "cosine") return LrDecayStyle::cosine;
  if (s == "inverse-square-root") return LrDecayStyle::inverse_square_root;
  if (s == "WSD") return LrDecayStyle::wsd;
  MG_CHECK(false, "--lr-decay-style '" << s
                                       << "' is not supported (constant, linear, cosine, "
                                          "inverse-square-root, WSD)");
  return LrDecayStyle::constant;
}

WsdDecayStyle parse_wsd_decay_style(const std::string& s) {
  if (s == "linear") return WsdDecayStyle::linear;
  if (s == "cosine") return WsdDecayStyle::cosine;
  if (s == "exponential") return WsdDecayStyle::exponential;
  if (s == "minus_sqrt") return WsdDecayStyle::minus_sqrt;
  MG_CHECK(false, "--lr-wsd-decay-style '"
                      << s << "' is not supported (linear, cosine, exponential, minus_sqrt)");
  return WsdDecayStyle::linear;
}

WdIncrStyle parse_wd_incr_style(const std::string& s) {
  if (s == "constant") return WdIncrStyle::constant;
  if (s == "linear") return WdIncrStyle::linear;
  if (s == "cosine") return WdIncrStyle::cosine;
  MG_CHECK(false,
           "--weight-decay-incr-style '" << s << "' is not supported (constant, linear, cosine)");
  return WdIncrStyle::constant;
}

std::string to_string(LrDecayStyle s) {
  switch (s) {
    case LrDecayStyle::constant:
      return "constant";
    case LrDecayStyle::linear:
      return "linear";
    case LrDecayStyle::cosine:
      return "cosine";
    case LrDecayStyle::inverse_square_root:
      return "inverse-square-root";
    case LrDecayStyle::wsd:
      return "WSD";
  }
  return "?";
}

std::string to_string(WsdDecayStyle s) {
  switch (s) {
    case WsdDecayStyle::linear:
      return "linear";
    case WsdDecayStyle::cosine:
      return "cosine";
    case WsdDecayStyle::exponential:
      return "exponential";
    case WsdDecayStyle::minus_sqrt:
      return "minus_sqrt";
  }
  return "?";
}

std::string to_string(WdIncrStyle s) {
  switch (s) {
    case WdIncrStyle::constant:
      return "constant";
    case WdIncrStyle::linear:
      return "linear";
    case WdIncrStyle::cosine:
      return "cosine";
  }
  return "?";
}

// ---- config ------------------------------------------------------------------------------------

void OptimizerParamSchedulerConfig::validate() const {
  constexpr const char* who = "OptimizerParamScheduler";
  MG_CHECK(min_lr >= 0.0, who << ": min_lr must be >= 0, got " << min_lr);
  MG_CHECK(max_lr >= min_lr, who << ": max_lr " << max_lr << " is smaller than min_lr " << min_lr);
  MG_CHECK(init_lr <= max_lr, who << ": init_lr (--lr-warmup-init) " << init_lr
                                  << " is larger than max_lr " << max_lr);
  MG_CHECK(lr_decay_steps > 0, who << ": lr_decay_steps must be > 0, got " << lr_decay_steps);
  MG_CHECK(lr_warmup_steps < static_cast<double>(lr_decay_steps),
           who << ": lr_warmup_steps " << lr_warmup_steps << " must be smaller than lr_decay_steps "
               << lr_decay_steps);
  if (lr_decay_style == LrDecayStyle::wsd) {
    MG_CHECK(wsd_decay_steps.has_value(),
             who << ": the WSD decay style needs wsd_decay_steps (--lr-wsd-decay-iters or "
                    "--lr-wsd-decay-samples)");
    MG_CHECK(*wsd_decay_steps > 0,
             who << ": wsd_decay_steps must be > 0, got " << *wsd_decay_steps);
  }
  MG_CHECK(start_wd >= 0.0, who << ": start_wd must be >= 0, got " << start_wd);
  MG_CHECK(end_wd >= start_wd,
           who << ": end_wd " << end_wd << " is smaller than start_wd " << start_wd);
  if (wd_incr_style == WdIncrStyle::constant)
    MG_CHECK(start_wd == end_wd, who << ": constant weight decay needs start_wd == end_wd, got "
                                     << start_wd << " and " << end_wd);
  else
    MG_CHECK(wd_incr_steps > 0, who << ": wd_incr_steps must be > 0, got " << wd_incr_steps);
  MG_CHECK(!(override_opt_param_scheduler && use_checkpoint_opt_param_scheduler),
           who << ": both override and use-checkpoint are set");
}

OptimizerParamSchedulerConfig scheduler_config_from_args(const SchedulerArgs& a) {
  MG_CHECK(a.train_iters.has_value() != a.train_samples.has_value(),
           "scheduler: exactly one of --train-iters and --train-samples must be given");
  MG_CHECK(a.global_batch_size > 0,
           "scheduler: global batch size must be > 0, got " << a.global_batch_size);
  if (a.lr_warmup_fraction) {
    MG_CHECK(a.lr_warmup_iters == 0 && a.lr_warmup_samples == 0,
             "--lr-warmup-fraction "
                 << *a.lr_warmup_fraction << " cannot be combined with --lr-warmup-iters "
                 << a.lr_warmup_iters << " / --lr-warmup-samples " << a.lr_warmup_samples);
    MG_CHECK(*a.lr_warmup_fraction >= 0.0 && *a.lr_warmup_fraction < 1.0,
             "--lr-warmup-fraction must be in [0, 1), got " << *a.lr_warmup_fraction);
  }
  OptimizerParamSchedulerConfig c;
  c.init_lr = a.lr_warmup_init;
  c.max_lr = a.lr;
  c.min_lr = a.min_lr;
  c.lr_decay_style = parse_lr_decay_style(a.lr_decay_style);
  c.lr_wsd_decay_style = parse_wsd_decay_style(a.lr_wsd_decay_style);
  if (a.train_iters) {
    MG_CHECK(a.lr_warmup_samples == 0,
             "--lr-warmup-samples needs --train-samples; with "
             "--train-iters use --lr-warmup-iters");
    const int64_t gbs = a.global_batch_size;
    c.lr_decay_steps = a.lr_decay_iters.value_or(*a.train_iters) * gbs;
    c.wd_incr_steps = *a.train_iters * gbs;
    if (a.lr_wsd_decay_iters) c.wsd_decay_steps = *a.lr_wsd_decay_iters * gbs;
    c.lr_warmup_steps = a.lr_warmup_fraction
                            ? *a.lr_warmup_fraction * static_cast<double>(c.lr_decay_steps)
                            : static_cast<double>(a.lr_warmup_iters * gbs);
  } else {
    MG_CHECK(a.lr_warmup_iters == 0,
             "--lr-warmup-iters needs --train-iters; with "
             "--train-samples use --lr-warmup-samples");
    c.lr_decay_steps = a.lr_decay_samples.value_or(*a.train_samples);
    c.wd_incr_steps = *a.train_samples;
    c.wsd_decay_steps = a.lr_wsd_decay_samples;
    c.lr_warmup_steps = a.lr_warmup_fraction
                            ? *a.lr_warmup_fraction * static_cast<double>(c.lr_decay_steps)
                            : static_cast<double>(a.lr_warmup_samples);
  }
  // arguments.py: constant style takes --weight-decay for both ends; the others need both.
  c.wd_incr_style = parse_wd_incr_style(a.weight_decay_incr_style);
  if (c.wd_incr_style == WdIncrStyle::constant) {
    MG_CHECK(!a.start_weight_decay && !a.end_weight_decay,
             "--start-weight-decay / --end-weight-decay need --weight-decay-incr-style linear or "
             "cosine");
    c.start_wd = c.end_wd = a.weight_decay;
  } else {
    MG_CHECK(a.start_weight_decay && a.end_weight_decay,
             "--weight-decay-incr-style " << a.weight_decay_incr_style
                                          << " needs --start-weight-decay and --end-weight-decay");
    c.start_wd = *a.start_weight_decay;
    c.end_wd = *a.end_weight_decay;
  }
  c.use_checkpoint_opt_param_scheduler = a.use_checkpoint_opt_param_scheduler;
  c.override_opt_param_scheduler = a.override_opt_param_scheduler;
  c.validate();
  return c;
}

// ---- scheduler ---------------------------------------------------------------------------------

OptimizerParamScheduler::OptimizerParamScheduler(const OptimizerParamSchedulerConfig& config)
    : cfg_(config) {
  cfg_.validate();
  step(0);
}

double OptimizerParamScheduler::get_wd() const {
  if (num_steps_ > cfg_.wd_incr_steps) return cfg_.end_wd;
  if (cfg_.wd_incr_style == WdIncrStyle::constant) return cfg_.end_wd;
  const double incr_ratio =
      static_cast<double>(num_steps_) / static_cast<double>(cfg_.wd_incr_steps);
  MG_CHECK(incr_ratio >= 0.0 && incr_ratio <= 1.0,
           "OptimizerParamScheduler: weight-decay ratio " << incr_ratio << " outside [0, 1]");
  const double delta_wd = cfg_.end_wd - cfg_.start_wd;
  const double coeff = cfg_.wd_incr_style == WdIncrStyle::linear
                           ? incr_ratio
                           : 0.5 * (std::cos(std::numbers::pi * (1 - incr_ratio)) + 1.0);
  return cfg_.start_wd + coeff * delta_wd;
}

double OptimizerParamScheduler::get_lr(double max_lr, double min_lr) const {
  const double n = static_cast<double>(num_steps_);
  const double warmup = cfg_.lr_warmup_steps;
  // Linear warmup from init_lr.
  if (warmup > 0 && n <= warmup) return cfg_.init_lr + (max_lr - cfg_.init_lr) * n / warmup;
  if (cfg_.lr_decay_style == LrDecayStyle::constant) return max_lr;
  if (num_steps_ > cfg_.lr_decay_steps) return min_lr;
  if (cfg_.lr_decay_style == LrDecayStyle::inverse_square_root) {
    // Python: max(self.lr_warmup_steps, 1) ** 0.5 / max(self.num_steps, 1) ** 0.5
    const double w = std::max(warmup, 1.0);
    const double s = std::max(n, 1.0);
    const double lr = max_lr * std::pow(w, 0.5) / std::pow(s, 0.5);
    return std::max(min_lr, lr);
  }
  const double num_steps_after = n - warmup;
  const double decay_steps = static_cast<double>(cfg_.lr_decay_steps) - warmup;
  const double decay_ratio = num_steps_after / decay_steps;
  MG_CHECK(decay_ratio >= 0.0 && decay_ratio <= 1.0,
           "OptimizerParamScheduler: decay ratio " << decay_ratio << " outside [0, 1]");
  const double delta_lr = max_lr - min_lr;
  double coeff = 0.0;
  switch (cfg_.lr_decay_style) {
    case LrDecayStyle::linear:
      coeff = 1.0 - decay_ratio;
      break;
    case LrDecayStyle::cosine:
      coeff = 0.5 * (std::cos(std::numbers::pi * decay_ratio) + 1.0);
      break;
    case LrDecayStyle::wsd: {
      const int64_t wsd_steps_total = *cfg_.wsd_decay_steps;
      const int64_t anneal_start = cfg_.lr_decay_steps - wsd_steps_total;
      if (num_steps_ <= anneal_start) {
        coeff = 1.0;
      } else {
        const double r =
            static_cast<double>(num_steps_ - anneal_start) / static_cast<double>(wsd_steps_total);
        switch (cfg_.lr_wsd_decay_style) {
          case WsdDecayStyle::linear:
            coeff = 1.0 - r;
            break;
          case WsdDecayStyle::cosine:
            coeff = 0.5 * (std::cos(std::numbers::pi * r) + 1.0);
            break;
          case WsdDecayStyle::exponential:
            coeff = 2.0 * std::pow(0.5, r) - 1.0;
            break;
          case WsdDecayStyle::minus_sqrt:
            coeff = 1.0 - std::sqrt(r);
            break;
        }
      }
      break;
    }
    case LrDecayStyle::constant:
    case LrDecayStyle::inverse_square_root:
      break;  // handled above
  }
  return min_lr + coeff * delta_lr;
}

void OptimizerParamScheduler::step(int64_t increment) {
  num_steps_ += increment;
  lr_ = get_lr();
  wd_ = get_wd();
}

StateDict OptimizerParamScheduler::state_dict() const {
  StateDict sd;
  sd.numbers["max_lr"] = cfg_.max_lr;
  sd.numbers["lr_warmup_steps"] = cfg_.lr_warmup_steps;
  sd.numbers["num_steps"] = static_cast<double>(num_steps_);
  sd.strings["lr_decay_style"] = to_string(cfg_.lr_decay_style);
  sd.numbers["lr_decay_steps"] = static_cast<double>(cfg_.lr_decay_steps);
  sd.numbers["min_lr"] = cfg_.min_lr;
  sd.numbers["start_wd"] = cfg_.start_wd;
  sd.numbers["end_wd"] = cfg_.end_wd;
  sd.strings["wd_incr_style"] = to_string(cfg_.wd_incr_style);
  sd.numbers["wd_incr_steps"] = static_cast<double>(cfg_.wd_incr_steps);
  return sd;
}

namespace {

// Megatron's _check_and_set: override keeps the class value; use-checkpoint takes the checkpoint's;
// otherwise they must be equal.
template <typename T>
T check_and_set(const OptimizerParamSchedulerConfig& c, const T& cls_value, const T& sd_value,
                const char* name) {
  if (c.override_opt_param_scheduler) return cls_value;
  if (!c.use_checkpoint_opt_param_scheduler)
    MG_CHECK(cls_value == sd_value, "OptimizerParamScheduler: class input value "
                                        << cls_value << " and checkpoint value " << sd_value
                                        << " for " << name
                                        << " do not match (use --override-opt_param-scheduler or "
                                           "--use-checkpoint-opt_param-scheduler)");
  return sd_value;
}

double first_number(const StateDict& sd, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (sd.has_number(k)) return sd.number(k);
  return sd.number(*(keys.end() - 1));  // throws naming the current key
}

}  // namespace

void OptimizerParamScheduler::load_state_dict(const StateDict& sd) {
  cfg_.max_lr =
      check_and_set(cfg_, cfg_.max_lr, first_number(sd, {"start_lr", "max_lr"}), "learning rate");
  cfg_.min_lr = check_and_set(cfg_, cfg_.min_lr, sd.number("min_lr"), "minimum learning rate");
  cfg_.lr_warmup_steps = check_and_set(
      cfg_, cfg_.lr_warmup_steps,
      first_number(sd, {"warmup_iter", "warmup_steps", "lr_warmup_steps"}), "warmup iterations");
  cfg_.lr_decay_steps = check_and_set(
      cfg_, cfg_.lr_decay_steps,
      static_cast<int64_t>(first_number(sd, {"end_iter", "decay_steps", "lr_decay_steps"})),
      "total number of iterations");
  const std::string style =
      sd.has_string("decay_style") ? sd.string("decay_style") : sd.string("lr_decay_style");
  cfg_.lr_decay_style = parse_lr_decay_style(
      check_and_set(cfg_, to_string(cfg_.lr_decay_style), style, "learning rate decay style"));
  const auto num_steps = static_cast<int64_t>(first_number(sd, {"num_iters", "num_steps"}));
  step(num_steps);
  if (sd.has_number("start_wd")) {
    cfg_.start_wd = check_and_set(cfg_, cfg_.start_wd, sd.number("start_wd"), "start weight decay");
    cfg_.end_wd = check_and_set(cfg_, cfg_.end_wd, sd.number("end_wd"), "end weight decay");
    cfg_.wd_incr_steps =
        check_and_set(cfg_, cfg_.wd_incr_steps, static_cast<int64_t>(sd.number("wd_incr_steps")),
                      "total number of weight decay iterations");
    cfg_.wd_incr_style =
        parse_wd_incr_style(check_and_set(cfg_, to_string(cfg_.wd_incr_style),
                                          sd.string("wd_incr_style"), "weight decay incr style"));
  }
}

}  // namespace mg::optimizer
