// Megatron-format training and evaluation log lines, and wall-clock timers (training_log.h).
#include "megatron/training/training_log.h"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>

#include "megatron/core/common/error.h"

namespace mg::training {
namespace {

// printf into a std::string.
template <typename... A>
std::string fmt(const char* f, A... a) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), f, a...);
  return buf;
}

}  // namespace

std::string log_timestamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string format_training_log(const IntervalStats& s) {
  std::string l = " [" + log_timestamp() + "]";
  l += fmt(" iteration %8lld/%8lld |", static_cast<long long>(s.iteration),
           static_cast<long long>(s.train_iters));
  l += fmt(" consumed samples: %12lld |", static_cast<long long>(s.consumed_samples));
  l += fmt(" elapsed time per iteration (ms): %.1f |", s.elapsed_ms_per_iter);
  const double secs = s.elapsed_ms_per_iter / 1000.0;
  const double tflops = secs > 0 ? s.flops_per_iter / secs / 1e12 / s.world_size : 0.0;
  // Megatron prints %.1f; small CPU runs would always read 0.0, so below 1 show 3 decimals.
  l += fmt(tflops >= 1.0 ? " throughput per GPU (TFLOP/s/GPU): %.1f |"
                         : " throughput per GPU (TFLOP/s/GPU): %.3f |",
           tflops);
  const double tps = secs > 0 ? static_cast<double>(s.tokens_per_iter) / secs / s.world_size : 0.0;
  l += fmt(" tokens per second per GPU: %.1f |", tps);
  if (s.peak_tflops)
    l += fmt(" MFU: %.2f%% |", 100.0 * tflops / *s.peak_tflops);
  else
    l += " MFU: n/a |";
  l += fmt(" learning rate: %.6E |", s.learning_rate);
  l += fmt(" global batch size: %5lld |", static_cast<long long>(s.global_batch_size));
  if (s.lm_loss) l += fmt(" lm loss: %.6E |", *s.lm_loss);
  l += fmt(" loss scale: %.1f |", s.loss_scale);
  if (s.grad_norm) l += fmt(" grad norm: %.3f |", *s.grad_norm);
  if (s.num_zeros_in_grad)
    l += fmt(" num zeros: %.1f |", static_cast<double>(*s.num_zeros_in_grad));
  if (s.params_norm) l += fmt(" params norm: %.3f |", *s.params_norm);
  l += fmt(" number of skipped iterations: %3lld |", static_cast<long long>(s.skipped_iters));
  l += fmt(" number of nan iterations: %3lld |", static_cast<long long>(s.nan_iters));
  if (s.mem_allocated_mb) l += fmt(" mem allocated (MB): %.1f |", *s.mem_allocated_mb);
  if (s.mem_max_allocated_mb) l += fmt(" mem max allocated (MB): %.1f |", *s.mem_max_allocated_mb);
  return l;
}

std::string format_evaluation(const std::string& prefix, double lm_loss) {
  // Megatron caps the exponent at 20 before exp() for the PPL.
  const double ppl = std::exp(std::min(20.0, lm_loss));
  std::string body = " " + prefix + " | " + fmt("lm loss value: %.6E | ", lm_loss) +
                     fmt("lm loss PPL: %.6E | ", ppl);
  const std::string dashes(body.size() + 1, '-');
  return dashes + "\n" + body + "\n" + dashes;
}

std::optional<double> default_peak_tflops(const std::string& device_name) {
  if (device_name.find("H100") != std::string::npos ||
      device_name.find("H200") != std::string::npos)
    return 989.0;
  return std::nullopt;
}

void Timers::start(const std::string& name) {
  Timer& t = timers_[name];
  MG_CHECK(!t.running, "timer '" << name << "' is already running");
  t.running = true;
  t.started = std::chrono::steady_clock::now();
}

double Timers::stop(const std::string& name) {
  auto it = timers_.find(name);
  MG_CHECK(it != timers_.end() && it->second.running, "timer '" << name << "' is not running");
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - it->second.started).count();
  it->second.running = false;
  it->second.accumulated += s;
  return s;
}

double Timers::elapsed(const std::string& name, bool reset) {
  Timer& t = timers_[name];
  double s = t.accumulated;
  if (t.running)
    s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t.started).count();
  if (reset) {
    t.accumulated = 0.0;
    if (t.running) t.started = std::chrono::steady_clock::now();
  }
  return s;
}

}  // namespace mg::training
