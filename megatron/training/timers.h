// Megatron's timers (megatron/core/timers.py): named stopwatches with a log level, reported across
// ranks in Megatron's format. --timing-log-level L times the timers of level <= L (the others cost
// nothing); --timing-log-option picks the report:
//   max     "max time across ranks (ms):" then "    <name ......>: 12.34" per timer
//   minmax  "(min, max) time across ranks (ms):" then "    <name ......>: (1.23, 12.34)"
//   all     "times across ranks (ms):" then "  <name>:" and "     rank  0: 1.23" per rank
// (names padded with dots to 48 columns; times are the accumulated seconds x 1000 / normalizer;
// ranks that never ran a timer are left out of its min/max, a timer no rank ran is not printed).
// Megatron synchronises the device at each start and stop so that the times are the device's;
// so do these (Platform::synchronize, a no-op on the CPU). Levels of the timers the loop sets
// (Megatron's): 1 forward-backward, all-grads-sync, layernorm-grads-all-reduce,
// embedding-grads-all-reduce, optimizer and its parts (optimizer-unscale-and-check-inf,
// optimizer-clip-main-grad, optimizer-count-zeros, optimizer-inner-step,
// optimizer-copy-main-to-model-params), params-all-gather; 2 forward-compute, backward-compute,
// batch-generator. Megatron's pipeline p2p timers (forward-recv, ...) are not measured: the
// schedules here post every p2p of a step ahead (pipeline_parallel/schedules.cpp), so there is no
// per-call wait to time.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/common/timer_hook.h"

namespace mg::training {

// Megatron's timers_to_log of training_log(), in its order.
const std::vector<std::string>& megatron_timers_to_log();

class MegatronTimers : public TimerHook {
 public:
  // log_option: max | minmax | all. synchronize: waits for the device (may be empty).
  MegatronTimers(int log_level, std::string log_option, std::function<void()> synchronize = {});

  void start(std::string_view name, int level) override;
  void stop(std::string_view name) override;
  bool active(int level) const { return level <= log_level_; }

  // Every rank of `world` calls these (an all-gather of each rank's times): seconds / normalizer
  // per rank and name, in `names` order; rank-major [rank][name]. reset zeroes the timers.
  std::vector<std::vector<double>> gather(const std::vector<std::string>& names,
                                          comm::ProcessGroup* world, bool reset);
  // Megatron's report of `names` (see the file comment), normalizer = iterations; nullopt when no
  // rank timed any of them. Collective over `world` (null: this rank alone).
  std::optional<std::string> log(const std::vector<std::string>& names, double normalizer,
                                 comm::ProcessGroup* world, bool reset = true);
  // (name, max over ranks of seconds / normalizer) for the timers some rank ran: Megatron's
  // Timers.write, which TensorBoard records as '<name>-time'. Collective.
  std::vector<std::pair<std::string, double>> max_times(const std::vector<std::string>& names,
                                                        double normalizer,
                                                        comm::ProcessGroup* world,
                                                        bool reset = true);

 private:
  struct Timer {
    int level = 0;
    bool running = false;
    std::chrono::steady_clock::time_point started;
    double accumulated = 0.0;
  };
  int log_level_;
  std::string log_option_;
  std::function<void()> synchronize_;
  std::map<std::string, Timer, std::less<>> timers_;
};

}  // namespace mg::training
