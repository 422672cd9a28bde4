// Platform defaults: the pinned allocator and set_device of host platforms (platform.h).
#include "megatron/plugin/platform.h"

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

}  // namespace mg::plugin
