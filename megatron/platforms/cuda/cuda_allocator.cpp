// CudaAllocator and CudaPinnedAllocator (see cuda_allocator.h for the policies and invariants).
#include "megatron/platforms/cuda/cuda_allocator.h"

#include <unistd.h>

#include <algorithm>

#include "megatron/core/common/error.h"
#include "megatron/platforms/cuda/cuda_check.h"
#include "megatron/platforms/cuda/cuda_common.h"

namespace mg::platforms::cuda {

namespace {
constexpr std::size_t kSmallStep = 512;
constexpr std::size_t kLargeStep = std::size_t{1} << 20;
// A cached block serves a request of up to this much smaller size class (bounded waste).
constexpr std::size_t kMaxSlackNum = 5, kMaxSlackDen = 4;
}  // namespace

std::size_t CudaAllocator::block_size(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  const std::size_t step = bytes <= kLargeStep ? kSmallStep : kLargeStep;
  return (bytes + step - 1) / step * step;
}

cudaEvent_t CudaAllocator::take_event_locked() {
  if (!event_pool_.empty()) {
    cudaEvent_t e = event_pool_.back();
    event_pool_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  if (!detail::cuda_ok_or_ignore(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)))
    return nullptr;
  return e;
}

void* CudaAllocator::allocate(std::size_t bytes) {
  const std::size_t size = block_size(bytes);
  std::lock_guard lock(mu_);
  DeviceGuard guard(device_);
  void* ptr = nullptr;
  auto it = cache_.lower_bound(size);
  if (it != cache_.end() && it->first * kMaxSlackDen <= size * kMaxSlackNum) {
    const std::size_t block = it->first;
    Cached c = it->second;
    cache_.erase(it);
    if (c.freed) {
      // Work queued before the free (on any stream) must finish before the new owner's work.
      MG_CUDA_CHECK(cudaStreamWaitEvent(current_stream(device_), c.freed, 0));
      event_pool_.push_back(c.freed);
    }
    ptr = c.ptr;
    live_.emplace(ptr, Live{block, bytes});
  } else {
    cudaError_t err = cudaMalloc(&ptr, size);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached_locked();
      err = cudaMalloc(&ptr, size);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      MG_THROW("CUDA out of memory on cuda:"
               << device_ << ": cudaMalloc of " << size << " bytes (requested " << bytes
               << ") failed with " << cudaGetErrorString(err) << "; allocated "
               << stats_.allocated_bytes << " bytes, reserved " << stats_.reserved_bytes
               << " bytes, peak " << stats_.peak_allocated_bytes << " bytes");
    }
    stats_.reserved_bytes += size;
    live_.emplace(ptr, Live{size, bytes});
  }
  stats_.allocated_bytes += bytes;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  ++stats_.num_allocs;
  return ptr;
}

void CudaAllocator::deallocate(void* ptr, std::size_t) {
  if (!ptr) return;
  std::lock_guard lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours; never throw from a destructor path
  const Live l = it->second;
  live_.erase(it);
  stats_.allocated_bytes -= l.requested;
  ++stats_.num_frees;
  cudaEvent_t ev = nullptr;
  try {
    DeviceGuard guard(device_);  // the event must belong to the block's device
    ev = take_event_locked();
    if (ev && !detail::cuda_ok_or_ignore(cudaEventRecord(ev, current_stream(device_)))) {
      event_pool_.push_back(ev);
      ev = nullptr;
      // The runtime is shutting down (or broken): drop the block rather than risk reuse.
      stats_.reserved_bytes -= l.block;
      return;
    }
  } catch (...) {
    stats_.reserved_bytes -= l.block;
    return;
  }
  cache_.emplace(l.block, Cached{ptr, ev});
}

void CudaAllocator::release_cached_locked() {
  for (auto& [size, c] : cache_) {
    if (c.freed) {
      detail::cuda_ok_or_ignore(cudaEventSynchronize(c.freed));
      event_pool_.push_back(c.freed);
    }
    detail::cuda_ok_or_ignore(cudaFree(c.ptr));
    stats_.reserved_bytes -= size;
  }
  cache_.clear();
}

void CudaAllocator::release_cached() {
  std::lock_guard lock(mu_);
  DeviceGuard guard(device_);
  release_cached_locked();
}

plugin::MemoryStats CudaAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void CudaAllocator::reset_peak() {
  std::lock_guard lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

// ---- CudaPinnedAllocator ----------------------------------------------------------------------

void* CudaPinnedAllocator::allocate(std::size_t bytes) {
  const std::size_t size = CudaAllocator::block_size(bytes);
  std::lock_guard lock(mu_);
  void* ptr = nullptr;
  auto it = cache_.lower_bound(size);
  if (it != cache_.end() && it->first * kMaxSlackDen <= size * kMaxSlackNum) {
    const std::size_t block = it->first;
    ptr = it->second;
    cache_.erase(it);
    cached_bytes_ -= block;
    live_.emplace(ptr, Live{block, bytes});
  } else {
    if (stats_.reserved_bytes + size > max_reserved_bytes()) release_cached_locked();
    MG_CHECK(stats_.reserved_bytes + size <= max_reserved_bytes(),
             "pinned host memory: " << size << " more bytes would exceed the cap of "
                                    << max_reserved_bytes() << " bytes (a quarter of RAM; "
                                    << stats_.allocated_bytes << " bytes live)");
    cudaError_t err = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached_locked();
      err = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      MG_THROW("pinned host allocation failed: cudaHostAlloc of "
               << size << " bytes (requested " << bytes << ") failed with "
               << cudaGetErrorString(err) << "; pinned allocated " << stats_.allocated_bytes
               << " bytes, reserved " << stats_.reserved_bytes << " bytes");
    }
    stats_.reserved_bytes += size;
    live_.emplace(ptr, Live{size, bytes});
  }
  stats_.allocated_bytes += bytes;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  ++stats_.num_allocs;
  return ptr;
}

std::size_t CudaPinnedAllocator::max_reserved_bytes() {
  static const std::size_t cap = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return std::size_t{8} << 30;
    return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) / 4;
  }();
  return cap;
}

void CudaPinnedAllocator::deallocate(void* ptr, std::size_t) {
  if (!ptr) return;
  std::lock_guard lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours; never throw from a destructor path
  const Live l = it->second;
  live_.erase(it);
  stats_.allocated_bytes -= l.requested;
  ++stats_.num_frees;
  if (cached_bytes_ + l.block > kMaxCachedBytes) {
    detail::cuda_ok_or_ignore(cudaFreeHost(ptr));
    stats_.reserved_bytes -= l.block;
    return;
  }
  cache_.emplace(l.block, ptr);
  cached_bytes_ += l.block;
}

void CudaPinnedAllocator::release_cached_locked() {
  for (auto& [size, p] : cache_) {
    detail::cuda_ok_or_ignore(cudaFreeHost(p));
    stats_.reserved_bytes -= size;
  }
  cache_.clear();
  cached_bytes_ = 0;
}

void CudaPinnedAllocator::release_cached() {
  std::lock_guard lock(mu_);
  release_cached_locked();
}

std::size_t CudaPinnedAllocator::cached_bytes() const {
  std::lock_guard lock(mu_);
  return cached_bytes_;
}

plugin::MemoryStats CudaPinnedAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void CudaPinnedAllocator::reset_peak() {
  std::lock_guard lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

CudaPinnedAllocator& pinned_allocator() {
  static CudaPinnedAllocator* a = new CudaPinnedAllocator();  // never destroyed
  return *a;
}

}  // namespace mg::platforms::cuda
