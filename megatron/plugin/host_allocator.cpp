// The host allocator: 256-byte aligned memory with live/peak byte counts. Large blocks are not
// cached (the OS does that well for big mmaps); the caching allocator belongs to the CUDA platform.
#include <atomic>
#include <cstdlib>
#include <new>

#include "megatron/core/common/error.h"
#include "megatron/plugin/registry.h"

namespace mg::plugin {

namespace {

class HostAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes) override {
    if (bytes == 0) bytes = 1;
    const std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    MG_CHECK(p != nullptr, "host allocation of " << bytes << " bytes failed (live "
                                                 << allocated_.load() << " bytes)");
    const std::size_t now = allocated_.fetch_add(bytes) + bytes;
    std::size_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    num_allocs_.fetch_add(1);
    return p;
  }
  void deallocate(void* ptr, std::size_t bytes) override {
    if (!ptr) return;
    if (bytes == 0) bytes = 1;
    std::free(ptr);
    allocated_.fetch_sub(bytes);
    num_frees_.fetch_add(1);
  }
  MemoryStats stats() const override {
    MemoryStats s;
    s.allocated_bytes = allocated_.load();
    s.peak_allocated_bytes = peak_.load();
    s.reserved_bytes = s.allocated_bytes;
    s.num_allocs = num_allocs_.load();
    s.num_frees = num_frees_.load();
    return s;
  }
  void reset_peak() override { peak_.store(allocated_.load()); }

 private:
  static constexpr std::size_t kAlign = 256;
  std::atomic<std::size_t> allocated_{0}, peak_{0}, num_allocs_{0}, num_frees_{0};
};

}  // namespace

Allocator& host_allocator() {
  static HostAllocator* a = new HostAllocator();  // never destroyed (see global_registry)
  return *a;
}

}  // namespace mg::plugin
