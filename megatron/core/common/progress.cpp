// Progress lines for long start-up work (progress.h).
#include "megatron/core/common/progress.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace mg {
namespace {

std::mutex g_mu;
std::ostream* g_sink = nullptr;

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::ostream* set_progress_sink(std::ostream* sink) {
  std::lock_guard<std::mutex> lk(g_mu);
  std::ostream* old = g_sink;
  g_sink = sink;
  return old;
}

std::ostream* progress_sink() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_sink;
}

Progress::Progress(std::string what, int64_t total, double quiet_seconds, double interval_seconds,
                   Clock clock)
    : what_(std::move(what)),
      total_(std::max<int64_t>(0, total)),
      quiet_(quiet_seconds),
      interval_(interval_seconds),
      clock_(clock ? std::move(clock) : Clock(steady_seconds)) {
  // MG_PROGRESS_QUIET_SECONDS / MG_PROGRESS_INTERVAL_SECONDS override both (0: every update).
  if (const char* q = std::getenv("MG_PROGRESS_QUIET_SECONDS")) quiet_ = std::atof(q);
  if (const char* i = std::getenv("MG_PROGRESS_INTERVAL_SECONDS")) interval_ = std::atof(i);
  start_ = clock_();
}

Progress::~Progress() {
  finish();
}

void Progress::update(int64_t done) {
  done_ = std::min(done, total_);
  if (finished_) return;
  const double now = clock_();
  const double since = now - start_;
  if (since < quiet_) return;
  if (printed_ && now - last_print_ < interval_) return;
  last_print_ = now;
  print(false);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (printed_) {
    done_ = total_;
    print(true);
  }
}

void Progress::print(bool final_line) {
  const double elapsed = clock_() - start_;
  const double pct =
      total_ > 0 ? 100.0 * static_cast<double>(done_) / static_cast<double>(total_) : 100.0;
  char buf[256];
  if (final_line) {
    std::snprintf(buf, sizeof(buf), " > %s: %lld/%lld (100.0%%) in %.1f s", what_.c_str(),
                  static_cast<long long>(total_), static_cast<long long>(total_), elapsed);
  } else {
    const double eta =
        done_ > 0 ? elapsed * static_cast<double>(total_ - done_) / static_cast<double>(done_)
                  : 0.0;
    if (done_ > 0)
      std::snprintf(buf, sizeof(buf), " > %s: %lld/%lld (%.1f%%), %.1f s, ETA %.1f s",
                    what_.c_str(), static_cast<long long>(done_), static_cast<long long>(total_),
                    pct, elapsed, eta);
    else
      std::snprintf(buf, sizeof(buf), " > %s: 0/%lld (0.0%%), %.1f s, ETA unknown", what_.c_str(),
                    static_cast<long long>(total_), elapsed);
  }
  std::lock_guard<std::mutex> lk(g_mu);
  printed_ = true;
  if (g_sink) *g_sink << buf << std::endl;
}

}  // namespace mg
