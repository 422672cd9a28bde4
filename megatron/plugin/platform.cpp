// Platform defaults (the pinned allocator and set_device of host platforms) and the process-wide
// deterministic-mode flag (platform.h).
#include "megatron/plugin/platform.h"

#include <atomic>

#include "megatron/core/common/error.h"
#include "megatron/plugin/registry.h"

namespace mg::plugin {

Allocator& Platform::pinned_host_allocator() {
  return host_allocator();
}

void Platform::set_device(int device) {
  MG_CHECK(device >= 0 && device < device_count(), "platform " << name() << ": device " << device
                                                               << " does not exist ("
                                                               << device_count() << " device(s))");
}

namespace {
std::atomic<bool> g_deterministic{false};
}  // namespace

void set_deterministic_mode(bool on) {
  g_deterministic.store(on);
}

bool deterministic_mode() {
  return g_deterministic.load();
}

}  // namespace mg::plugin
