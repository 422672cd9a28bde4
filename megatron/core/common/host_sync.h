// Host round-trips: every read of device values by the host and every blocking wait for a device
// in the training step goes through here, so that they can be counted per step (--profile-op-table
// prints the counts; host_sync_test asserts them).
//
// Sites are counted on every platform, the host one included: on the CPU a "read" is free, but the
// count is of the call sites that would wait for a device, so a CPU test fixes the number a GPU
// run pays. A device-to-host Tensor copy that does not come through host_read (a checkpoint save,
// a tool) is counted as `other` on a device platform only (Tensor::copy_).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/tensor/tensor.h"

namespace mg {

enum class HostSync : int {
  loss,           // the micro-batches' token losses, once per step (models::resolve_loss_sums)
  found_inf,      // the optimizer's inf/nan flag of the unscaled gradients
  grad_norm,      // the local sum of squares of the gradients (grad_norm slot, generic)
  num_zeros,      // --log-num-zeros-in-grad
  nan_check,      // DDP's per-bucket NaN check (--check-for-nan-in-loss-and-grad with DDP's flag)
  log_interval,   // the platform synchronisation before the interval's timers are read
  vocab_targets,  // the vocab-parallel cross entropy's range check of the targets
  moe,            // MoE routing on the host (per MoE layer and micro-batch)
  // Device platforms only (the CPU has no such wait):
  upload,       // a host-to-device copy that waits (CUDA: from inside a pinned block)
  device_copy,  // a copy between two devices, which Platform::copy waits for on CUDA (a copy
                // within one device returns queued on the current stream)
  kernel,       // a kernel's own round trip (CUDA: attention's cu_seqlens)
  memory,       // a release of device memory that waits for the device (CUDA VMM's decommit)
  other,        // any other device-to-host copy (Tensor::copy_ on a device platform)
};
inline constexpr int kNumHostSyncSites = static_cast<int>(HostSync::other) + 1;
const char* host_sync_name(HostSync site);

// Counts one round trip at `site` (thread-safe).
void count_host_sync(HostSync site);

// Counts since the process started, per site.
struct HostSyncCounts {
  std::array<int64_t, kNumHostSyncSites> n{};
  int64_t total() const;
  HostSyncCounts operator-(const HostSyncCounts& earlier) const;
  HostSyncCounts operator+(const HostSyncCounts& more) const;
  int64_t operator[](HostSync site) const { return n[static_cast<std::size_t>(site)]; }
  // "loss 1, found_inf 1, grad_norm 1" (sites with a count only; "none" when all are 0).
  std::string str(double per = 1.0) const;
};
HostSyncCounts host_sync_counts();

namespace detail {
// Set while host_read copies, so that Tensor::copy_ does not count the same read as `other`.
bool& in_counted_host_read();
}  // namespace detail

// t's values on the host, counted as one round trip at `site`.
template <typename T>
std::vector<T> host_read(const Tensor& t, HostSync site) {
  count_host_sync(site);
  bool& flag = detail::in_counted_host_read();
  const bool was = flag;
  flag = true;
  struct Restore {
    bool& f;
    bool v;
    ~Restore() { f = v; }
  } restore{flag, was};
  return t.to_vector<T>();
}

}  // namespace mg
