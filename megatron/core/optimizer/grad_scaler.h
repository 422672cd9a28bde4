// Loss scalers for mixed-precision training: Megatron's grad_scaler.py, exactly.
//
// The loss is multiplied by scale() before backward; the optimizer multiplies the gradients by
// inv_scale() and reports whether any was inf/nan; update(found_inf) then adjusts the scale.
// DynamicGradScaler: on an overflow the growth tracker resets and the hysteresis tracker counts
// down; once it reaches 0 every further overflow multiplies the scale by backoff_factor (never
// below min_scale). After growth_interval consecutive clean steps the scale is multiplied by
// growth_factor and the hysteresis tracker is refilled. The scale is an f32 value, as Megatron's
// torch.float tensor, and inv_scale = float(1 / double(scale)).
#pragma once

#include <cstdint>
#include <memory>

#include "megatron/core/optimizer/optimizer_config.h"
#include "megatron/core/optimizer/state_dict.h"

namespace mg::optimizer {

class GradScaler {
 public:
  explicit GradScaler(double initial_scale);
  virtual ~GradScaler() = default;

  float scale() const { return scale_; }
  float inv_scale() const;
  virtual void update(bool found_inf) = 0;
  virtual StateDict state_dict() const = 0;
  virtual void load_state_dict(const StateDict& sd) = 0;

 protected:
  float scale_;
};

// --loss-scale: a fixed scale; update() does nothing; empty state dict.
class ConstantGradScaler final : public GradScaler {
 public:
  explicit ConstantGradScaler(double scale) : GradScaler(scale) {}
  void update(bool) override {}
  StateDict state_dict() const override { return {}; }
  void load_state_dict(const StateDict&) override {}
};

class DynamicGradScaler final : public GradScaler {
 public:
  // Megatron asserts: 0 < min_scale <= initial_scale, growth_factor > 1, 0 < backoff_factor < 1,
  // growth_interval > 0, hysteresis > 0 (thrown here with the values).
  DynamicGradScaler(double initial_scale, double min_scale, double growth_factor,
                    double backoff_factor, int64_t growth_interval, int64_t hysteresis);

  void update(bool found_inf) override;
  // {"scale", "growth_tracker", "hysteresis_tracker"}, Megatron's keys.
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& sd) override;

  int64_t growth_tracker() const { return growth_tracker_; }
  int64_t hysteresis_tracker() const { return hysteresis_tracker_; }

 private:
  float min_scale_;
  double growth_factor_, backoff_factor_;
  int64_t growth_interval_, hysteresis_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_tracker_;
};

// Megatron's choice (optimizer/__init__.py): loss_scale set -> constant; else fp16 -> dynamic
// (growth 2, backoff 0.5, window, hysteresis); else (bf16, fp32) -> none (nullptr).
std::unique_ptr<GradScaler> make_grad_scaler(const OptimizerConfig& config);

}  // namespace mg::optimizer
