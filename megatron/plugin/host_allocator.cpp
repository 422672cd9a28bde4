// The host allocator: 256-byte aligned memory with live/peak byte counts, and a small cache of
// freed large blocks.
//
// Why the cache: glibc serves blocks above its mmap threshold (at most 32 MiB) with a fresh mmap
// and unmaps them on free, so a training loop that frees and re-allocates, e.g., its [S*B, V]
// logits every step page-faults and zeroes every page of them again (measured: ~9% of a cpu-tiny
// step, whose logits are 200 MiB). Freed blocks of at least kCacheMinBytes are kept (at most
// kCacheMaxBytes in all, the oldest given back first) and reused for a request of the same rounded
// size. Stats: allocated/peak count live bytes as before; reserved = live + cached.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "megatron/core/common/error.h"
#include "megatron/plugin/registry.h"

namespace mg::plugin {

namespace {

class HostAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes) override {
    if (bytes == 0) bytes = 1;
    const std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = rounded >= kCacheMinBytes ? take_cached(rounded) : nullptr;
    if (!p) p = std::aligned_alloc(kAlign, rounded);
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
    const std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (rounded >= kCacheMinBytes)
      keep_cached(ptr, rounded);
    else
      std::free(ptr);
    allocated_.fetch_sub(bytes);
    num_frees_.fetch_add(1);
  }
  MemoryStats stats() const override {
    MemoryStats s;
    s.allocated_bytes = allocated_.load();
    s.peak_allocated_bytes = peak_.load();
    {
      std::lock_guard<std::mutex> lock(mu_);
      s.reserved_bytes = s.allocated_bytes + cached_bytes_;
    }
    s.num_allocs = num_allocs_.load();
    s.num_frees = num_frees_.load();
    return s;
  }
  void reset_peak() override { peak_.store(allocated_.load()); }

 private:
  static constexpr std::size_t kAlign = 256;
  static constexpr std::size_t kCacheMinBytes = std::size_t{32} << 20;
  static constexpr std::size_t kCacheMaxBytes = std::size_t{1} << 30;

  // A cached block of exactly `rounded` bytes (the most recently freed), or nullptr.
  void* take_cached(std::size_t rounded) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = cache_.rbegin(); it != cache_.rend(); ++it) {
      if (it->first != rounded) continue;
      void* p = it->second;
      cache_.erase(std::next(it).base());
      cached_bytes_ -= rounded;
      return p;
    }
    return nullptr;
  }
  void keep_cached(void* p, std::size_t rounded) {
    std::vector<void*> evicted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cache_.emplace_back(rounded, p);
      cached_bytes_ += rounded;
      while (cached_bytes_ > kCacheMaxBytes) {  // oldest first; p itself if it alone is too big
        cached_bytes_ -= cache_.front().first;
        evicted.push_back(cache_.front().second);
        cache_.erase(cache_.begin());
      }
    }
    for (void* e : evicted) std::free(e);
  }

  mutable std::mutex mu_;
  std::vector<std::pair<std::size_t, void*>> cache_;  // (rounded bytes, block), oldest first
  std::size_t cached_bytes_ = 0;
  std::atomic<std::size_t> allocated_{0}, peak_{0}, num_allocs_{0}, num_frees_{0};
};

}  // namespace

Allocator& host_allocator() {
  static HostAllocator* a = new HostAllocator();  // never destroyed (see global_registry)
  return *a;
}

}  // namespace mg::plugin
