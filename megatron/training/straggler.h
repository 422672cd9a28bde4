// --log-straggler (alias --enable-straggler-detection): Megatron's StragglerDetector report. Each
// rank accumulates, over a log interval, the wall time of its forward-backward compute (the
// schedule: forward and backward of every micro-batch, batch generation included, before the
// data-parallel gradient reduction, so a rank's own slowness is not hidden by the wait of the
// others at the reduce) and of its batch generation; at the log interval every rank's numbers are
// gathered over the world and rank 0 prints Megatron's line
//   [date] | MnRtt/Rnk: 12.34ms/3 | MxRtt/Rnk: 56.78ms/1 | MnDRtt/Rnk: 0.12ms/0 |
//   MxDRtt/Rnk: 0.34ms/2 | MnEtpt/Rnk: 0.01TF/1 | MxEtpt/Rnk: 0.05TF/3
// (Rtt: compute ms per iteration; DRtt: batch ms per iteration; Etpt: this rank's share of the
// model FLOPs per second over its compute time, in TFLOP/s; the power, temperature, utilisation
// and clock columns need NVML and are left out), Megatron's "^^^^ Bottom/Top N Ranks" lines with
// --straggler-minmax-count N > 1, and a line naming the N slowest ranks with their speed relative
// to the median rank:
//   straggler: slowest rank 1: 0.25x the median rank's throughput (234.56 ms vs 58.64 ms per
//   iteration)
// --disable-straggler-on-startup starts the report off; Megatron turns it on through an HTTP
// toggle at --straggler-ctrlr-port, which is not served here, so the run then prints none (said at
// start-up).
// Test hook (tests/unit/training/straggler.sh only): MG_TEST_STRAGGLER_RANK=r and
// MG_TEST_STRAGGLER_DELAY_MS=d make world rank r sleep d ms inside its timed compute every
// iteration.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "megatron/core/comm/process_group.h"

namespace mg::training {

class StragglerDetector {
 public:
  StragglerDetector(bool enabled, int minmax_count, int world_rank);
  bool enabled() const { return enabled_; }

  void start_compute();
  void stop_compute();
  void add_batch_seconds(double s) { batch_s_ += s; }

  // Collective over `world` when enabled (every rank calls it at the log interval): the report
  // (see the file comment), "" on ranks other than 0 and when disabled. flops_per_rank: model
  // FLOPs of one iteration on one rank. Resets the accumulated times.
  std::string report(comm::ProcessGroup* world, double flops_per_rank, int64_t iterations);

 private:
  bool enabled_;
  int minmax_count_;
  int world_rank_;
  double delay_ms_ = 0.0;  // the test hook's
  std::chrono::steady_clock::time_point started_;
  double compute_s_ = 0.0, batch_s_ = 0.0;
};

}  // namespace mg::training
