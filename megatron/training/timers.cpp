// Megatron's named timers and their report across ranks (timers.h).
#include "megatron/training/timers.h"

#include <algorithm>
#include <cstdio>

#include "megatron/core/common/error.h"

namespace mg::training {
namespace {

// "<name> " padded with dots to 48 columns (Python's (name + ' ').ljust(48, '.')).
std::string dotted(const std::string& name) {
  std::string s = name + " ";
  if (s.size() < 48) s.append(48 - s.size(), '.');
  return s;
}

std::string fmt2(double v) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.2f", v);
  return b;
}

}  // namespace

const std::vector<std::string>& megatron_timers_to_log() {
  static const std::vector<std::string> names = {"forward-backward",
                                                 "forward-compute",
                                                 "backward-compute",
                                                 "batch-generator",
                                                 "forward-recv",
                                                 "forward-send",
                                                 "backward-recv",
                                                 "backward-send",
                                                 "forward-send-forward-recv",
                                                 "forward-send-backward-recv",
                                                 "backward-send-forward-recv",
                                                 "backward-send-backward-recv",
                                                 "forward-backward-send-forward-backward-recv",
                                                 "layernorm-grads-all-reduce",
                                                 "embedding-grads-all-reduce",
                                                 "all-grads-sync",
                                                 "params-all-gather",
                                                 "optimizer-copy-to-main-grad",
                                                 "optimizer-unscale-and-check-inf",
                                                 "optimizer-clip-main-grad",
                                                 "optimizer-count-zeros",
                                                 "optimizer-inner-step",
                                                 "optimizer-copy-main-to-model-params",
                                                 "optimizer"};
  return names;
}

MegatronTimers::MegatronTimers(int log_level, std::string log_option,
                               std::function<void()> synchronize)
    : log_level_(log_level),
      log_option_(std::move(log_option)),
      synchronize_(std::move(synchronize)) {
  MG_CHECK(log_level_ >= 0 && log_level_ <= 2,
           "--timing-log-level must be 0, 1 or 2, got " << log_level_);
  MG_CHECK(log_option_ == "max" || log_option_ == "minmax" || log_option_ == "all",
           "--timing-log-option must be max, minmax or all, got '" << log_option_ << "'");
}

void MegatronTimers::start(std::string_view name, int level) {
  if (!active(level)) return;
  auto it = timers_.find(name);
  if (it == timers_.end()) it = timers_.emplace(std::string(name), Timer{}).first;
  Timer& t = it->second;
  MG_CHECK(!t.running, "timer '" << name << "' has already been started");
  t.level = level;
  if (synchronize_) synchronize_();
  t.running = true;
  t.started = std::chrono::steady_clock::now();
}

void MegatronTimers::stop(std::string_view name) {
  auto it = timers_.find(name);
  if (it == timers_.end()) return;  // a timer above the log level was never started
  Timer& t = it->second;
  if (!t.running) return;
  if (synchronize_) synchronize_();
  t.accumulated +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t.started).count();
  t.running = false;
}

std::vector<std::vector<double>> MegatronTimers::gather(const std::vector<std::string>& names,
                                                        comm::ProcessGroup* world, bool reset) {
  std::vector<double> mine(names.size(), 0.0);
  for (std::size_t i = 0; i < names.size(); ++i) {
    auto it = timers_.find(names[i]);
    if (it == timers_.end()) continue;
    Timer& t = it->second;
    double s = t.accumulated;
    const auto now = std::chrono::steady_clock::now();
    if (t.running) s += std::chrono::duration<double>(now - t.started).count();
    mine[i] = s;
    if (reset) {
      t.accumulated = 0.0;
      if (t.running) t.started = now;
    }
  }
  const int n = world ? world->size() : 1;
  std::vector<std::vector<double>> out;
  if (n == 1 || names.empty()) {
    out.push_back(mine);
    return out;
  }
  Tensor in = Tensor::from_vector(mine, {static_cast<int64_t>(names.size())}, DType::f64);
  Tensor all =
      Tensor::zeros({static_cast<int64_t>(n) * static_cast<int64_t>(names.size())}, DType::f64);
  world->all_gather(all, in)->wait();
  const std::vector<double> flat = all.to_vector<double>();
  for (int r = 0; r < n; ++r)
    out.emplace_back(flat.begin() + static_cast<std::ptrdiff_t>(r * names.size()),
                     flat.begin() + static_cast<std::ptrdiff_t>((r + 1) * names.size()));
  return out;
}

std::optional<std::string> MegatronTimers::log(const std::vector<std::string>& names,
                                               double normalizer, comm::ProcessGroup* world,
                                               bool reset) {
  MG_CHECK(normalizer > 0.0, "timers: normalizer must be > 0, got " << normalizer);
  const auto t = gather(names, world, reset);
  const double scale = 1000.0 / normalizer;  // seconds -> ms per iteration
  std::string out;
  bool any = false;
  if (log_option_ == "all") {
    out = "times across ranks (ms):";
    for (std::size_t i = 0; i < names.size(); ++i) {
      bool first = true;
      for (std::size_t r = 0; r < t.size(); ++r) {
        if (t[r][i] <= 0.0) continue;
        any = true;
        if (first) out += "\n  " + names[i] + ":";
        first = false;
        char b[96];
        std::snprintf(b, sizeof(b), "\n     rank %2d: %.2f", static_cast<int>(r), t[r][i] * scale);
        out += b;
      }
    }
  } else {
    const bool max_only = log_option_ == "max";
    out = max_only ? "max time across ranks (ms):" : "(min, max) time across ranks (ms):";
    for (std::size_t i = 0; i < names.size(); ++i) {
      double lo = 0.0, hi = 0.0;
      bool found = false;
      for (const auto& row : t) {
        if (row[i] <= 0.0) continue;
        lo = found ? std::min(lo, row[i]) : row[i];
        hi = found ? std::max(hi, row[i]) : row[i];
        found = true;
      }
      if (!found) continue;
      any = true;
      // Appended piecewise: GCC 12's bogus -Wrestrict on "(" + std::string.
      out += "\n    ";
      out += dotted(names[i]);
      out += ": ";
      if (max_only) {
        out += fmt2(hi * scale);
      } else {
        out += '(';
        out += fmt2(lo * scale);
        out += ", ";
        out += fmt2(hi * scale);
        out += ')';
      }
    }
  }
  if (!any) return std::nullopt;
  return out;
}

std::vector<std::pair<std::string, double>> MegatronTimers::max_times(
    const std::vector<std::string>& names, double normalizer, comm::ProcessGroup* world,
    bool reset) {
  MG_CHECK(normalizer > 0.0, "timers: normalizer must be > 0, got " << normalizer);
  const auto t = gather(names, world, reset);
  std::vector<std::pair<std::string, double>> out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    double hi = 0.0;
    for (const auto& row : t) hi = std::max(hi, row[i]);
    if (hi > 0.0) out.emplace_back(names[i], hi / normalizer);
  }
  return out;
}

}  // namespace mg::training
