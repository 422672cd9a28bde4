// Constant and dynamic loss scalers (Megatron's grad_scaler.py). The scale is kept in f32 and
// products are f32 (the factor rounded to f32), as torch computes on Megatron's float tensor.
#include "megatron/core/optimizer/grad_scaler.h"

#include <algorithm>
#include <cmath>

#include "megatron/core/common/error.h"

namespace mg::optimizer {

GradScaler::GradScaler(double initial_scale) : scale_(static_cast<float>(initial_scale)) {
  MG_CHECK(initial_scale > 0.0 && std::isfinite(scale_),
           "grad scaler: initial scale must be a finite f32 > 0, got " << initial_scale);
}

float GradScaler::inv_scale() const {
  return static_cast<float>(1.0 / static_cast<double>(scale_));
}

DynamicGradScaler::DynamicGradScaler(double initial_scale, double min_scale, double growth_factor,
                                     double backoff_factor, int64_t growth_interval,
                                     int64_t hysteresis)
    : GradScaler(initial_scale),
      min_scale_(static_cast<float>(min_scale)),
      growth_factor_(growth_factor),
      backoff_factor_(backoff_factor),
      growth_interval_(growth_interval),
      hysteresis_(hysteresis),
      hysteresis_tracker_(hysteresis) {
  MG_CHECK(min_scale > 0.0, "DynamicGradScaler: min_scale must be > 0, got " << min_scale);
  MG_CHECK(min_scale <= initial_scale, "DynamicGradScaler: min_scale "
                                           << min_scale << " is larger than initial_scale "
                                           << initial_scale);
  MG_CHECK(growth_factor > 1.0,
           "DynamicGradScaler: growth_factor must be > 1, got " << growth_factor);
  MG_CHECK(backoff_factor > 0.0 && backoff_factor < 1.0,
           "DynamicGradScaler: backoff_factor must be in (0, 1), got " << backoff_factor);
  MG_CHECK(growth_interval > 0,
           "DynamicGradScaler: growth_interval must be > 0, got " << growth_interval);
  MG_CHECK(hysteresis > 0, "DynamicGradScaler: hysteresis must be > 0, got " << hysteresis);
}

void DynamicGradScaler::update(bool found_inf) {
  if (found_inf) {
    growth_tracker_ = 0;
    --hysteresis_tracker_;
    // Once hysteresis is exhausted every overflow backs off (the tracker keeps going negative).
    if (hysteresis_tracker_ <= 0)
      scale_ = std::max(scale_ * static_cast<float>(backoff_factor_), min_scale_);
  } else {
    ++growth_tracker_;
    if (growth_tracker_ == growth_interval_) {
      growth_tracker_ = 0;
      hysteresis_tracker_ = hysteresis_;
      scale_ = scale_ * static_cast<float>(growth_factor_);
    }
  }
}

StateDict DynamicGradScaler::state_dict() const {
  StateDict sd;
  sd.numbers["scale"] = scale_;
  sd.numbers["growth_tracker"] = static_cast<double>(growth_tracker_);
  sd.numbers["hysteresis_tracker"] = static_cast<double>(hysteresis_tracker_);
  return sd;
}

void DynamicGradScaler::load_state_dict(const StateDict& sd) {
  const double scale = sd.number("scale");
  MG_CHECK(scale > 0.0 && std::isfinite(scale),
           "DynamicGradScaler: checkpoint scale must be > 0, got " << scale);
  scale_ = static_cast<float>(scale);
  growth_tracker_ = static_cast<int64_t>(sd.number("growth_tracker"));
  hysteresis_tracker_ = static_cast<int64_t>(sd.number("hysteresis_tracker"));
}

std::unique_ptr<GradScaler> make_grad_scaler(const OptimizerConfig& config) {
  if (!config.fp16 && !config.bf16) return nullptr;  // FP32Optimizer: no scaling
  if (config.loss_scale) return std::make_unique<ConstantGradScaler>(*config.loss_scale);
  if (config.fp16)
    return std::make_unique<DynamicGradScaler>(config.initial_loss_scale, config.min_loss_scale,
                                               2.0, 0.5, config.loss_scale_window,
                                               config.hysteresis);
  return nullptr;
}

}  // namespace mg::optimizer
