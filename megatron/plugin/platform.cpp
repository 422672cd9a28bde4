// Platform defaults: the pinned allocator, set_device and sparse memory of host platforms
// (platform.h).
#include "megatron/plugin/platform.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

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

std::size_t release_host_pages(void* ptr, std::size_t bytes) {
  if (bytes == 0) return 0;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  auto* base = static_cast<char*>(ptr);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(base);
  const uintptr_t hi = lo + bytes;
  const uintptr_t plo = (lo + page - 1) / page * page, phi = hi / page * page;
  if (phi <= plo) {  // no whole page inside: just zero it
    std::memset(base, 0, bytes);
    return 0;
  }
  std::memset(base, 0, plo - lo);
  std::memset(reinterpret_cast<void*>(phi), 0, hi - phi);
  // Private anonymous memory (the host allocator's): the pages are freed and read as zeros.
  MG_CHECK(madvise(reinterpret_cast<void*>(plo), phi - plo, MADV_DONTNEED) == 0,
           "release_host_pages: madvise(MADV_DONTNEED) of " << (phi - plo) << " bytes failed");
  return phi - plo;
}

Platform::SparseMemoryInfo Platform::sparse_memory_info(int /*device*/) {
  if (device_type() == DeviceType::cpu)
    return {true, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)),
            "host pages (madvise MADV_DONTNEED)"};
  return {false, 0,
          "platform '" + std::string(name()) +
              "' has no sparse memory: discarded ranges are zeroed, their memory stays allocated"};
}

std::size_t Platform::decommit(void* ptr, std::size_t bytes, int device) {
  if (bytes == 0) return 0;
  if (device_type() == DeviceType::cpu) return release_host_pages(ptr, bytes);
  memset_zero(ptr, device, bytes);
  return 0;
}

}  // namespace mg::plugin
