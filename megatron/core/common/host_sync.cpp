// Host round-trip counters (host_sync.h).
#include "megatron/core/common/host_sync.h"

#include <atomic>
#include <sstream>

namespace mg {
namespace {

std::array<std::atomic<int64_t>, kNumHostSyncSites>& counters() {
  static std::array<std::atomic<int64_t>, kNumHostSyncSites> c{};
  return c;
}

}  // namespace

const char* host_sync_name(HostSync site) {
  switch (site) {
    case HostSync::loss:
      return "loss";
    case HostSync::found_inf:
      return "found_inf";
    case HostSync::grad_norm:
      return "grad_norm";
    case HostSync::num_zeros:
      return "num_zeros";
    case HostSync::nan_check:
      return "nan_check";
    case HostSync::log_interval:
      return "log_interval";
    case HostSync::vocab_targets:
      return "vocab_targets";
    case HostSync::moe:
      return "moe";
    case HostSync::upload:
      return "upload";
    case HostSync::device_copy:
      return "device_copy";
    case HostSync::kernel:
      return "kernel";
    case HostSync::memory:
      return "memory";
    case HostSync::other:
      return "other";
  }
  return "unknown";
}

void count_host_sync(HostSync site) {
  counters()[static_cast<std::size_t>(site)].fetch_add(1, std::memory_order_relaxed);
}

int64_t HostSyncCounts::total() const {
  int64_t t = 0;
  for (int64_t v : n) t += v;
  return t;
}

HostSyncCounts HostSyncCounts::operator-(const HostSyncCounts& earlier) const {
  HostSyncCounts d;
  for (std::size_t i = 0; i < n.size(); ++i) d.n[i] = n[i] - earlier.n[i];
  return d;
}

HostSyncCounts HostSyncCounts::operator+(const HostSyncCounts& more) const {
  HostSyncCounts d;
  for (std::size_t i = 0; i < n.size(); ++i) d.n[i] = n[i] + more.n[i];
  return d;
}

std::string HostSyncCounts::str(double per) const {
  std::ostringstream os;
  bool any = false;
  for (int i = 0; i < kNumHostSyncSites; ++i) {
    if (n[static_cast<std::size_t>(i)] == 0) continue;
    os << (any ? ", " : "") << host_sync_name(static_cast<HostSync>(i)) << " "
       << static_cast<double>(n[static_cast<std::size_t>(i)]) / per;
    any = true;
  }
  return any ? os.str() : std::string("none");
}

HostSyncCounts host_sync_counts() {
  HostSyncCounts c;
  for (std::size_t i = 0; i < c.n.size(); ++i)
    c.n[i] = counters()[i].load(std::memory_order_relaxed);
  return c;
}

namespace detail {
bool& in_counted_host_read() {
  thread_local bool flag = false;
  return flag;
}
}  // namespace detail

}  // namespace mg
