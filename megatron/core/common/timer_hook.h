// Megatron's named timers as core code sees them (the schedules, finalize_model_grads, the
// optimizer): start(name, level) / stop(name) around a phase. The training loop implements it
// (megatron/training/timers.h: levels, device synchronisation, the report across ranks); core code
// holds a nullable pointer and times nothing when it is null. Names and levels are Megatron's.
#pragma once

#include <string_view>

namespace mg {

class TimerHook {
 public:
  virtual ~TimerHook() = default;
  // `level`: Megatron's log_level (0, 1 or 2); timers above --timing-log-level do nothing.
  virtual void start(std::string_view name, int level) = 0;
  virtual void stop(std::string_view name) = 0;
};

// Times a scope when `hook` is not null.
class ScopedTimer {
 public:
  ScopedTimer(TimerHook* hook, std::string_view name, int level) : hook_(hook), name_(name) {
    if (hook_) hook_->start(name_, level);
  }
  ~ScopedTimer() {
    if (hook_) hook_->stop(name_);
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  TimerHook* hook_;
  std::string_view name_;
};

}  // namespace mg
