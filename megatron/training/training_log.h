// The training loop's log lines, Megatron's format (megatron/training/training.py training_log and
// evaluate_and_print_results), plus tokens/s/GPU, MFU and memory (PERFORMANCE.md conventions):
//
//  [2026-01-01 12:00:00] iteration       10/     100 | consumed samples:           80 |
//  elapsed time per iteration (ms): 123.4 | throughput per GPU (TFLOP/s/GPU): 1.2 | tokens per
//  second per GPU: 5309.1 | MFU: 0.12% | learning rate: 1.000000E-04 | global batch size:     8 |
//  lm loss: 5.123456E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 |
//  number of nan iterations:   0 | mem allocated (MB): 12.3 | mem max allocated (MB): 45.6 |
//
// (one line). "grad norm" is before clipping. MFU = model TFLOP/s / the device's dense peak
// (--peak-tflops, else 989 for H100/H200, else "n/a"); the FLOPs are Megatron's formula
// (gpt_flops.h: causal attention halved, unlike llm.c / torchtitan).
// Timers: wall-clock stopwatches by name, Megatron's Timers reduced to one rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace mg::training {

// What one log line reports, averaged over the iterations since the previous line.
struct IntervalStats {
  int64_t iteration = 0;    // the iteration just finished
  int64_t train_iters = 0;  // total
  int64_t consumed_samples = 0;
  double elapsed_ms_per_iter = 0.0;
  double flops_per_iter = 0.0;  // model FLOPs of one iteration (all ranks)
  int64_t tokens_per_iter = 0;  // gbs * S
  int64_t world_size = 1;
  std::optional<double> peak_tflops;  // per device
  double learning_rate = 0.0;
  int64_t global_batch_size = 0;
  std::optional<double> lm_loss;  // averaged over non-skipped iterations; nullopt if none
  double loss_scale = 1.0;
  std::optional<double> grad_norm;           // of the last successful step
  std::optional<int64_t> num_zeros_in_grad;  // --log-num-zeros-in-grad, same step
  std::optional<double> params_norm;         // --log-params-norm, after the last step
  int64_t skipped_iters = 0;                 // in this interval
  int64_t nan_iters = 0;                     // in this interval
  std::optional<double> mem_allocated_mb, mem_max_allocated_mb;
};

// "2026-01-01 12:00:00" (local time), Megatron's log-line date.
std::string log_timestamp();
std::string format_training_log(const IntervalStats& s);
// The validation / test block: dashes, " validation loss at iteration 100 | lm loss value:
// 5.1E+00 | lm loss PPL: 1.6E+02 | ", dashes.
std::string format_evaluation(const std::string& prefix, double lm_loss);

// Default peak dense bf16 TFLOP/s for a device name: 989 for H100/H200 (PERFORMANCE.md), else
// nullopt (no MFU).
std::optional<double> default_peak_tflops(const std::string& device_name);

class Timers {
 public:
  void start(const std::string& name);
  // Stops `name` and returns the seconds since its start (accumulated into elapsed()).
  double stop(const std::string& name);
  // Seconds accumulated by `name` since the last reset; reset = true zeroes it.
  double elapsed(const std::string& name, bool reset = true);

 private:
  struct Timer {
    std::chrono::steady_clock::time_point started;
    bool running = false;
    double accumulated = 0.0;
  };
  std::map<std::string, Timer> timers_;
};

}  // namespace mg::training
