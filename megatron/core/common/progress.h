// A progress line for long start-up work (the dataset indices, a checkpoint load of many tensors,
// a HuggingFace import): silent for work that ends within `quiet_seconds` (2 s), then one line
// every `interval_seconds` (10 s) and one at the end:
//   > building the sample index: 1234567/5000000 (24.7%), 3.2 s, ETA 9.8 s
//   > building the sample index: 5000000/5000000 (100.0%) in 13.1 s
// The ETA assumes the rest goes at the average rate so far. Lines go to the process's progress
// sink (set_progress_sink; none by default, so library code stays silent): pretrain_gpt sets it to
// rank 0's log, the tools to std::cerr. update() is cheap (a clock read); call it every item or
// every few thousand. MG_PROGRESS_QUIET_SECONDS and MG_PROGRESS_INTERVAL_SECONDS override the two
// thresholds for every progress line of the process (0 and 0: a line at every update).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

namespace mg {

// Where progress lines go (null: nowhere); returns the previous sink. Process-wide; lines are
// written whole under a lock.
std::ostream* set_progress_sink(std::ostream* sink);
std::ostream* progress_sink();

class Progress {
 public:
  using Clock = std::function<double()>;  // seconds, monotonic (tests pass their own)
  Progress(std::string what, int64_t total, double quiet_seconds = 2.0,
           double interval_seconds = 10.0, Clock clock = {});
  ~Progress();  // finish() if not done
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void update(int64_t done);
  // The final line, when a progress line was printed.
  void finish();

 private:
  void print(bool final_line);
  std::string what_;
  int64_t total_, done_ = 0;
  double quiet_, interval_;
  Clock clock_;
  double start_ = 0.0, last_print_ = -1.0;
  bool printed_ = false, finished_ = false;
};

}  // namespace mg
