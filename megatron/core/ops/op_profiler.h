// Per-op profile of the op table (--profile-op-table; --profile's NVTX ranges).
//
// An OpProfiler wraps a resolved OpTable: table() has the same slots, each a thunk that calls the
// wrapped table's function. While the profiler is started, a call at the outermost level (an op
// that calls the table again is counted once, with its inner calls inside it) is
//   - timed (OpProfilerOptions::time_ops) by a pair of the platform's timing events recorded on the
//     current stream of the profiler's device around it: steady_clock on the CPU, cudaEvents on the
//     op's stream on CUDA. Events are pooled and read only in report(), which waits once for the
//     last one: no synchronisation per op;
//   - bracketed by a named range (OpProfilerOptions::ranges: NVTX on CUDA, seen by nsys).
// Each call's work is known from its arguments (OpCost): GEMMs 2·M·N·K FLOPs, attention the
// matmul FLOPs of the positions the mask keeps, every op the bytes of its tensors; the report
// turns them into TFLOP/s and GB/s. Outside start()..stop() a thunk is one indirect call more.
//
// One profiler per process at a time (the thunks find it through a process-wide pointer); it
// must outlive every holder of table().
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "megatron/core/ops/ops.h"
#include "megatron/plugin/platform.h"

namespace mg::ops {

// The work of one call: floating-point operations and bytes of the tensors it reads and writes
// (0: not known).
struct OpCost {
  double flops = 0.0;
  double bytes = 0.0;
  int variant = 0;  // > 0: a row of its own (gemm_epilogue: 1 + the epilogue kind)
};

struct OpProfilerOptions {
  bool time_ops = true;  // events around each call (the table)
  bool ranges = false;   // named ranges around each call (--profile: NVTX)
};

struct OpProfileRow {
  std::string op;        // the slot; gemm_epilogue rows are per epilogue ("gemm_epilogue.bias")
  std::string provider;  // who runs it (set_providers), "" when not given
  int64_t calls = 0;
  double total_ms = 0.0;
  double flops = 0.0;  // summed over the calls; 0 when unknown
  double bytes = 0.0;
  double tflops_per_s() const { return total_ms > 0.0 ? flops / (total_ms * 1e9) : 0.0; }
  double gbytes_per_s() const { return total_ms > 0.0 ? bytes / (total_ms * 1e6) : 0.0; }
};

struct OpProfileReport {
  std::string platform;
  int64_t steps = 0;               // begin_step / end_step pairs in the report
  double step_ms = 0.0;            // their total time
  double ops_ms = 0.0;             // the rows' total time (<= step_ms when every call is in a step)
  std::vector<OpProfileRow> rows;  // by total time, largest first
  // Share of the steps' time, in percent (0 without steps).
  double share(const OpProfileRow& r) const {
    return step_ms > 0.0 ? 100.0 * r.total_ms / step_ms : 0.0;
  }
  const OpProfileRow* find(std::string_view op) const;
};

// The table: op, provider, calls, total ms, ms per step, share of the step, TFLOP/s, GB/s, then a
// line for the time outside ops (host work, communication, gaps between launches).
std::string format_op_profile(const OpProfileReport& report);

class OpProfiler {
 public:
  // `inner` must outlive the profiler. Throws when another profiler exists.
  OpProfiler(const OpTable& inner, plugin::Platform& platform, Device device,
             OpProfilerOptions options = {});
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  const OpTable& table() const;
  const OpProfilerOptions& options() const;
  // The provider of each slot (index = OpId), shown in the report.
  void set_providers(std::array<std::string, kNumOps> providers);

  void start();  // calls from now on are profiled (and the platform's capture range starts)
  void stop();
  bool started() const;
  // A training step's bounds: its time is the denominator of the shares.
  void begin_step();
  void end_step();
  // Waits for the last recorded event, reads every pair and forgets them (the pool is kept).
  OpProfileReport report();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mg::ops
