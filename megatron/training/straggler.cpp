// --log-straggler: per-rank compute time and throughput, the slowest ranks named (straggler.h).
#include "megatron/training/straggler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <thread>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/training/training_log.h"

namespace mg::training {
namespace {

std::string fmt(const char* f, double v, int rank) {
  char b[96];
  std::snprintf(b, sizeof(b), f, v, rank);
  return b;
}

}  // namespace

StragglerDetector::StragglerDetector(bool enabled, int minmax_count, int world_rank)
    : enabled_(enabled), minmax_count_(minmax_count), world_rank_(world_rank) {
  const char* r = std::getenv("MG_TEST_STRAGGLER_RANK");
  const char* d = std::getenv("MG_TEST_STRAGGLER_DELAY_MS");
  if (enabled_ && r && d && std::atoi(r) == world_rank_) delay_ms_ = std::atof(d);
}

void StragglerDetector::start_compute() {
  if (enabled_) started_ = std::chrono::steady_clock::now();
}

void StragglerDetector::stop_compute() {
  if (!enabled_) return;
  if (delay_ms_ > 0.0)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms_));
  compute_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

std::string StragglerDetector::report(comm::ProcessGroup* world, double flops_per_rank,
                                      int64_t iterations) {
  if (!enabled_) return "";
  const int n = world ? world->size() : 1;
  const double it = static_cast<double>(std::max<int64_t>(1, iterations));
  std::vector<double> mine = {compute_s_ / it, batch_s_ / it};
  compute_s_ = batch_s_ = 0.0;
  std::vector<double> all = mine;
  if (n > 1) {
    Tensor in = Tensor::from_vector(mine, {2}, DType::f64);
    Tensor out = Tensor::zeros({2 * static_cast<int64_t>(n)}, DType::f64);
    world->all_gather(out, in)->wait();
    all = out.to_vector<double>();
  }
  if (world_rank_ != 0) return "";
  std::vector<double> step(n), batch(n), tflops(n);
  for (int r = 0; r < n; ++r) {
    step[r] = all[2 * r];
    batch[r] = all[2 * r + 1];
    tflops[r] = step[r] > 0.0 ? flops_per_rank / step[r] / 1e12 : 0.0;
  }
  auto argmin = [](const std::vector<double>& v) {
    return static_cast<int>(std::min_element(v.begin(), v.end()) - v.begin());
  };
  auto argmax = [](const std::vector<double>& v) {
    return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
  };
  const int s_lo = argmin(step), s_hi = argmax(step), b_lo = argmin(batch), b_hi = argmax(batch);
  const int f_lo = argmin(tflops), f_hi = argmax(tflops);
  std::string l = " [" + log_timestamp() + "]";
  l += fmt(" | MnRtt/Rnk: %.2fms/%d", step[s_lo] * 1e3, s_lo);
  l += fmt(" | MxRtt/Rnk: %.2fms/%d", step[s_hi] * 1e3, s_hi);
  l += fmt(" | MnDRtt/Rnk: %.2fms/%d", batch[b_lo] * 1e3, b_lo);
  l += fmt(" | MxDRtt/Rnk: %.2fms/%d", batch[b_hi] * 1e3, b_hi);
  l += fmt(" | MnEtpt/Rnk: %.2fTF/%d", tflops[f_lo], f_lo);
  l += fmt(" | MxEtpt/Rnk: %.2fTF/%d", tflops[f_hi], f_hi);
  l += "\n";
  // Ranks by throughput, slowest first (ties: lower rank first).
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return step[a] > step[b]; });
  const int k = std::min(minmax_count_, n);
  if (k > 1 && k < n) {
    l += "^^^^ Bottom " + std::to_string(k) + " Ranks with lowest  Etpt(TF):";
    for (int i = 0; i < k; ++i) l += fmt(" %.2f/%d,", tflops[order[i]], order[i]);
    l += "\n^^^^ Top    " + std::to_string(k) + " Ranks with highest Etpt(TF):";
    for (int i = n - k; i < n; ++i) l += fmt(" %.2f/%d,", tflops[order[i]], order[i]);
    l += "\n";
  }
  std::vector<double> sorted = step;
  std::sort(sorted.begin(), sorted.end());
  const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  if (n > 1 && median > 0.0)
    for (int i = 0; i < k; ++i) {
      const int r = order[i];
      char b[256];
      std::snprintf(b, sizeof(b),
                    "straggler: slowest rank %d: %.3gx the median rank's throughput (%.2f ms vs "
                    "%.2f ms per iteration)\n",
                    r, step[r] > 0.0 ? median / step[r] : 0.0, step[r] * 1e3, median * 1e3);
      l += b;
    }
  return l;
}

}  // namespace mg::training
